"""SPEC §3.1 waiting (fair FIFO line, wake-ups, disconnects) and the expiry reaper."""

from __future__ import annotations

import itertools
import json
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from fencepost.server.waiting import REFRESH_AFTER_S
from lock_support import acquire, release, renew
from support import (
    WAKE_UPS_ONLY,
    ServerProcess,
    assert_error,
    lock_headers,
    new_token,
    parse_at,
    unique_name,
    wait_for,
    wait_parked,
    wait_until,
    waited_ms,
)


def waiters(c: httpx.Client, key: str) -> int:
    return int(c.get(f"/v1/locks/{key}").json()["waiters"])


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


@dataclass
class Waiter:
    name: str
    token: str
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    thread: threading.Thread | None = None
    response: httpx.Response | None = None
    error: BaseException | None = None
    started_at: float = 0.0
    done_at: float = 0.0
    released_at: float = 0.0

    def join(self, timeout: float = 60.0) -> httpx.Response:
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.name} still waiting"
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return self.response


def start_waiter(
    server: ServerProcess, api_key: str, key: str, name: str, wait_seconds: float,
    ttl: int = 30, on_grant: Callable[[httpx.Client, Waiter], None] | None = None,
) -> Waiter:
    waiter = Waiter(name=name, token=new_token())

    def run() -> None:
        try:
            with server.client(api_key) as c:
                waiter.started_at = time.monotonic()
                waiter.response = acquire(c, key, waiter.token, ttl=ttl,
                                          request_id=waiter.request_id,
                                          wait_seconds=wait_seconds)
                waiter.done_at = time.monotonic()
                if on_grant is not None and waiter.response.status_code == 201:
                    on_grant(c, waiter)
        except Exception as exc:  # surfaced by join()
            waiter.error = exc

    waiter.thread = threading.Thread(target=run, name=name, daemon=True)
    waiter.thread.start()
    return waiter


class Hammer:
    """Threads sending fail-fast acquires with one token until stopped."""

    def __init__(self, server: ServerProcess, api_key: str, key: str, threads: int = 4) -> None:
        self.token = new_token()
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()

        def run() -> None:
            with server.client(api_key) as c:
                while not self._stop.is_set():
                    code = acquire(c, key, self.token, ttl=60).status_code
                    with self._lock:
                        self.statuses.append(code)

        self._threads = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
        for t in self._threads:
            t.start()

    def stop(self) -> list[int]:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        return list(self.statuses)


# --- fairness ----------------------------------------------------------------------------------


def test_waiters_are_granted_in_arrival_order(
    server: ServerProcess, member_key: str, member: httpx.Client,
) -> None:
    key, holder = unique_name("fifo"), new_token()
    first = acquire(member, key, holder, ttl=60)
    assert first.status_code == 201
    order: list[str] = []
    order_lock = threading.Lock()

    def on_grant(c: httpx.Client, w: Waiter) -> None:
        with order_lock:
            order.append(w.name)
        time.sleep(0.2)
        w.released_at = time.monotonic()
        assert release(c, key, w.token).json() == {"released": True}

    line: list[Waiter] = []
    for i, name in enumerate(("w1", "w2", "w3"), start=1):
        line.append(start_waiter(server, member_key, key, name, wait_seconds=30,
                                 on_grant=on_grant))
        assert wait_for(lambda n=i: waiters(member, key) == n), f"{name} never got in line"
        time.sleep(0.05)

    assert member.get(f"/v1/locks/{key}").json()["waiters"] == 3
    assert release(member, key, holder).json() == {"released": True}
    responses = [w.join() for w in line]

    for r in responses:
        assert r.status_code == 201, r.text
    assert order == ["w1", "w2", "w3"]
    tokens = [first.json()["fencing_token"]] + [r.json()["fencing_token"] for r in responses]
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    # Mutual exclusion: each waiter was granted only after the one before it released.
    for before, after in itertools.pairwise(line):
        assert after.done_at >= before.released_at
    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is False
    assert state["waiters"] == 0


def test_waiter_is_woken_by_the_release(wake_server: ServerProcess) -> None:
    """The release wakes the parked waiter (SPEC §3.1). The server has no
    safety wake (WAKE_UPS_ONLY): without the wake-up the waiter would wait its
    whole wait, granted only by its last try at the end of it."""
    key, holder = unique_name("prompt"), new_token()
    with wake_server.client() as member:
        first = acquire(member, key, holder, ttl=60)
        assert first.status_code == 201
        w = start_waiter(wake_server, wake_server.admin_key, key, "w", wait_seconds=30)
        assert wait_for(lambda: waiters(member, key) == 1)
        wait_parked(wake_server, 1)

        assert release(member, key, holder).json() == {"released": True}
        resp = w.join()
        assert resp.status_code == 201, resp.text
        assert waited_ms(wake_server, w.request_id) < 30_000  # woken, not at the end of its wait
        body = resp.json()
        assert body["fencing_token"] > first.json()["fencing_token"]
        assert body["key"] == key
        assert parse_at(body["acquired_at"]) >= parse_at(first.json()["acquired_at"])
        state = member.get(f"/v1/locks/{key}").json()
        assert state["held"] is True
        assert state["fencing_token"] == body["fencing_token"]
        assert state["waiters"] == 0


def test_fail_fast_acquire_does_not_jump_ahead_of_a_waiter(
    server: ServerProcess, member_key: str, member: httpx.Client,
) -> None:
    key, holder = unique_name("jump"), new_token()
    assert acquire(member, key, holder, ttl=60).status_code == 201
    w = start_waiter(server, member_key, key, "w", wait_seconds=10)
    assert wait_for(lambda: waiters(member, key) == 1)

    # While held, the fail-fast caller is simply refused.
    assert_error(acquire(member, key, new_token()), 409, "lock_held")

    # Hammer fail-fast acquires across the moment the lock is released: none may win.
    hammer = Hammer(server, member_key, key)
    time.sleep(0.2)
    assert release(member, key, holder).json() == {"released": True}
    resp = w.join(timeout=30)
    time.sleep(0.1)
    statuses = hammer.stop()

    assert resp.status_code == 201, resp.text
    assert statuses, "hammer threads sent nothing"
    assert set(statuses) == {409}, sorted(set(statuses))
    assert member.get(f"/v1/locks/{key}").json()["fencing_token"] == resp.json()["fencing_token"]


def test_second_waiter_keeps_its_place_while_the_first_holds(
    server: ServerProcess, member_key: str, member: httpx.Client,
) -> None:
    key, holder = unique_name("line"), new_token()
    assert acquire(member, key, holder, ttl=60).status_code == 201
    w = start_waiter(server, member_key, key, "w", wait_seconds=30)
    assert wait_for(lambda: waiters(member, key) == 1)
    late = start_waiter(server, member_key, key, "late", wait_seconds=30)
    assert wait_for(lambda: waiters(member, key) == 2)

    assert release(member, key, holder).json() == {"released": True}
    first = w.join()
    assert first.status_code == 201, first.text
    assert waiters(member, key) == 1
    assert_error(acquire(member, key, new_token()), 409, "lock_held")
    assert release(member, key, w.token).json() == {"released": True}
    second = late.join()
    assert second.status_code == 201, second.text
    assert second.json()["fencing_token"] > first.json()["fencing_token"]
    assert waiters(member, key) == 0


def test_waiting_for_a_free_lock_is_granted_at_once(wake_server: ServerProcess) -> None:
    """Granted at its first try: on a server without the safety wake, an
    acquire of a free lock that went to wait in line would wait its whole wait
    (nobody releases anything to wake it)."""
    rid = str(uuid.uuid4())
    with wake_server.client() as member:
        resp = acquire(member, unique_name(), new_token(), ttl=30, request_id=rid,
                       wait_seconds=30)
    assert resp.status_code == 201, resp.text
    assert waited_ms(wake_server, rid) < 30_000


def test_wait_timeout_is_409_lock_held(
    server: ServerProcess, member_key: str, member: httpx.Client,
) -> None:
    key = unique_name("timeout")
    assert acquire(member, key, new_token(), ttl=60, operation="deploy").status_code == 201
    rid = str(uuid.uuid4())
    resp = acquire(member, key, new_token(), ttl=30, request_id=rid, wait_seconds=1)
    err = assert_error(resp, 409, "lock_held")
    # The server's own measure of the wait (its clock, not the test's): the
    # whole second, and (SPEC §3.1's bound on a wait, with room for a loaded
    # machine) not much more.
    waited = waited_ms(server, rid)
    assert 1000 <= waited < 10_000, waited
    assert err["operation"] == "deploy"
    assert isinstance(err["expires_in_ms"], int) and 0 < err["expires_in_ms"] <= 60_000
    assert "retry-after" in resp.headers
    assert waiters(member, key) == 0


# --- disconnects -------------------------------------------------------------------------------


def park_raw_waiter(
    server: ServerProcess, api_key: str, key: str, token: str, request_id: str,
    wait_seconds: float = 30, ttl: int = 60,
) -> socket.socket:
    body = json.dumps({"ttl_seconds": ttl, "wait_seconds": wait_seconds}).encode()
    head = (
        f"PUT /v1/locks/{key}/lease HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {api_key}\r\n"
        f"X-Lock-Token: {token}\r\n"
        f"X-Request-Id: {request_id}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(head + body)
    return sock


def hang_up(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def test_disconnected_waiter_is_never_granted(
    server: ServerProcess, member_key: str, member: httpx.Client,
) -> None:
    key, holder = unique_name("gone"), new_token()
    assert acquire(member, key, holder, ttl=60).status_code == 201
    ghost, ghost_rid = new_token(), str(uuid.uuid4())
    sock = park_raw_waiter(server, member_key, key, ghost, ghost_rid, ttl=60)
    assert wait_for(lambda: waiters(member, key) == 1), "raw waiter never got in line"
    hang_up(sock)
    time.sleep(0.3)

    assert release(member, key, holder).json() == {"released": True}
    # The lock ends up free: nobody (least of all the ghost) holds it. A ghost
    # woken before the server saw it leave hands its grant straight back; one
    # that kept it would hold the lock for its whole 60 s TTL, far beyond this
    # wait.
    wait_until(lambda: member.get(f"/v1/locks/{key}").json()["held"] is False,
               "the lock to be free", timeout=30)
    time.sleep(0.3)
    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is False, state
    assert state["waiters"] == 0
    renew = member.patch(f"/v1/locks/{key}/lease", headers=lock_headers(ghost),
                         json={"ttl_seconds": 30})
    assert_error(renew, 409, "lease_lost")
    # No phantom waiter blocks a fail-fast newcomer.
    newcomer = acquire(member, key, new_token(), ttl=30)
    assert newcomer.status_code == 201, newcomer.text

    def ghost_entries() -> list[dict[str, Any]]:
        return [e for e in server.access_log_lines()
                if e.get("event") == "lock.acquire" and e.get("request_id") == ghost_rid]

    entries = wait_for(ghost_entries, timeout=30)
    assert entries, "no access log entry for the disconnected waiter"
    assert [e["outcome"] for e in entries] == ["disconnected"], entries


def test_disconnected_waiter_is_skipped_for_the_next_in_line(
    server: ServerProcess, member_key: str, member: httpx.Client,
) -> None:
    key, holder = unique_name("skip"), new_token()
    first = acquire(member, key, holder, ttl=60)
    assert first.status_code == 201
    ghost = new_token()
    sock = park_raw_waiter(server, member_key, key, ghost, str(uuid.uuid4()), ttl=60)
    assert wait_for(lambda: waiters(member, key) == 1), "raw waiter never got in line"
    # If the ghost were granted its 60 s lease, this waiter would time out.
    later = start_waiter(server, member_key, key, "later", wait_seconds=10)
    assert wait_for(lambda: waiters(member, key) == 2)
    hang_up(sock)
    time.sleep(0.3)

    assert release(member, key, holder).json() == {"released": True}
    resp = later.join(timeout=30)
    assert resp.status_code == 201, resp.text
    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is True
    assert state["fencing_token"] == resp.json()["fencing_token"]
    assert state["waiters"] == 0
    assert release(member, key, ghost).json() == {"released": False}
    assert release(member, key, later.token).json() == {"released": True}


# --- expiry, force release, reaper -------------------------------------------------------------


def test_expiry_wakes_a_waiter_but_not_before_expires_at(wake_server: ServerProcess) -> None:
    """The reaper's expiry of the lease wakes the waiter (the server has no
    safety wake: without that wake-up the waiter would wait its whole wait)."""
    key = unique_name("expiry")
    api_key = wake_server.admin_key
    with wake_server.client() as member:
        sent = time.monotonic()
        holder = acquire(member, key, new_token(), ttl=5)
        assert holder.status_code == 201
        w = start_waiter(wake_server, api_key, key, "w", wait_seconds=15)
        assert wait_for(lambda: waiters(member, key) == 1)
        # Fail-fast callers hammering across the expiry must not take the lock from the waiter.
        sleep_until(sent + 4.5)
        hammer = Hammer(wake_server, api_key, key)
        resp = w.join(timeout=30)
        time.sleep(0.1)
        statuses = hammer.stop()
    assert resp.status_code == 201, resp.text
    assert statuses and set(statuses) == {409}, sorted(set(statuses))
    # Mutual exclusion: not granted before the holder's lease ended ...
    assert w.done_at - sent >= 5.0
    assert parse_at(resp.json()["acquired_at"]) >= parse_at(holder.json()["expires_at"])
    # ... and woken by the expiry itself, not at the end of its own 15 s wait.
    assert waited_ms(wake_server, w.request_id) < 15_000
    assert resp.json()["fencing_token"] > holder.json()["fencing_token"]


def test_the_first_waiter_is_granted_at_the_expiry_not_at_the_next_reap(
    reaperless_server: ServerProcess,
) -> None:
    """An expired lease frees its lock at its expiry, with no event (SPEC
    §3.1: a waiter is granted within 100 ms of expiry): the line's first
    waiter re-checks then. The holder's renewal moves the expiry, and the
    waiter follows it. This server neither reaps nor wakes for safety: the
    waiter's own re-check is the only way in before its 30 s run out."""
    server = reaperless_server
    key, token = unique_name("expires"), new_token()
    with server.client() as member:
        holder = acquire(member, key, token, ttl=5)
        assert holder.status_code == 201
        w = start_waiter(server, server.admin_key, key, "w", wait_seconds=30)
        assert wait_for(lambda: waiters(member, key) == 1)
        wait_parked(server, 1)
        renewed = renew(member, key, token, 5)
        assert renewed.status_code == 200, renewed.text
    resp = w.join(timeout=40)
    assert resp.status_code == 201, resp.text
    assert waited_ms(server, w.request_id) < 30_000  # re-checked at the expiry
    # Never before the renewed lease's end (mutual exclusion), and a new token.
    assert parse_at(resp.json()["acquired_at"]) >= parse_at(renewed.json()["expires_at"])
    assert resp.json()["fencing_token"] > holder.json()["fencing_token"]


def test_expiry_of_a_keep_lease_does_not_wake_waiters(
    server: ServerProcess, member_key: str, member: httpx.Client,
) -> None:
    key = unique_name("keep")
    holder = acquire(member, key, new_token(), ttl=5, on_expiry="keep", operation="slow")
    assert holder.status_code == 201
    resp = acquire(member, key, new_token(), ttl=30, wait_seconds=7)
    err = assert_error(resp, 409, "lock_held")
    assert err["operation"] == "slow"
    assert err["expires_in_ms"] < 0
    assert "retry-after" not in resp.headers
    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is True
    assert state["overdue"] is True
    assert state["fencing_token"] == holder.json()["fencing_token"]


def test_force_release_wakes_a_waiter(wake_server: ServerProcess) -> None:
    """(The server has no safety wake: without the wake-up the waiter would
    wait its whole wait.)"""
    key = unique_name("forced")
    with wake_server.client() as admin:
        holder = acquire(admin, key, new_token(), ttl=60)
        assert holder.status_code == 201
        w = start_waiter(wake_server, wake_server.admin_key, key, "w", wait_seconds=30)
        assert wait_for(lambda: waiters(admin, key) == 1)
        wait_parked(wake_server, 1)
        assert admin.delete(f"/v1/locks/{key}").json()["released"] is True
    resp = w.join()
    assert resp.status_code == 201, resp.text
    assert waited_ms(wake_server, w.request_id) < 30_000  # woken, not at the end of its wait
    assert resp.json()["fencing_token"] > holder.json()["fencing_token"]


def test_reaper_frees_an_expired_release_lease_nobody_touches(member: httpx.Client) -> None:
    prefix = unique_name("reap") + "."
    key = prefix + "k"
    grant = acquire(member, key, new_token(), ttl=5)
    # SPEC §3.1: freed within 1 s of expires_at. The server granted before its
    # answer came, so the lease expired by `answered` + 5 s: count from there,
    # not from when the request was sent (a slow grant moves expires_at too).
    answered = time.monotonic()
    assert grant.status_code == 201
    sleep_until(answered + 5 + 1.2)
    listed = member.get("/v1/locks", params={"prefix": prefix}).json()
    assert listed["locks"] == []
    state = member.get(f"/v1/locks/{key}").json()
    assert state["held"] is False, state
    nxt = acquire(member, key, new_token())
    assert nxt.status_code == 201
    assert nxt.json()["fencing_token"] > grant.json()["fencing_token"]


def test_a_waiter_whose_place_the_store_dropped_rejoins_the_line(tmp_path) -> None:
    """A parked waiter whose place the store no longer has (the reaper drops
    a place that ran out, as happened to thousands of waiters arriving at
    once) is found by the sweep's next refresh and rejoins at the back,
    instead of waiting on a ticket nobody will grant. No safety wake here:
    only the sweep can find it."""
    server = ServerProcess(
        tmp_path / "dropped", extra_env={**WAKE_UPS_ONLY, "FENCEPOST_SWEEP_S": "0.5"}).start()
    try:
        with server.client() as c:
            key, holder = unique_name("dropped"), new_token()
            assert acquire(c, key, holder, ttl=60).status_code == 201
            first = start_waiter(server, server.admin_key, key, "first", wait_seconds=60)
            assert wait_for(lambda: waiters(c, key) == 1), "first never got in line"
            second = start_waiter(server, server.admin_key, key, "second", wait_seconds=60)
            assert wait_for(lambda: waiters(c, key) == 2), "second never got in line"
            with sqlite3.connect(server.db_path) as db:  # the second's place is dropped
                db.execute(
                    "DELETE FROM lock_waiters WHERE ticket = "
                    "(SELECT max(ticket) FROM lock_waiters WHERE key = ?)", (key,))
            assert waiters(c, key) == 1
            # Its place is refreshed once no retry did for REFRESH_AFTER_S.
            assert wait_for(lambda: waiters(c, key) == 2, timeout=REFRESH_AFTER_S + 10), \
                "the waiter whose place was dropped never rejoined"
            assert release(c, key, holder).json() == {"released": True}
            granted = first.join()
            assert granted.status_code == 201, granted.text
            assert release(c, key, first.token).json() == {"released": True}
            assert second.join().status_code == 201
    finally:
        server.stop()
