"""SPEC §3.4 (inspect, list) and §3.5 (force release) over HTTP."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from lock_support import acquire
from support import (
    ServerProcess,
    assert_error,
    lock_headers,
    new_token,
    parse_at,
    unique_name,
    wait_for,
)

STATE_FIELDS = {
    "key", "held", "fencing_token", "operation", "acquired_at", "expires_at", "deadline_at",
    "on_expiry", "overdue", "metadata", "waiters", "holder", "line", "mode", "holders",
}


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- GET /v1/locks/{key} -----------------------------------------------------------------------


def test_never_held_lock_is_not_held_with_nulls(reader: httpx.Client) -> None:
    key = unique_name()
    resp = reader.get(f"/v1/locks/{key}")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == STATE_FIELDS, body
    assert body["key"] == key
    assert body["held"] is False
    assert body["waiters"] == 0
    for name in ("fencing_token", "operation", "acquired_at", "expires_at", "deadline_at",
                 "on_expiry", "metadata"):
        assert body[name] is None, (name, body)
    assert body["overdue"] in (None, False), body


def test_held_lock_shows_its_lease_and_never_the_lock_token(
    member: httpx.Client, reader: httpx.Client,
) -> None:
    key, token = unique_name(), new_token()
    metadata = {"host": "build-7", "pid": 99}
    grant = acquire(member, key, token, ttl=120, operation="deploy", metadata=metadata)
    assert grant.status_code == 201, grant.text
    g = grant.json()

    resp = reader.get(f"/v1/locks/{key}")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == STATE_FIELDS, body
    assert body["key"] == key
    assert body["held"] is True
    assert body["fencing_token"] == g["fencing_token"]
    assert body["operation"] == "deploy"
    assert body["acquired_at"] == g["acquired_at"]
    assert body["expires_at"] == g["expires_at"]
    assert body["deadline_at"] == g["deadline_at"]
    for name in ("acquired_at", "expires_at", "deadline_at"):
        parse_at(body[name])
    assert body["on_expiry"] == "release"
    assert body["overdue"] is False
    assert body["metadata"] == metadata
    assert body["waiters"] == 0
    assert token not in resp.text
    assert token.replace("-", "") not in resp.text.replace("-", "")
    assert token not in str(resp.headers)


def test_released_lock_reads_as_not_held(member: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    assert acquire(member, key, token).status_code == 201
    member.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": token})
    body = member.get(f"/v1/locks/{key}").json()
    assert body["held"] is False
    assert body["waiters"] == 0


def test_inspect_with_a_bad_name_is_422(reader: httpx.Client) -> None:
    err = assert_error(reader.get("/v1/locks/-bad"), 422, "validation_error")
    assert {d["field"] for d in err["details"]} == {"key"}


def test_inspect_needs_a_key(server: ServerProcess) -> None:
    assert_error(httpx.get(f"{server.base_url}/v1/locks/{unique_name()}"), 401, "unauthorized")
    assert_error(httpx.get(f"{server.base_url}/v1/locks"), 401, "unauthorized")


# --- GET /v1/locks -----------------------------------------------------------------------------


def test_list_pages_through_held_locks_sorted_by_key(
    member: httpx.Client, reader: httpx.Client,
) -> None:
    prefix = unique_name("list") + "."
    keys = [f"{prefix}{suffix}" for suffix in ("e", "a", "d", "b", "c")]
    tokens: dict[str, str] = {}
    fencing: dict[str, int] = {}
    for key in keys:
        tokens[key] = new_token()
        resp = acquire(member, key, tokens[key], ttl=120, operation="op-" + key[-1])
        assert resp.status_code == 201
        fencing[key] = resp.json()["fencing_token"]
    # A released lock under the same prefix and a held one outside it are not listed.
    gone = f"{prefix}f"
    gone_token = new_token()
    assert acquire(member, gone, gone_token).status_code == 201
    member.delete(f"/v1/locks/{gone}/lease", headers={"X-Lock-Token": gone_token})
    assert acquire(member, unique_name("other"), new_token()).status_code == 201

    pages: list[list[dict[str, Any]]] = []
    after: str | None = None
    for _ in range(10):
        params: dict[str, Any] = {"prefix": prefix, "limit": 2}
        if after is not None:
            params["after"] = after
        resp = reader.get("/v1/locks", params=params)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert set(body) == {"locks", "next"}, body
        pages.append(body["locks"])
        for token in tokens.values():
            assert token not in resp.text
        after = body["next"]
        if after is None:
            break
    assert [len(p) for p in pages] == [2, 2, 1]
    listed = [lock for page in pages for lock in page]
    assert [lock["key"] for lock in listed] == sorted(keys)
    for lock in listed:
        assert set(lock) == STATE_FIELDS, lock
        assert lock["held"] is True
        assert lock["fencing_token"] == fencing[lock["key"]]
        assert lock["operation"] == "op-" + lock["key"][-1]


def test_list_default_and_maximum_limits(member: httpx.Client, reader: httpx.Client) -> None:
    prefix = unique_name("lim") + ":"
    for i in range(3):
        assert acquire(member, f"{prefix}{i}", new_token()).status_code == 201
    for params in ({"prefix": prefix}, {"prefix": prefix, "limit": 1000}):
        resp = reader.get("/v1/locks", params=params)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert [lock["key"] for lock in body["locks"]] == [f"{prefix}{i}" for i in range(3)]
        assert body["next"] is None


def test_list_without_prefix_includes_this_tests_locks(
    member: httpx.Client, reader: httpx.Client,
) -> None:
    key = unique_name("all")
    assert acquire(member, key, new_token()).status_code == 201
    seen: list[str] = []
    after: str | None = None
    for _ in range(1000):
        params: dict[str, Any] = {"limit": 1000}
        if after is not None:
            params["after"] = after
        body = reader.get("/v1/locks", params=params).json()
        seen.extend(lock["key"] for lock in body["locks"])
        after = body["next"]
        if after is None:
            break
    assert key in seen
    assert seen == sorted(seen)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": -1}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "\u00b2"}, "limit"),  # a digit to str.isdigit, not to int()
        ({"limit": "\u0663"}, "limit"),  # ARABIC-INDIC DIGIT THREE: not an ASCII number
        ({"lmit": 5}, "lmit"),
    ],
)
def test_list_with_bad_query_is_422(reader: httpx.Client, params: dict[str, Any],
                                    field: str) -> None:
    err = assert_error(reader.get("/v1/locks", params=params), 422, "validation_error")
    assert field in {d["field"] for d in err["details"]}, err


def test_other_project_sees_nothing_and_cannot_force_release(
    server: ServerProcess, member: httpx.Client,
) -> None:
    key, token = unique_name("iso"), new_token()
    grant = acquire(member, key, token, ttl=120)
    assert grant.status_code == 201
    other_admin = server.create_project(unique_name("proj"))
    with server.client(other_admin) as other:
        assert wait_for(lambda: other.get("/v1/whoami").status_code == 200, timeout=3.0)
        body = other.get(f"/v1/locks/{key}").json()
        assert body["held"] is False
        assert body["fencing_token"] is None
        listed = other.get("/v1/locks", params={"prefix": key}).json()
        assert listed["locks"] == []
        forced = other.delete(f"/v1/locks/{key}")
        assert forced.status_code == 200
        assert forced.json()["released"] is False
        # Its own lock of the same name is independent.
        mine = acquire(other, key, new_token(), ttl=30)
        assert mine.status_code == 201, mine.text
    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is True
    assert state["fencing_token"] == grant.json()["fencing_token"]


# --- DELETE /v1/locks/{key} (force release) ----------------------------------------------------


def test_force_release_of_held_lock(member: httpx.Client, admin: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token, ttl=60, operation="deploy")
    assert grant.status_code == 201
    time.sleep(0.1)

    resp = admin.delete(f"/v1/locks/{key}")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"released", "key", "operation", "fencing_token", "age_ms",
                         "expires_in_ms", "released_count"}, body
    assert body["released_count"] == 1
    assert body["released"] is True
    assert body["key"] == key
    assert body["operation"] == "deploy"
    assert body["fencing_token"] == grant.json()["fencing_token"]
    assert is_int(body["age_ms"]) and 100 <= body["age_ms"] < 30_000
    assert is_int(body["expires_in_ms"]) and 30_000 < body["expires_in_ms"] <= 59_900

    assert admin.get(f"/v1/locks/{key}").json()["held"] is False
    nxt = acquire(member, key, new_token())
    assert nxt.status_code == 201, nxt.text
    assert nxt.json()["fencing_token"] > grant.json()["fencing_token"]


def test_force_release_of_free_lock_is_200_false_with_message(admin: httpx.Client) -> None:
    key = unique_name()
    resp = admin.delete(f"/v1/locks/{key}")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"released", "key", "message", "released_count"}, body
    assert body["released_count"] == 0
    assert body["released"] is False
    assert body["key"] == key
    assert isinstance(body["message"], str) and body["message"]


def test_force_release_twice_second_is_false(member: httpx.Client, admin: httpx.Client) -> None:
    key = unique_name()
    assert acquire(member, key, new_token()).status_code == 201
    assert admin.delete(f"/v1/locks/{key}").json()["released"] is True
    again = admin.delete(f"/v1/locks/{key}")
    assert again.status_code == 200
    assert again.json()["released"] is False


def test_another_member_and_a_reader_may_not_force_release(
    server: ServerProcess, member: httpx.Client, reader: httpx.Client,
) -> None:
    key = unique_name()
    grant = acquire(member, key, new_token(), ttl=60)
    assert grant.status_code == 201
    other_key = str(server.create_key("member", name="not-the-owner")["key"])
    with server.client(other_key) as other:
        err = assert_error(other.delete(f"/v1/locks/{key}"), 403, "forbidden")
        assert "fencing_token" not in err
    assert_error(reader.delete(f"/v1/locks/{key}"), 403, "forbidden")
    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is True
    assert state["fencing_token"] == grant.json()["fencing_token"]


def test_a_member_may_not_force_release_an_admins_lease(
    member: httpx.Client, admin: httpx.Client,
) -> None:
    key = unique_name()
    grant = acquire(admin, key, new_token(), ttl=60)
    assert grant.status_code == 201
    assert_error(member.delete(f"/v1/locks/{key}"), 403, "forbidden")
    assert member.get(f"/v1/locks/{key}").json()["fencing_token"] == grant.json()["fencing_token"]


def test_the_key_that_took_the_lease_may_force_release_it_without_its_token(
    server: ServerProcess, member: httpx.Client,
) -> None:
    """The owner crashed and lost its lock token: its own API key ends the lease."""
    key, lost_token = unique_name("owner"), new_token()
    grant = acquire(member, key, lost_token, ttl=60, operation="nightly")
    assert grant.status_code == 201
    resp = member.delete(f"/v1/locks/{key}")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["released"] is True
    assert body["fencing_token"] == grant.json()["fencing_token"]
    assert body["operation"] == "nightly"
    assert member.get(f"/v1/locks/{key}").json()["held"] is False
    renew = member.patch(f"/v1/locks/{key}/lease", headers=lock_headers(lost_token),
                         json={"ttl_seconds": 30})
    assert assert_error(renew, 409, "lease_lost")["reason"] == "force_released"
    # Written to the access log with the key that did it.
    me = member.get("/v1/whoami").json()["key_id"]
    assert wait_for(lambda: any(
        '"lock.force_release"' in line and me in line and key in line
        for line in server.access_log.read_text().splitlines()
    ))


def test_a_member_force_releasing_a_free_lock_gets_200_false(member: httpx.Client) -> None:
    resp = member.delete(f"/v1/locks/{unique_name()}")
    assert resp.status_code == 200, resp.text
    assert resp.json()["released"] is False


def test_displaced_holder_is_told_force_released(member: httpx.Client, admin: httpx.Client) -> None:
    key, token = unique_name(), new_token()
    grant = acquire(member, key, token)
    assert grant.status_code == 201
    assert admin.delete(f"/v1/locks/{key}").json()["released"] is True
    renew = member.patch(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                         json={"ttl_seconds": 30})
    err = assert_error(renew, 409, "lease_lost")
    assert err["reason"] == "force_released"
    rel = member.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": token})
    assert rel.json() == {"released": False}
    # Its retried acquire is a new lease with a new fencing token, not the old one back.
    again = acquire(member, key, token)
    assert again.status_code == 201, again.text
    assert again.json()["fencing_token"] > grant.json()["fencing_token"]


def test_force_release_of_overdue_keep_lease_reports_negative_expiry(
    member: httpx.Client, admin: httpx.Client,
) -> None:
    key = unique_name()
    grant = acquire(member, key, new_token(), ttl=5, on_expiry="keep", operation="long")
    granted = time.monotonic()
    assert grant.status_code == 201
    time.sleep(max(0.0, granted + 6.0 - time.monotonic()))
    assert member.get(f"/v1/locks/{key}").json()["overdue"] is True

    body = admin.delete(f"/v1/locks/{key}").json()
    assert body["released"] is True
    assert body["operation"] == "long"
    assert is_int(body["expires_in_ms"]) and body["expires_in_ms"] <= -900
    assert is_int(body["age_ms"]) and body["age_ms"] >= 5_900
    assert member.get(f"/v1/locks/{key}").json()["held"] is False


def test_force_release_is_written_to_the_access_log_with_the_key_id(
    server: ServerProcess, member: httpx.Client, admin: httpx.Client,
) -> None:
    key = unique_name("audit")
    grant = acquire(member, key, new_token())
    assert grant.status_code == 201
    whoami = admin.get("/v1/whoami")
    assert whoami.status_code == 200, whoami.text
    key_id = whoami.json()["key_id"]
    request_id = new_token()
    resp = admin.delete(f"/v1/locks/{key}", headers={"X-Request-Id": request_id})
    assert resp.json()["released"] is True

    def entries() -> list[dict[str, Any]]:
        return [e for e in server.access_log_lines()
                if e.get("event") == "lock.force_release" and e.get("lock") == key]

    found = wait_for(entries, timeout=3.0)
    assert len(found) == 1, found
    entry = found[0]
    assert entry["key_id"] == key_id
    assert entry["released"] is True
    assert entry["project"] == whoami.json()["project"]
    assert entry["request_id"] == request_id
    assert entry.get("fencing_token") == grant.json()["fencing_token"]
    assert server.admin_key not in str(entry)


def test_force_release_of_free_lock_is_logged_too(server: ServerProcess,
                                                  admin: httpx.Client) -> None:
    key = unique_name("audit-free")
    assert admin.delete(f"/v1/locks/{key}").json()["released"] is False

    def entries() -> list[dict[str, Any]]:
        return [e for e in server.access_log_lines()
                if e.get("event") == "lock.force_release" and e.get("lock") == key]

    found = wait_for(entries, timeout=3.0)
    assert len(found) == 1, found
    assert found[0]["released"] is False
    assert found[0]["key_id"]
