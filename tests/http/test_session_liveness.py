"""SPEC §3.10 with §7.3 and §7.4: a session whose holder is paused (SIGSTOP)
past its TTL frees everything attached within 1 s of its expiry, and the
holder's late renewals get `409 session_lost`; a `kill -9` of the server keeps
sessions and their leases exactly as acknowledged."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support import ServerProcess, lock_headers, metric, new_token, parse_at, track, unique_name

SESSION_TTL = 5
# What the holder runs: a session with several locks and a slot, then it waits
# for the loss and reports it (one JSON line per step on standard output).
HOLDER = """
import json, sys
import fencepost

url, key, ttl, pool, *keys = sys.argv[1:]
with fencepost.Client(url, key) as client:
    with client.session(ttl=int(ttl), raise_on_loss=False) as session:
        with session.lock_many(keys) as locks, session.slot(pool):
            print(json.dumps({"session_id": session.session_id,
                              "tokens": locks.fencing_tokens}), flush=True)
            session.lost_event.wait(120)
            error = session.loss.error
            print(json.dumps({"reason": session.loss.reason,
                              "code": None if error is None else error.code,
                              "locks_lost": locks.lost}), flush=True)
"""


def read_line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip():
            return dict(json.loads(line))
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    raise AssertionError("the holder said nothing in time")


def test_a_paused_holder_loses_its_session_and_everything_attached(
        fresh_server: ServerProcess, tmp_path: Path) -> None:
    srv = fresh_server
    key = str(srv.create_key("member", name="paused-holder")["key"])
    pool = unique_name("pausepool")
    keys = sorted(unique_name("paused") for _ in range(3))
    with srv.client() as admin:
        assert admin.put(f"/v1/pools/{pool}", json={
            "limit": 1, "request_timeout_ms": 3_600_000}).status_code == 201
    holder = track(subprocess.Popen(
        [sys.executable, "-c", HOLDER, srv.base_url, key, str(SESSION_TTL), pool, *keys],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ))
    try:
        held = read_line(holder, 30)
        sid = held["session_id"]
        with srv.client(key) as mine, srv.client() as admin:
            # Alive and renewed while the holder runs (it renews every third of
            # the TTL): watched until a renewal shows, the session live all along.
            first = mine.get(f"/v1/sessions/{sid}").json()
            deadline = time.monotonic() + 3 * SESSION_TTL
            while True:
                now = mine.get(f"/v1/sessions/{sid}").json()
                assert now["live"], f"the session ended while its holder ran: {now}"
                if now["expires_at"] > first["expires_at"]:
                    break
                assert time.monotonic() < deadline, f"never renewed: {first} {now}"
                time.sleep(0.2)
            ended_before = metric(srv, "fencepost_leases_ended_total", kind="lock",
                                  reason="session_expired")
            holder.send_signal(signal.SIGSTOP)
            expires = parse_at(mine.get(f"/v1/sessions/{sid}").json()["expires_at"]).timestamp()
            # Within 1 s of the session's expiry the reaper has ended it all,
            # with nobody asking (0.2 s for this test's own requests).
            time.sleep(max(0.0, expires - time.time()) + 1.2)
            assert metric(srv, "fencepost_leases_ended_total", kind="lock",
                          reason="session_expired") == ended_before + len(keys)
            state = mine.get(f"/v1/sessions/{sid}").json()
            assert (state["live"], state["ended"], state["leases"]) == (
                False, "session_expired", 0)
            for lock in keys:
                assert admin.get(f"/v1/locks/{lock}").json()["held"] is False
                taken = admin.put(f"/v1/locks/{lock}/lease", headers=lock_headers(new_token()),
                                  json={"ttl_seconds": 30})
                assert taken.status_code == 201
                assert taken.json()["fencing_token"] > held["tokens"][lock]
            assert admin.get(f"/v1/pools/{pool}").json()["in_use"] == 0
            # A late renewal, as the holder's will be.
            late = mine.patch(f"/v1/sessions/{sid}", json={"ttl_seconds": SESSION_TTL})
            assert late.status_code == 409 and late.json()["error"]["code"] == "session_lost"
            assert late.json()["error"]["reason"] == "session_expired"
        holder.send_signal(signal.SIGCONT)
        lost = read_line(holder, 30)
        assert lost == {"reason": "session_expired", "code": "session_lost", "locks_lost": True}
        assert holder.wait(timeout=30) == 0
    finally:
        if holder.poll() is None:
            holder.send_signal(signal.SIGCONT)
            holder.kill()
            holder.wait(timeout=10)


def test_sessions_and_their_leases_survive_kill9_as_acknowledged(
        fresh_server: ServerProcess) -> None:
    srv = fresh_server
    key = str(srv.create_key("member", name="durable")["key"])
    kept, ended = unique_name("kept"), unique_name("gone")
    with srv.client(key) as c:
        live = c.post("/v1/sessions", json={"ttl_seconds": 600, "name": "durable"}).json()
        done = c.post("/v1/sessions", json={"ttl_seconds": 600}).json()
        grant = c.put(f"/v1/locks/{kept}/lease", headers=lock_headers(new_token()),
                      json={"ttl_seconds": 30, "session_id": live["session_id"]}).json()
        c.put(f"/v1/locks/{ended}/lease", headers=lock_headers(new_token()),
              json={"ttl_seconds": 30, "session_id": done["session_id"]})
        renewed = c.patch(f"/v1/sessions/{live['session_id']}", json={"ttl_seconds": 1200})
        assert renewed.status_code == 200
        assert c.delete(f"/v1/sessions/{done['session_id']}").json()["ended"] is True
    srv.kill9()
    srv.start()
    with srv.client(key) as c:
        state = c.get(f"/v1/sessions/{live['session_id']}").json()
        assert (state["live"], state["name"], state["keys"]) == (True, "durable", [kept])
        assert state["expires_at"] == renewed.json()["expires_at"]
        lock = c.get(f"/v1/locks/{kept}").json()
        assert lock["held"] and lock["fencing_token"] == grant["fencing_token"]
        assert lock["expires_at"] == renewed.json()["expires_at"]
        gone = c.get(f"/v1/sessions/{done['session_id']}").json()
        assert (gone["live"], gone["ended"]) == (False, "session_ended")
        assert c.get(f"/v1/locks/{ended}").json()["held"] is False
        again = c.patch(f"/v1/sessions/{live['session_id']}", json={"ttl_seconds": 60})
        assert again.status_code == 200
        assert c.get(f"/v1/locks/{kept}").json()["expires_at"] == again.json()["expires_at"]
