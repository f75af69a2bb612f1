"""SPEC §3.1: acquiring a lock over HTTP (fail-fast paths; waiting is in test_locks_waiting.py)."""

from __future__ import annotations

import itertools
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from lock_support import acquire
from support import (
    ServerProcess,
    assert_error,
    detail_fields,
    lock_headers,
    new_token,
    parse_at,
    unique_name,
)

GRANT_FIELDS = {
    "key", "fencing_token", "acquired_at", "expires_at", "deadline_at", "operation", "on_expiry",
}
NINETY_DAYS = timedelta(days=90)
ONE_MS = timedelta(milliseconds=1)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- new grant ---------------------------------------------------------------------------------


def test_new_grant_is_201_with_exactly_the_documented_fields(member: httpx.Client) -> None:
    key = unique_name()
    before = datetime.now(UTC)
    resp = acquire(member, key, new_token(), ttl=30, operation="deploy")
    after = datetime.now(UTC)

    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert set(body) == GRANT_FIELDS, body
    assert body["key"] == key
    assert is_int(body["fencing_token"]) and 0 < body["fencing_token"] < 2**63
    assert body["operation"] == "deploy"
    assert body["on_expiry"] == "release"

    acquired = parse_at(body["acquired_at"])
    expires = parse_at(body["expires_at"])
    deadline = parse_at(body["deadline_at"])
    # Same machine: the server clock and ours agree to well within a few seconds.
    assert before - timedelta(seconds=2) <= acquired <= after + timedelta(seconds=2)
    assert abs(expires - (acquired + timedelta(seconds=30))) <= ONE_MS
    assert abs(deadline - (acquired + NINETY_DAYS)) <= ONE_MS


def test_grant_echoes_keep_and_defaults_operation_to_null(member: httpx.Client) -> None:
    resp = acquire(member, unique_name(), new_token(), ttl=5, on_expiry="keep")
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["on_expiry"] == "keep"
    assert body["operation"] is None
    expected = parse_at(body["acquired_at"]) + timedelta(seconds=5)
    assert abs(parse_at(body["expires_at"]) - expected) <= ONE_MS


def test_grant_with_all_optional_fields_is_visible_on_inspect(member: httpx.Client) -> None:
    key = unique_name()
    metadata = {"host": "web-1", "pid": 4242, "job": {"url": "https://ci.example/j/1"}}
    resp = acquire(member, key, new_token(), ttl=60, wait_seconds=0, operation="migrate",
                   metadata=metadata, on_expiry="release")
    assert resp.status_code == 201, resp.text
    got = member.get(f"/v1/locks/{key}")
    assert got.status_code == 200, got.text
    state = got.json()
    assert state["held"] is True
    assert state["metadata"] == metadata
    assert state["operation"] == "migrate"
    assert state["fencing_token"] == resp.json()["fencing_token"]


def test_max_ttl_lease_expires_exactly_at_its_deadline(member: httpx.Client) -> None:
    resp = acquire(member, unique_name(), new_token(), ttl=7776000)
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert abs(parse_at(body["expires_at"]) - parse_at(body["deadline_at"])) <= ONE_MS


def test_min_ttl_and_longest_name_are_accepted(member: httpx.Client) -> None:
    base = unique_name("long")
    key = base + "A._:-" * 30
    key = key[:128]
    assert len(key) == 128
    resp = acquire(member, key, new_token(), ttl=5)
    assert resp.status_code == 201, resp.text
    assert resp.json()["key"] == key


# --- retried acquire ---------------------------------------------------------------------------


def test_retried_acquire_with_same_token_is_200_with_the_same_body(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    first = acquire(member, key, token, ttl=30, operation="deploy")
    assert first.status_code == 201, first.text
    time.sleep(0.05)

    # A retry with a fresh request id and even different parameters leaves the lease unchanged.
    again = acquire(member, key, token, ttl=300, operation="other", on_expiry="keep")
    assert again.status_code == 200, again.text
    assert again.json() == first.json()

    # And a retry that reuses the request id, as a network-level retry would.
    rid = new_token()
    third = member.put(f"/v1/locks/{key}/lease", headers=lock_headers(token, rid),
                       json={"ttl_seconds": 30, "operation": "deploy"})
    assert third.status_code == 200, third.text
    assert third.json() == first.json()

    state = member.get(f"/v1/locks/{key}").json()
    assert state["fencing_token"] == first.json()["fencing_token"]
    assert state["expires_at"] == first.json()["expires_at"]
    assert state["on_expiry"] == "release"


# --- held by another token ---------------------------------------------------------------------


def test_other_token_gets_409_lock_held_with_operation_and_retry_after(
    member: httpx.Client,
) -> None:
    key = unique_name()
    assert acquire(member, key, new_token(), ttl=30, operation="deploy").status_code == 201

    resp = acquire(member, key, new_token(), ttl=30)
    err = assert_error(resp, 409, "lock_held")
    assert err["operation"] == "deploy"
    assert is_int(err["expires_in_ms"]) and 0 < err["expires_in_ms"] <= 30_000
    assert is_int(err["retry_after_ms"]) and 0 < err["retry_after_ms"] <= 30_000
    retry_after = resp.headers.get("retry-after")
    assert retry_after is not None and retry_after.isdigit(), resp.headers
    assert int(retry_after) == math.ceil(err["retry_after_ms"] / 1000)
    assert 1 <= int(retry_after) <= 30


def test_lock_held_carries_null_operation_when_holder_gave_none(member: httpx.Client) -> None:
    key = unique_name()
    assert acquire(member, key, new_token(), ttl=30).status_code == 201
    err = assert_error(acquire(member, key, new_token()), 409, "lock_held")
    assert err["operation"] is None


def test_failed_acquire_does_not_disturb_the_holder(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    first = acquire(member, key, token, ttl=30, operation="deploy")
    assert first.status_code == 201
    assert_error(acquire(member, key, new_token(), ttl=300, operation="x"), 409, "lock_held")
    state = member.get(f"/v1/locks/{key}").json()
    assert state["fencing_token"] == first.json()["fencing_token"]
    assert state["expires_at"] == first.json()["expires_at"]
    assert state["operation"] == "deploy"
    assert acquire(member, key, token).status_code == 200


def test_overdue_keep_lease_stays_held_with_negative_expiry_and_no_retry_after(
    member: httpx.Client,
) -> None:
    key, token = unique_name(), new_token()
    resp = acquire(member, key, token, ttl=5, on_expiry="keep", operation="long-deploy")
    granted_at = time.monotonic()
    assert resp.status_code == 201, resp.text
    fencing = resp.json()["fencing_token"]

    time.sleep(max(0.0, granted_at + 6.0 - time.monotonic()))

    other = acquire(member, key, new_token(), ttl=30)
    err = assert_error(other, 409, "lock_held")
    assert err["operation"] == "long-deploy"
    assert is_int(err["expires_in_ms"]) and err["expires_in_ms"] < 0
    assert "retry-after" not in other.headers, other.headers
    assert "retry_after_ms" not in err, err

    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is True
    assert state["overdue"] is True
    assert state["fencing_token"] == fencing
    # The holder's own retried acquire still sees its lease.
    assert acquire(member, key, token).status_code == 200


# --- fencing -----------------------------------------------------------------------------------


def test_fencing_token_rises_each_time_the_lock_changes_hands(member: httpx.Client) -> None:
    key = unique_name()
    seen: list[int] = []
    for _ in range(4):
        token = new_token()
        resp = acquire(member, key, token)
        assert resp.status_code == 201, resp.text
        seen.append(resp.json()["fencing_token"])
        rel = member.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": token})
        assert rel.json() == {"released": True}
    assert all(a < b for a, b in itertools.pairwise(seen)), seen


def test_same_token_reacquiring_after_release_gets_a_new_fencing_token(
    member: httpx.Client,
) -> None:
    key, token = unique_name(), new_token()
    first = acquire(member, key, token)
    assert first.status_code == 201
    member.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": token})
    second = acquire(member, key, token)
    assert second.status_code == 201, second.text
    assert second.json()["fencing_token"] > first.json()["fencing_token"]


def test_fencing_tokens_increase_across_different_keys(member: httpx.Client) -> None:
    tokens = []
    for _ in range(5):
        resp = acquire(member, unique_name(), new_token())
        assert resp.status_code == 201, resp.text
        tokens.append(resp.json()["fencing_token"])
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens


# --- mutual exclusion under contention ---------------------------------------------------------


def test_64_concurrent_acquirers_exactly_one_wins(server: ServerProcess, member_key: str) -> None:
    key = unique_name("race")
    n = 64
    barrier = threading.Barrier(n)
    clients = [server.client(member_key) for _ in range(n)]
    try:
        for c in clients:  # open every connection before the race starts
            assert c.get("/healthz").status_code == 200

        def attempt(i: int) -> tuple[str, httpx.Response]:
            token = new_token()
            barrier.wait(timeout=30)
            return token, acquire(clients[i], key, token, ttl=60)

        with ThreadPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(attempt, range(n)))
    finally:
        for c in clients:
            c.close()

    winners = [(t, r) for t, r in results if r.status_code == 201]
    losers = [r for _, r in results if r.status_code != 201]
    assert len(winners) == 1, [r.status_code for _, r in results]
    for r in losers:
        assert_error(r, 409, "lock_held")

    win_token, win_resp = winners[0]
    with server.client(member_key) as c:
        state = c.get(f"/v1/locks/{key}").json()
        assert state["held"] is True
        assert state["fencing_token"] == win_resp.json()["fencing_token"]
        assert acquire(c, key, win_token, ttl=60).status_code == 200


# --- authorization and bad input ---------------------------------------------------------------


def test_reader_may_not_acquire(server: ServerProcess) -> None:
    reader = server.create_key("reader")["key"]
    key = unique_name()
    with server.client(reader) as c:
        assert_error(acquire(c, key, new_token()), 403, "forbidden")
        assert c.get(f"/v1/locks/{key}").json()["held"] is False


def test_unauthenticated_acquire_is_401(server: ServerProcess) -> None:
    key = unique_name()
    resp = httpx.put(f"{server.base_url}/v1/locks/{key}/lease", headers=lock_headers(),
                     json={"ttl_seconds": 30})
    assert_error(resp, 401, "unauthorized")


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Request-Id": new_token()},
        {"X-Lock-Token": new_token()},
        {"X-Lock-Token": "not-a-uuid", "X-Request-Id": new_token()},
        {"X-Lock-Token": new_token(), "X-Request-Id": "req-1"},
    ],
    ids=["no-lock-token", "no-request-id", "bad-lock-token", "bad-request-id"],
)
def test_missing_or_malformed_headers_are_400(member: httpx.Client,
                                              headers: dict[str, str]) -> None:
    key = unique_name()
    resp = member.put(f"/v1/locks/{key}/lease", headers=headers, json={"ttl_seconds": 30})
    assert_error(resp, 400, "invalid_request")
    assert member.get(f"/v1/locks/{key}").json()["held"] is False


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"ttl_seconds": 30'])
def test_body_that_is_not_json_is_400(member: httpx.Client, content: bytes) -> None:
    resp = member.put(f"/v1/locks/{unique_name()}/lease", headers={
        **lock_headers(), "Content-Type": "application/json"}, content=content)
    assert_error(resp, 400, "invalid_request")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "ttl_seconds"),
        ({"ttl_seconds": 4}, "ttl_seconds"),
        ({"ttl_seconds": 7776001}, "ttl_seconds"),
        ({"ttl_seconds": "30"}, "ttl_seconds"),
        ({"ttl_seconds": 30.5}, "ttl_seconds"),
        ({"ttl_seconds": True}, "ttl_seconds"),
        ({"ttl_seconds": 30, "wait_seconds": -1}, "wait_seconds"),
        ({"ttl_seconds": 30, "wait_seconds": 300.5}, "wait_seconds"),
        ({"ttl_seconds": 30, "wait_seconds": "1"}, "wait_seconds"),
        ({"ttl_seconds": 30, "operation": ""}, "operation"),
        ({"ttl_seconds": 30, "operation": "x" * 65}, "operation"),
        ({"ttl_seconds": 30, "operation": 7}, "operation"),
        ({"ttl_seconds": 30, "metadata": ["a"]}, "metadata"),
        ({"ttl_seconds": 30, "metadata": {"blob": "x" * 5000}}, "metadata"),
        ({"ttl_seconds": 30, "on_expiry": "forever"}, "on_expiry"),
        ({"ttl": 30}, "ttl"),
        ({"ttl_seconds": 30, "ttl": 30}, "ttl"),
    ],
)
def test_invalid_fields_are_422_naming_the_field(
    member: httpx.Client, body: dict[str, Any], field: str,
) -> None:
    key = unique_name()
    resp = member.put(f"/v1/locks/{key}/lease", headers=lock_headers(), json=body)
    err = assert_error(resp, 422, "validation_error")
    assert field in detail_fields(err), err
    assert member.get(f"/v1/locks/{key}").json()["held"] is False


def test_422_names_every_offending_field(member: httpx.Client) -> None:
    resp = member.put(f"/v1/locks/{unique_name()}/lease", headers=lock_headers(),
                      json={"ttl_seconds": 1, "on_expiry": "nope", "colour": "red"})
    err = assert_error(resp, 422, "validation_error")
    assert {"ttl_seconds", "on_expiry", "colour"} <= detail_fields(err), err


@pytest.mark.parametrize(
    "key",
    ["-leading-dash", ".dot", "a" * 129, "has%20space", "caf%C3%A9", "semi%3Bcolon"],
)
def test_lock_name_breaking_the_naming_rule_is_422(member: httpx.Client, key: str) -> None:
    resp = member.put(f"/v1/locks/{key}/lease", headers=lock_headers(), json={"ttl_seconds": 30})
    err = assert_error(resp, 422, "validation_error")
    assert "key" in detail_fields(err), err


def test_fractional_wait_seconds_is_accepted(member: httpx.Client) -> None:
    resp = acquire(member, unique_name(), new_token(), wait_seconds=0.5)
    assert resp.status_code == 201, resp.text
