"""Sessions (SPEC §3.10) across replicas of one PostgreSQL store: any replica
serves any session, a `kill -9` of a replica keeps sessions and their leases
exactly as acknowledged, and a surviving replica frees an expired session's
leases and slots within 1 s."""

from __future__ import annotations

import time
from typing import Any, Callable

import httpx

from support import ServerProcess, lock_headers, metric, new_token, parse_at, unique_name


def reaped_by(server: ServerProcess) -> float:
    """Leases this replica's reaper ended with their session."""
    return metric(server, "fencepost_leases_ended_total", kind="lock", reason="session_expired")


def attach(c: httpx.Client, key: str, session_id: str) -> dict[str, Any]:
    resp = c.put(f"/v1/locks/{key}/lease", headers=lock_headers(new_token()),
                 json={"ttl_seconds": 30, "session_id": session_id})
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


def test_a_session_spans_replicas_and_survives_one_killed(
        start_replica: Callable[..., ServerProcess]) -> None:
    a, b = start_replica("a"), start_replica("b")
    key = str(a.create_key("member", name="spanning")["key"])
    first, second = unique_name("span"), unique_name("span")
    pool = unique_name("spanpool")
    with a.client() as admin:
        admin.put(f"/v1/pools/{pool}", json={"limit": 2, "request_timeout_ms": 3_600_000})
    with a.client(key) as on_a, b.client(key) as on_b:
        session = on_a.post("/v1/sessions", json={"ttl_seconds": 600}).json()
        sid = session["session_id"]
        grant = attach(on_a, first, sid)
        attach(on_b, second, sid)
        assert on_b.post(f"/v1/pools/{pool}/lock/acquire",
                         json={"session_id": sid}).status_code == 200
        renewed = on_b.patch(f"/v1/sessions/{sid}", json={"ttl_seconds": 900}).json()
        assert on_a.get(f"/v1/locks/{first}").json()["expires_at"] == renewed["expires_at"]
    a.kill9()
    with b.client(key) as on_b:
        state = on_b.get(f"/v1/sessions/{sid}").json()
        assert state["live"] and state["expires_at"] == renewed["expires_at"]
        assert (state["keys"], state["slots"]) == (sorted([first, second]), 1)
        lock = on_b.get(f"/v1/locks/{first}").json()
        assert lock["fencing_token"] == grant["fencing_token"]
        assert lock["expires_at"] == renewed["expires_at"]
        assert on_b.delete(f"/v1/sessions/{sid}").json() == {
            "ended": True, "leases": 2, "slots": 1}
        assert on_b.get(f"/v1/locks/{first}").json()["held"] is False


def test_a_surviving_replica_frees_an_expired_session(
        start_replica: Callable[..., ServerProcess]) -> None:
    a, b = start_replica("a"), start_replica("b")
    key = str(a.create_key("member", name="orphan")["key"])
    locks = [unique_name("orphan") for _ in range(3)]
    with a.client(key) as on_a:
        sid = on_a.post("/v1/sessions", json={"ttl_seconds": 5}).json()["session_id"]
        for lock in locks:
            attach(on_a, lock, sid)
        expires = parse_at(on_a.get(f"/v1/sessions/{sid}").json()["expires_at"]).timestamp()
    before = reaped_by(b)
    a.kill9()  # the holder's replica is gone; nobody renews or asks
    time.sleep(max(0.0, expires - time.time()) + 1.2)
    assert reaped_by(b) == before + len(locks)
    with b.client(key) as on_b:
        assert on_b.get(f"/v1/sessions/{sid}").json()["ended"] == "session_expired"
        late = on_b.patch(f"/v1/sessions/{sid}", json={"ttl_seconds": 5})
        assert late.status_code == 409 and late.json()["error"]["reason"] == "session_expired"
        for lock in locks:
            assert on_b.get(f"/v1/locks/{lock}").json()["held"] is False
