"""SPEC §3.10 over HTTP: sessions (create, renew, end, inspect), leases and slots
attached to them, and every route's bad input. Another key's session is 404,
exactly like one that never existed."""

from __future__ import annotations

import json
import time
from typing import Any, Iterator

import httpx
import pytest

from support import ServerProcess, lock_headers, metric, new_token, parse_at, unique_name

GRANT = {"session_id", "name", "ttl_seconds", "expires_at"}
STATE = {"session_id", "name", "ttl_seconds", "created_at", "expires_at", "live", "ended",
         "ended_at", "keys", "leases", "pools", "slots"}
UNKNOWN_ID = "ses_" + "A" * 32


def at_s(at: str) -> float:
    return parse_at(at).timestamp()


@pytest.fixture(scope="module")
def member_key(server: ServerProcess) -> str:
    return str(server.create_key("member", name="session-tests")["key"])


@pytest.fixture
def member(server: ServerProcess, member_key: str) -> Iterator[httpx.Client]:
    with server.client(member_key) as c:
        yield c


@pytest.fixture
def other(server: ServerProcess) -> Iterator[httpx.Client]:
    """Another member key of the same project."""
    with server.client(str(server.create_key("member", name="stranger")["key"])) as c:
        yield c


@pytest.fixture(scope="module")
def outsider_key(server: ServerProcess) -> str:
    """An admin key of another project."""
    return server.create_project(unique_name("sessproj"))


def start(c: httpx.Client, ttl: int = 30, **extra: Any) -> dict[str, Any]:
    resp = c.post("/v1/sessions", json={"ttl_seconds": ttl, **extra})
    assert resp.status_code == 201, resp.text
    body = dict(resp.json())
    assert set(body) == GRANT
    return body


def take(c: httpx.Client, key: str, session_id: str, token: str | None = None,
         **extra: Any) -> httpx.Response:
    return c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token or new_token()),
                 json={"ttl_seconds": 30, "session_id": session_id, **extra})


def take_set(c: httpx.Client, keys: Any, session_id: Any, token: str | None = None,
             **extra: Any) -> httpx.Response:
    return c.post("/v1/lock-sets", headers=lock_headers(token or new_token()),
                  json={"keys": keys, "ttl_seconds": 30, "session_id": session_id, **extra})


def error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = dict(resp.json()["error"])
    assert body["code"] == code, body
    return body


# --- the happy path ------------------------------------------------------------


def test_create_renew_inspect_and_end(member: httpx.Client) -> None:
    before = time.time()
    session = start(member, 60, name="nightly batch")
    sid = session["session_id"]
    assert sid.startswith("ses_") and session["name"] == "nightly batch"
    assert session["ttl_seconds"] == 60
    assert before + 59 <= at_s(session["expires_at"]) <= time.time() + 61
    state = member.get(f"/v1/sessions/{sid}").json()
    assert set(state) == STATE
    assert state | {"created_at": None} == {
        "session_id": sid, "name": "nightly batch", "ttl_seconds": 60, "created_at": None,
        "expires_at": session["expires_at"], "live": True, "ended": None, "ended_at": None,
        "keys": [], "leases": 0, "pools": [], "slots": 0}
    renewed = member.patch(f"/v1/sessions/{sid}", json={"ttl_seconds": 5})
    assert renewed.status_code == 200, renewed.text
    assert renewed.json()["ttl_seconds"] == 5
    assert at_s(renewed.json()["expires_at"]) < at_s(session["expires_at"])
    ended = member.delete(f"/v1/sessions/{sid}")
    assert ended.status_code == 200 and ended.json() == {"ended": True, "leases": 0, "slots": 0}
    again = member.delete(f"/v1/sessions/{sid}")
    assert again.status_code == 200 and again.json() == {"ended": False, "leases": 0, "slots": 0}
    state = member.get(f"/v1/sessions/{sid}").json()
    assert (state["live"], state["ended"]) == (False, "session_ended") and state["ended_at"]
    lost = error(member.patch(f"/v1/sessions/{sid}", json={"ttl_seconds": 30}),
                 409, "session_lost")
    assert lost["reason"] == "session_ended"


def test_attached_leases_and_slots_follow_the_session(server: ServerProcess,
                                                      member: httpx.Client) -> None:
    sid = start(member, 20)["session_id"]
    keys = sorted(unique_name("sess") for _ in range(3))
    tokens = {key: new_token() for key in keys}
    for key in keys:
        resp = take(member, key, sid, tokens[key], operation="batch")
        assert resp.status_code == 201, resp.text
    # A retried acquire answers the same lease.
    assert take(member, keys[0], sid, tokens[keys[0]]).status_code == 200
    pool = unique_name("sesspool")
    with server.client() as admin:
        assert admin.put(f"/v1/pools/{pool}", json={
            "limit": 2, "request_timeout_ms": 3_600_000}).status_code == 201
    slot = member.post(f"/v1/pools/{pool}/lock/acquire", json={"session_id": sid})
    assert slot.status_code == 200, slot.text
    renewed = member.patch(f"/v1/sessions/{sid}", json={"ttl_seconds": 600}).json()
    for key in keys:
        lock = member.get(f"/v1/locks/{key}").json()
        assert lock["held"] and lock["expires_at"] == renewed["expires_at"]
    assert slot.json()["lease_deadline"] < at_s(renewed["expires_at"]) * 1000
    renewed_slot = member.post(f"/v1/pools/{pool}/lock/{slot.json()['slot_id']}/renew")
    assert renewed_slot.status_code == 200
    assert renewed_slot.json()["lease_deadline"] == round(at_s(renewed["expires_at"]) * 1000)
    # Renewing an attached lease is allowed and changes nothing.
    lease = member.patch(f"/v1/locks/{keys[0]}/lease", headers=lock_headers(tokens[keys[0]]),
                         json={"ttl_seconds": 3600})
    assert lease.status_code == 200 and lease.json()["expires_at"] == renewed["expires_at"]
    state = member.get(f"/v1/sessions/{sid}").json()
    assert (state["keys"], state["leases"]) == (keys, 3)
    assert (state["pools"], state["slots"]) == ([{"pool": pool, "slots": 1}], 1)
    ended = member.delete(f"/v1/sessions/{sid}").json()
    assert ended == {"ended": True, "leases": 3, "slots": 1}
    for key in keys:
        assert member.get(f"/v1/locks/{key}").json()["held"] is False
    lost = error(member.patch(f"/v1/locks/{keys[1]}/lease", headers=lock_headers(tokens[keys[1]]),
                              json={"ttl_seconds": 30}), 409, "lease_lost")
    assert lost["reason"] == "session_ended"
    assert member.get(f"/v1/pools/{pool}").json()["in_use"] == 0


def test_an_ended_session_takes_nothing_more(member: httpx.Client) -> None:
    sid = start(member)["session_id"]
    member.delete(f"/v1/sessions/{sid}")
    key = unique_name("sess")
    lost = error(take(member, key, sid), 409, "session_lost")
    assert lost["reason"] == "session_ended"
    assert member.get(f"/v1/locks/{key}").json()["held"] is False


def test_a_session_lease_waits_in_line_like_any_other(member: httpx.Client) -> None:
    key, holder = unique_name("sess"), new_token()
    member.put(f"/v1/locks/{key}/lease", headers=lock_headers(holder), json={"ttl_seconds": 30})
    sid = start(member)["session_id"]
    busy = error(take(member, key, sid), 409, "lock_held")
    assert busy["expires_in_ms"] > 0
    member.delete(f"/v1/locks/{key}/lease", headers=lock_headers(holder))
    assert take(member, key, sid, wait_seconds=1).status_code == 201


def test_a_lock_set_follows_the_session_and_ends_with_it(member: httpx.Client) -> None:
    sid = start(member, 20)["session_id"]
    keys = sorted(unique_name("sess") for _ in range(3))
    token = new_token()
    grant = take_set(member, keys, sid, token, mode="shared")
    assert grant.status_code == 201, grant.text
    session = member.get(f"/v1/sessions/{sid}").json()
    assert {lease["expires_at"] for lease in grant.json()["leases"]} == {session["expires_at"]}
    assert take_set(member, keys, sid, token, mode="shared").status_code == 200  # a retry
    assert (session["keys"], session["leases"]) == (keys, 3)
    renewed = member.patch(f"/v1/sessions/{sid}", json={"ttl_seconds": 600}).json()
    for key in keys:
        lock = member.get(f"/v1/locks/{key}").json()
        assert lock["held"] and lock["expires_at"] == renewed["expires_at"]
    assert member.delete(f"/v1/sessions/{sid}").json() == {"ended": True, "leases": 3, "slots": 0}
    for key in keys:
        assert member.get(f"/v1/locks/{key}").json()["held"] is False
    lost = error(member.patch(f"/v1/locks/{keys[0]}/lease", headers=lock_headers(token),
                              json={"ttl_seconds": 30}), 409, "lease_lost")
    assert lost["reason"] == "session_ended"


def test_a_lock_set_on_an_ended_or_unknown_session_takes_nothing(member: httpx.Client) -> None:
    sid = start(member)["session_id"]
    member.delete(f"/v1/sessions/{sid}")
    keys = [unique_name("sess"), unique_name("sess")]
    assert error(take_set(member, keys, sid), 409, "session_lost")["reason"] == "session_ended"
    error(take_set(member, keys, UNKNOWN_ID), 404, "not_found")
    assert all(member.get(f"/v1/locks/{key}").json()["held"] is False for key in keys)


@pytest.mark.parametrize("sid", ["", "ses_", "ses_!!!!!!!!!!!!!!!!!!!!", 7, ["ses_x"],
                                 "ses_" + "A" * 65])
def test_a_malformed_session_id_on_a_lock_set_is_422(member: httpx.Client, sid: Any) -> None:
    keys = [unique_name("sess"), unique_name("sess")]
    details = error(take_set(member, keys, sid), 422, "validation_error")["details"]
    assert [d["field"] for d in details] == ["session_id"]
    assert all(member.get(f"/v1/locks/{key}").json()["held"] is False for key in keys)


def test_a_keep_lock_set_cannot_follow_a_session(member: httpx.Client) -> None:
    sid = start(member)["session_id"]
    keys = [unique_name("sess"), unique_name("sess")]
    details = error(take_set(member, keys, sid, on_expiry="keep"), 422,
                    "validation_error")["details"]
    assert [d["field"] for d in details] == ["on_expiry"]
    assert all(member.get(f"/v1/locks/{key}").json()["held"] is False for key in keys)


def test_a_lock_set_with_a_repeated_session_id_is_400(member: httpx.Client) -> None:
    sid = start(member)["session_id"]
    key = unique_name("sess")
    raw = json.dumps({"keys": [key], "ttl_seconds": 30, "session_id": sid})
    raw = raw[:-1] + f', "session_id": "{sid}"}}'
    resp = member.post("/v1/lock-sets", content=raw.encode(), headers={
        **lock_headers(new_token()), "Content-Type": "application/json"})
    error(resp, 400, "invalid_request")
    assert member.get(f"/v1/locks/{key}").json()["held"] is False


def test_renewal_inside_the_last_second_is_session_expired(member: httpx.Client) -> None:
    session = start(member, 5)
    time.sleep(max(0.0, at_s(session["expires_at"]) - time.time() - 0.6))
    expired = error(member.patch(f"/v1/sessions/{session['session_id']}",
                                 json={"ttl_seconds": 30}), 409, "session_expired")
    assert expired["message"]


# --- who may see a session ----------------------------------------------------------


@pytest.mark.parametrize("call", ["GET", "PATCH", "DELETE", "lock", "lock_set", "slot"])
def test_another_keys_session_is_not_found(server: ServerProcess, member: httpx.Client,
                                           other: httpx.Client, call: str) -> None:
    sid = start(member)["session_id"]
    key = unique_name("sess")
    if call == "lock":
        resp = take(other, key, sid)
    elif call == "lock_set":
        resp = take_set(other, [key, unique_name("sess")], sid)
        assert other.get(f"/v1/locks/{key}").json()["held"] is False
    elif call == "slot":
        pool = unique_name("sesspool")
        with server.client() as admin:
            admin.put(f"/v1/pools/{pool}", json={"limit": 1})
        resp = other.post(f"/v1/pools/{pool}/lock/acquire", json={"session_id": sid})
    else:
        resp = other.request(call, f"/v1/sessions/{sid}",
                             json={"ttl_seconds": 30} if call == "PATCH" else None)
    error(resp, 404, "not_found")
    # ... and it changed nothing: the session is live and holds nothing.
    state = member.get(f"/v1/sessions/{sid}").json()
    assert state["live"] and state["leases"] == state["slots"] == 0


@pytest.mark.parametrize("call", ["GET", "PATCH", "DELETE"])
def test_another_projects_key_finds_no_session(server: ServerProcess, member: httpx.Client,
                                               outsider_key: str, call: str) -> None:
    sid = start(member)["session_id"]
    with server.client(outsider_key) as outsider:
        resp = outsider.request(call, f"/v1/sessions/{sid}",
                                json={"ttl_seconds": 30} if call == "PATCH" else None)
        error(resp, 404, "not_found")
    assert member.get(f"/v1/sessions/{sid}").json()["live"] is True


def test_an_admin_of_the_project_does_not_see_a_members_session(
        server: ServerProcess, member: httpx.Client) -> None:
    sid = start(member)["session_id"]
    with server.client() as admin:
        error(admin.get(f"/v1/sessions/{sid}"), 404, "not_found")


def test_a_refreshed_key_keeps_its_session(server: ServerProcess) -> None:
    with server.client(str(server.create_key("member")["key"])) as first:
        sid = start(first)["session_id"]
        successor = first.post("/v1/keys/refresh", json={}).json()["key"]
    with server.client(successor) as second:
        assert second.patch(f"/v1/sessions/{sid}", json={"ttl_seconds": 30}).status_code == 200
        assert take(second, unique_name("sess"), sid).status_code == 201


def test_roles(server: ServerProcess, member: httpx.Client) -> None:
    sid = start(member)["session_id"]
    with server.client(str(server.create_key("reader")["key"])) as reader:
        error(reader.post("/v1/sessions", json={"ttl_seconds": 30}), 403, "forbidden")
        error(reader.patch(f"/v1/sessions/{sid}", json={"ttl_seconds": 30}), 403, "forbidden")
        error(reader.delete(f"/v1/sessions/{sid}"), 403, "forbidden")
        error(reader.get(f"/v1/sessions/{sid}"), 404, "not_found")  # a reader owns none
    with server.client("not-a-key") as nobody:
        for method in ("GET", "PATCH", "DELETE"):
            error(nobody.request(method, f"/v1/sessions/{sid}"), 401, "unauthorized")
        error(nobody.post("/v1/sessions", json={"ttl_seconds": 30}), 401, "unauthorized")


# --- bad input, route by route -----------------------------------------------------------

BAD_TTLS: list[Any] = [4, 3601, 0, -5, 30.5, "30", None, True, [30], {"s": 30}, 2**64]


@pytest.mark.parametrize("ttl", BAD_TTLS)
def test_create_with_a_bad_ttl_is_422(member: httpx.Client, ttl: Any) -> None:
    details = error(member.post("/v1/sessions", json={"ttl_seconds": ttl}),
                    422, "validation_error")["details"]
    assert [d["field"] for d in details] == ["ttl_seconds"]


@pytest.mark.parametrize("body,field", [
    ({}, "ttl_seconds"),
    ({"ttl": 30}, "ttl"),
    ({"ttl_seconds": 30, "name": ""}, "name"),
    ({"ttl_seconds": 30, "name": "n" * 129}, "name"),
    ({"ttl_seconds": 30, "name": 7}, "name"),
    ({"ttl_seconds": 30, "session_id": UNKNOWN_ID}, "session_id"),
])
def test_create_with_bad_fields_is_422(member: httpx.Client, body: dict[str, Any],
                                       field: str) -> None:
    details = error(member.post("/v1/sessions", json=body), 422, "validation_error")["details"]
    assert field in [d["field"] for d in details]


@pytest.mark.parametrize("raw", [b"", b"{", b"[1,", b'{"ttl_seconds": 30, "ttl_seconds": 40}',
                                 b"NaN"])
def test_create_with_a_body_that_is_no_json_object_is_400(member: httpx.Client,
                                                          raw: bytes) -> None:
    error(member.post("/v1/sessions", content=raw,
                      headers={"Content-Type": "application/json"}), 400, "invalid_request")


@pytest.mark.parametrize("raw", [b"[]", b"30", b'"x"', b"null"])
def test_create_with_a_json_non_object_is_4xx(member: httpx.Client, raw: bytes) -> None:
    resp = member.post("/v1/sessions", content=raw, headers={"Content-Type": "application/json"})
    assert resp.status_code in (400, 422), resp.text


def test_create_with_an_oversized_body_is_413(member: httpx.Client) -> None:
    error(member.post("/v1/sessions", json={"ttl_seconds": 30, "name": "n" * 70_000}),
          413, "payload_too_large")


@pytest.mark.parametrize("ttl", BAD_TTLS)
def test_renew_with_a_bad_ttl_is_422_and_changes_nothing(member: httpx.Client, ttl: Any) -> None:
    session = start(member)
    sid = session["session_id"]
    error(member.patch(f"/v1/sessions/{sid}", json={"ttl_seconds": ttl}), 422, "validation_error")
    assert member.get(f"/v1/sessions/{sid}").json()["expires_at"] == session["expires_at"]


@pytest.mark.parametrize("body", [{}, {"ttl": 30}, {"ttl_seconds": 30, "name": "x"}])
def test_renew_with_missing_or_unknown_fields_is_422(member: httpx.Client,
                                                    body: dict[str, Any]) -> None:
    sid = start(member)["session_id"]
    error(member.patch(f"/v1/sessions/{sid}", json=body), 422, "validation_error")


def test_renew_with_a_repeated_field_is_400(member: httpx.Client) -> None:
    sid = start(member)["session_id"]
    error(member.patch(f"/v1/sessions/{sid}", content=b'{"ttl_seconds": 9, "ttl_seconds": 90}',
                       headers={"Content-Type": "application/json"}), 400, "invalid_request")


WRONG_IDS = [UNKNOWN_ID, "ses_short", "slot_" + "A" * 32, "x" * 300, "ses_" + "A" * 31 + "%21",
             "%00", "ses_" + "A" * 65]


@pytest.mark.parametrize("sid", WRONG_IDS)
@pytest.mark.parametrize("method", ["GET", "PATCH", "DELETE"])
def test_a_wrong_session_id_is_404(member: httpx.Client, sid: str, method: str) -> None:
    resp = member.request(method, f"/v1/sessions/{sid}",
                          json={"ttl_seconds": 30} if method == "PATCH" else None)
    error(resp, 404, "not_found")


def test_inspect_refuses_a_query_string(member: httpx.Client) -> None:
    sid = start(member)["session_id"]
    resp = member.get(f"/v1/sessions/{sid}", params={"limit": 5})
    assert 400 <= resp.status_code < 500, resp.text


@pytest.mark.parametrize("sid", ["", "ses_", "ses_!!!!!!!!!!!!!!!!!!!!", 7, None, ["ses_x"],
                                 "ses_" + "A" * 65])
def test_a_malformed_session_id_on_acquire_is_422(member: httpx.Client, sid: Any) -> None:
    key = unique_name("sess")
    if sid is None:  # null: as if no session was given
        assert take(member, key, sid).status_code == 201
        return
    details = error(take(member, key, sid), 422, "validation_error")["details"]
    assert [d["field"] for d in details] == ["session_id"]
    assert member.get(f"/v1/locks/{key}").json()["held"] is False


def test_an_unknown_session_on_acquire_is_404(server: ServerProcess,
                                              member: httpx.Client) -> None:
    key = unique_name("sess")
    error(take(member, key, UNKNOWN_ID), 404, "not_found")
    assert member.get(f"/v1/locks/{key}").json()["held"] is False
    pool = unique_name("sesspool")
    with server.client() as admin:
        admin.put(f"/v1/pools/{pool}", json={"limit": 1})
    error(member.post(f"/v1/pools/{pool}/lock/acquire", json={"session_id": UNKNOWN_ID}),
          404, "not_found")
    error(member.post(f"/v1/pools/{pool}/lock/acquire", json={"session_id": "ses_!"}),
          422, "validation_error")
    assert member.get(f"/v1/pools/{pool}").json()["in_use"] == 0


def test_a_lease_without_ttl_is_422_even_with_a_session(member: httpx.Client) -> None:
    sid = start(member)["session_id"]
    resp = member.put(f"/v1/locks/{unique_name('sess')}/lease", headers=lock_headers(new_token()),
                      json={"session_id": sid})
    details = error(resp, 422, "validation_error")["details"]
    assert [d["field"] for d in details] == ["ttl_seconds"]


def test_a_keep_lease_cannot_follow_a_session(member: httpx.Client) -> None:
    sid = start(member)["session_id"]
    key = unique_name("sess")
    details = error(take(member, key, sid, on_expiry="keep"), 422, "validation_error")["details"]
    assert [d["field"] for d in details] == ["on_expiry"]
    assert member.get(f"/v1/locks/{key}").json()["held"] is False


def test_a_ttl_given_with_a_session_is_checked_and_unused(member: httpx.Client) -> None:
    session = start(member)
    key = unique_name("sess")
    error(take(member, key, session["session_id"], ttl_seconds=4), 422, "validation_error")
    resp = take(member, key, session["session_id"], ttl_seconds=3600)
    assert resp.status_code == 201 and resp.json()["expires_at"] == session["expires_at"]


# --- what operators see ---------------------------------------------------------------------


def test_metrics_count_sessions(server: ServerProcess, member: httpx.Client) -> None:
    started = metric(server, "fencepost_sessions_total", action="started", reason="")
    ended = metric(server, "fencepost_sessions_total", action="ended", reason="session_ended")
    sid = start(member)["session_id"]
    assert metric(server, "fencepost_sessions_live") >= 1
    assert metric(server, "fencepost_sessions_total", action="started", reason="") \
        == started + 1
    key = unique_name("sess")
    take(member, key, sid)
    before = metric(server, "fencepost_leases_ended_total", kind="lock", reason="session_ended")
    member.delete(f"/v1/sessions/{sid}")
    assert metric(server, "fencepost_sessions_total", action="ended",
                  reason="session_ended") == ended + 1
    assert metric(server, "fencepost_leases_ended_total", kind="lock",
                  reason="session_ended") == before + 1


def test_the_session_id_is_never_logged(server: ServerProcess, member: httpx.Client) -> None:
    sid = start(member)["session_id"]
    take(member, unique_name("sess"), sid)
    member.delete(f"/v1/sessions/{sid}")
    for path in (server.access_log, server.stdout_path, server.stderr_path):
        if path.exists():
            assert sid not in path.read_text()


def test_the_event_log_tells_a_sessions_start_and_end(server: ServerProcess,
                                                      member: httpx.Client) -> None:
    started, ended = new_token(), new_token()
    sid = member.post("/v1/sessions", json={"ttl_seconds": 30},
                      headers={"X-Request-Id": started}).json()["session_id"]
    take(member, unique_name("sess"), sid)
    member.delete(f"/v1/sessions/{sid}", headers={"X-Request-Id": ended})

    def events() -> dict[str, dict[str, Any]]:
        found = {}
        for line in server.stderr_path.read_text().splitlines():
            if line.startswith("{") and (started in line or ended in line):
                event = json.loads(line)
                found[event["event"]] = event
        return found

    deadline = time.monotonic() + 10
    while set(events()) < {"session.started", "session.ended", "lease.session_ended"}:
        assert time.monotonic() < deadline, events()
        time.sleep(0.05)
    seen = events()
    assert seen["session.ended"]["reason"] == "session_ended"
    assert (seen["session.ended"]["leases"], seen["session.ended"]["slots"]) == (1, 0)
    assert seen["session.started"]["request_id"] == started
    assert sid not in server.stderr_path.read_text()
