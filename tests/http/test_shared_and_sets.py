"""SPEC §3.6 (shared locks) and §3.7 (POST /v1/lock-sets) over HTTP, with
every bad input the new fields and route can get."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from lock_support import acquire
from support import ServerProcess, lock_headers, new_token, unique_name


def lock_set(c: httpx.Client, keys: Any, token: str, ttl: int = 30, **body: Any) -> httpx.Response:
    return c.post("/v1/lock-sets", headers=lock_headers(token),
                  json={"keys": keys, "ttl_seconds": ttl, **body})


def error_of(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == code, err
    return dict(err)


def held(c: httpx.Client, key: str) -> bool:
    return bool(c.get(f"/v1/locks/{key}").json()["held"])


# --- shared locks --------------------------------------------------------------


def test_readers_share_a_lock_and_a_writer_waits_for_all_of_them(
    member: httpx.Client, admin: httpx.Client,
) -> None:
    key, a, b = unique_name("shared"), new_token(), new_token()
    first = acquire(member, key, a, ttl=60, mode="shared", operation="report")
    second = acquire(member, key, b, ttl=120, mode="shared", operation="backup")
    assert first.status_code == second.status_code == 201, second.text
    assert second.json()["fencing_token"] > first.json()["fencing_token"]
    writer = error_of(acquire(member, key, new_token()), 409, "lock_held")
    # The refusal names the reader whose lease ends last: when the lock frees.
    assert writer["operation"] == "backup" and writer["expires_in_ms"] > 60_000
    state = member.get(f"/v1/locks/{key}").json()
    assert (state["held"], state["mode"], state["holders"]) == (True, "shared", 2)
    assert state["fencing_token"] == first.json()["fencing_token"]  # the oldest holder
    assert state["operation"] == "report"
    for grant in (first, second):
        token = grant.json()["fencing_token"]
        fence = member.get(f"/v1/locks/{key}/fence", params={"token": token}).json()
        assert fence["current"] and fence["live_token"] == token
    listed = member.get("/v1/locks", params={"prefix": key}).json()["locks"]
    assert [(lock["key"], lock["holders"]) for lock in listed] == [(key, 2)]

    forced = admin.delete(f"/v1/locks/{key}")
    assert forced.status_code == 200, forced.text
    assert forced.json()["released_count"] == 2
    assert forced.json()["fencing_token"] == first.json()["fencing_token"]
    for token in (a, b):
        renewal = member.patch(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                               json={"ttl_seconds": 30})
        assert error_of(renewal, 409, "lease_lost")["reason"] == "force_released"
    assert not held(member, key)


def test_an_exclusive_lease_shows_its_mode(member: httpx.Client) -> None:
    key = unique_name("excl")
    assert acquire(member, key, new_token()).status_code == 201
    state = member.get(f"/v1/locks/{key}").json()
    assert (state["mode"], state["holders"]) == ("exclusive", 1)
    error_of(acquire(member, key, new_token(), mode="shared"), 409, "lock_held")
    free = member.get(f"/v1/locks/{unique_name('never')}").json()
    assert (free["mode"], free["holders"]) == (None, 0)


def test_a_waiting_writer_is_not_overtaken_by_later_readers(
    server: ServerProcess, member: httpx.Client, member_key: str,
) -> None:
    key, reader_token, writer_token = unique_name("line"), new_token(), new_token()
    assert acquire(member, key, reader_token, mode="shared").status_code == 201
    answers: list[httpx.Response] = []

    def wait_as_writer() -> None:
        with server.client(member_key) as c:
            answers.append(acquire(c, key, writer_token, wait_seconds=20))

    writer = threading.Thread(target=wait_as_writer)
    writer.start()
    try:
        for _ in range(100):
            if member.get(f"/v1/locks/{key}").json()["waiters"] == 1:
                break
            threading.Event().wait(0.05)
        late = error_of(acquire(member, key, new_token(), mode="shared"), 409, "lock_held")
        assert late["waiters"] == 1
        released = member.delete(f"/v1/locks/{key}/lease", headers=lock_headers(reader_token))
        assert released.json() == {"released": True}
    finally:
        writer.join(30)
    assert answers and answers[0].status_code == 201, answers
    assert member.get(f"/v1/locks/{key}").json()["mode"] == "exclusive"


# --- lock sets -----------------------------------------------------------------


def test_a_lock_set_is_granted_whole_then_renewed_and_released_per_key(
    member: httpx.Client,
) -> None:
    keys = [unique_name("set-c"), unique_name("set-a"), unique_name("set-b")]
    token = new_token()
    grant = lock_set(member, keys, token, operation="migrate")
    assert grant.status_code == 201, grant.text
    leases = grant.json()["leases"]
    assert [lease["key"] for lease in leases] == keys
    fences = [lease["fencing_token"] for lease in leases]
    assert fences == sorted(set(fences))
    again = lock_set(member, keys, token)
    assert again.status_code == 200 and again.json() == grant.json()
    renewal = member.patch(f"/v1/locks/{keys[1]}/lease", headers=lock_headers(token),
                           json={"ttl_seconds": 60})
    assert renewal.status_code == 200 and renewal.json()["fencing_token"] == fences[1]
    released = member.delete(f"/v1/locks/{keys[0]}/lease", headers=lock_headers(token))
    assert released.json() == {"released": True}
    assert not held(member, keys[0]) and held(member, keys[1]) and held(member, keys[2])


def test_a_busy_key_refuses_the_whole_set_and_names_itself(member: httpx.Client) -> None:
    free, busy = unique_name("free"), unique_name("busy")
    assert acquire(member, busy, new_token(), operation="deploy").status_code == 201
    refused = lock_set(member, [free, busy], new_token())
    err = error_of(refused, 409, "lock_held")
    assert err["key"] == busy and err["operation"] == "deploy"
    assert "retry-after" in refused.headers
    assert not held(member, free)


def test_a_waiting_set_is_granted_when_its_last_key_frees(
    server: ServerProcess, member: httpx.Client, member_key: str,
) -> None:
    a, b, holder = unique_name("wa"), unique_name("wb"), new_token()
    assert acquire(member, b, holder).status_code == 201
    answers: list[httpx.Response] = []

    def wait_for_set() -> None:
        with server.client(member_key) as c:
            answers.append(lock_set(c, [a, b], new_token(), wait_seconds=20))

    waiting = threading.Thread(target=wait_for_set)
    waiting.start()
    try:
        for _ in range(100):
            if member.get(f"/v1/locks/{a}").json()["waiters"] == 1:
                break
            threading.Event().wait(0.05)
        # The set stands in a's line too: a free a is not given to a later caller.
        error_of(acquire(member, a, new_token()), 409, "lock_held")
        member.delete(f"/v1/locks/{b}/lease", headers=lock_headers(holder))
    finally:
        waiting.join(30)
    assert answers and answers[0].status_code == 201, answers
    assert [lease["key"] for lease in answers[0].json()["leases"]] == [a, b]


# --- bad input -----------------------------------------------------------------


@pytest.mark.parametrize(("keys", "why"), [
    (["x", "y", "x"], "repeated"),
    ([f"k{i}" for i in range(33)], "too many"),
    ([], "empty"),
    (["bad name"], "breaks the naming rule"),
    (["-dash"], "breaks the naming rule"),
    ([7], "not a string"),
    ("x", "not a list"),
    (None, "null"),
])
def test_bad_keys_are_422_and_nothing_is_held(member: httpx.Client, keys: Any, why: str) -> None:
    if isinstance(keys, list):
        keys = [f"{unique_name('bad')}-{k}" if isinstance(k, str) and k[:1].isalnum() else k
                for k in keys]
        if why == "repeated":
            keys[2] = keys[0]
    err = error_of(lock_set(member, keys, new_token()), 422, "validation_error")
    assert any(d["field"].startswith("keys") for d in err["details"]), err
    for key in keys if isinstance(keys, list) else []:
        if isinstance(key, str) and key[:1].isalnum() and " " not in key:
            assert not held(member, key)


def test_thirty_two_keys_are_accepted(member: httpx.Client) -> None:
    keys = [unique_name(f"many{i}") for i in range(32)]
    grant = lock_set(member, keys, new_token())
    assert grant.status_code == 201, grant.text
    assert len(grant.json()["leases"]) == 32


@pytest.mark.parametrize("mode", ["readers", "SHARED", "", 1, None, True])
def test_an_unknown_mode_is_422(member: httpx.Client, mode: Any) -> None:
    key = unique_name("mode")
    err = error_of(acquire(member, key, new_token(), mode=mode), 422, "validation_error")
    assert [d["field"] for d in err["details"]] == ["mode"], err
    err = error_of(lock_set(member, [key], new_token(), mode=mode), 422, "validation_error")
    assert [d["field"] for d in err["details"]] == ["mode"], err
    assert not held(member, key)


@pytest.mark.parametrize(("body", "field"), [
    ({"keys": ["a"]}, "ttl_seconds"),
    ({"ttl_seconds": 30}, "keys"),
    ({"keys": ["a"], "ttl_seconds": 4}, "ttl_seconds"),
    ({"keys": ["a"], "ttl_seconds": 30, "wait_seconds": 301}, "wait_seconds"),
    ({"keys": ["a"], "ttl_seconds": 30, "key": "a"}, "key"),
    ({"keys": ["a"], "ttl_seconds": 30, "lock_delay_seconds": 61}, "lock_delay_seconds"),
    ({"keys": ["a"], "ttl_seconds": 30, "on_expiry": "never"}, "on_expiry"),
])
def test_bad_set_bodies_are_422(member: httpx.Client, body: dict[str, Any], field: str) -> None:
    resp = member.post("/v1/lock-sets", headers=lock_headers(new_token()), json=body)
    err = error_of(resp, 422, "validation_error")
    assert field in [d["field"] for d in err["details"]], err


@pytest.mark.parametrize("raw", [b"{", b'{"keys": ["a"], "keys": ["b"], "ttl_seconds": 30}'])
def test_malformed_or_repeated_json_is_400(member: httpx.Client, raw: bytes) -> None:
    resp = member.post("/v1/lock-sets", content=raw,
                       headers={**lock_headers(new_token()), "Content-Type": "application/json"})
    error_of(resp, 400, "invalid_request")


@pytest.mark.parametrize("headers", [
    {"X-Request-Id": "00000000-0000-4000-8000-000000000001"},
    {"X-Lock-Token": "not-a-uuid", "X-Request-Id": "00000000-0000-4000-8000-000000000001"},
    {"X-Lock-Token": "00000000-0000-4000-8000-000000000001"},
])
def test_missing_or_malformed_headers_are_400(member: httpx.Client,
                                              headers: dict[str, str]) -> None:
    key = unique_name("hdr")
    resp = member.post("/v1/lock-sets", headers=headers, json={"keys": [key], "ttl_seconds": 30})
    error_of(resp, 400, "invalid_request")
    assert not held(member, key)


def test_readers_and_strangers_may_not_take_lock_sets(
    server: ServerProcess, reader_key: str,
) -> None:
    body = {"keys": [unique_name("role")], "ttl_seconds": 30}
    with server.client(reader_key) as reader:
        error_of(reader.post("/v1/lock-sets", headers=lock_headers(), json=body), 403,
                 "forbidden")
    with httpx.Client(base_url=server.base_url) as stranger:
        error_of(stranger.post("/v1/lock-sets", headers=lock_headers(), json=body), 401,
                 "unauthorized")


@pytest.mark.parametrize("token", ["abc", "1.5", "-1", "", "9007199254740992"])
def test_a_fence_token_that_is_not_a_number_is_422(member: httpx.Client, token: str) -> None:
    resp = member.get(f"/v1/locks/{unique_name('fence')}/fence", params={"token": token})
    error_of(resp, 422, "validation_error")


def _granted_by_mode(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics").text
    counts = {"exclusive": 0.0, "shared": 0.0}
    for line in text.splitlines():
        if line.startswith("fencepost_lock_leases_granted_total{"):
            labels, value = line.rsplit(" ", 1)
            counts[labels.split('mode="')[1].split('"')[0]] = float(value)
    return counts


def test_metrics_count_grants_by_mode_each_lease_once(server: ServerProcess,
                                                       member: httpx.Client) -> None:
    before = _granted_by_mode(server)
    key = unique_name("metric")
    for _ in range(2):
        assert acquire(member, key, new_token(), mode="shared").status_code == 201
    assert lock_set(member, [unique_name("m-a"), unique_name("m-b")],
                    new_token()).status_code == 201
    after = _granted_by_mode(server)
    assert after["shared"] - before["shared"] == 2
    assert after["exclusive"] - before["exclusive"] == 2
