"""One source must not take the service from everyone (SPEC §7.7): connections
per source address are capped, a connection that has not sent a whole request
head within 10 s is closed, and at the connection cap the idlest connection
makes room for a new one. Against a real `fencepost serve` over real sockets;
the attacker's connections come from 127.0.0.2, the caller's from 127.0.0.1
(both are this machine's loopback)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

from support import ServerProcess

ATTACKER = "127.0.0.2"
GUARD_S = 30.0


def _open_from(source: str, port: int) -> socket.socket | None:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(5)
    try:
        sock.connect(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed (or refused) it: readable with no request sent."""
    sock.setblocking(False)
    try:
        data = sock.recv(65536)
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)
    return data == b"" or data.startswith(b"HTTP/1.1 503")


class Flood:
    """Up to `count` idle connections kept open from ATTACKER, a new one opened
    for each the server closes or refuses; `held` is the sockets open now (the
    refused among them until the next look)."""

    def __init__(self, port: int, count: int, seconds: float) -> None:
        self.held: list[socket.socket] = []
        self._port = port
        self._count = count
        self._seconds = seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        deadline = time.monotonic() + self._seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            for sock in [s for s in self.held if _closed_by_server(s)]:
                self.held.remove(sock)
                sock.close()
            while len(self.held) < self._count and not self._stop.is_set():
                sock = _open_from(ATTACKER, self._port)
                if sock is None:
                    break
                self.held.append(sock)
            time.sleep(0.05)

    def stop_opening(self) -> None:
        self._stop.set()
        self._thread.join(timeout=GUARD_S)


@contextlib.contextmanager
def flood(port: int, count: int, seconds: float) -> Iterator[Flood]:
    attack = Flood(port, count, seconds)
    try:
        yield attack
    finally:
        attack.stop_opening()
        for sock in attack.held:
            sock.close()


def _served(server: ServerProcess) -> bool:
    """One request on a connection of its own, as a new caller's."""
    try:
        resp = httpx.get(f"{server.base_url}/v1/whoami", timeout=10,
                         headers={"Authorization": f"Bearer {server.admin_key}",
                                  "Connection": "close"})
    except httpx.HTTPError:
        return False
    return resp.status_code == 200


def test_one_source_holding_idle_connections_leaves_room_for_others(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "s", extra_args=[
        "--max-connections", "200", "--max-connections-per-source", "50"]).start()
    try:
        with flood(server.port, 400, seconds=20) as attacker:
            time.sleep(1.0)  # the flood at its height
            served = 0
            for _ in range(90):
                served += _served(server)
                time.sleep(0.03)
            # What the server lets it keep: counted once the attacker stops
            # opening more and the server has answered the last it opened (a
            # connection still in the kernel's accept queue is not held yet).
            attacker.stop_opening()
            time.sleep(0.5)
            held = sum(1 for sock in attacker.held if not _closed_by_server(sock))
        print(f"\nflood: the attacker held {held} connections; {served} of 90 served")
        assert served >= 81, f"only {served} of 90 requests served during the flood"
        assert held <= 50
    finally:
        server.stop()


def test_at_the_cap_the_idlest_connection_makes_room(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "s", extra_args=[
        "--max-connections", "10", "--max-connections-per-source", "0"]).start()
    try:
        idle = [_open_from(ATTACKER, server.port)]
        time.sleep(0.3)  # the first is the idlest by a clear margin
        idle += [_open_from(ATTACKER, server.port) for _ in range(9)]
        assert all(sock is not None for sock in idle)
        time.sleep(0.3)
        assert _served(server), "a new caller was refused while idle connections held the cap"
        deadline = time.monotonic() + 5
        while not any(_closed_by_server(s) for s in idle if s is not None):
            assert time.monotonic() < deadline, "no idle connection was closed to make room"
            time.sleep(0.05)
        assert _closed_by_server(idle[0]) if idle[0] is not None else False  # the idlest
        for sock in idle:
            if sock is not None:
                sock.close()
    finally:
        server.stop()


def test_when_every_connection_is_busy_newcomers_get_503(tmp_path: Path) -> None:
    """Waiters in line are never closed to make room: at the cap with none idle,
    a new connection is answered 503 too_many_connections."""
    server = ServerProcess(tmp_path / "s", extra_args=[
        "--max-connections", "4", "--max-connections-per-source", "0"]).start()
    try:
        with server.client() as c:
            holder = str(uuid.uuid4())
            assert c.put("/v1/locks/busy/lease", json={"ttl_seconds": 60}, headers={
                "X-Lock-Token": holder, "X-Request-Id": str(uuid.uuid4())}).status_code == 201
        body = b'{"ttl_seconds": 30, "wait_seconds": 25}'
        waiters = []
        for _ in range(4):
            sock = _open_from(ATTACKER, server.port)
            assert sock is not None
            sock.sendall(
                f"PUT /v1/locks/busy/lease HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {server.admin_key}\r\n"
                f"X-Lock-Token: {uuid.uuid4()}\r\nX-Request-Id: {uuid.uuid4()}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                .encode() + body)
            waiters.append(sock)
        deadline = time.monotonic() + GUARD_S
        while True:
            with httpx.Client(base_url=server.base_url, timeout=10) as probe:
                try:
                    refused = probe.get("/healthz")
                except httpx.HTTPError:
                    refused = None
            if refused is not None and refused.status_code == 503:
                break
            assert time.monotonic() < deadline, "the waiters never filled the cap"
            time.sleep(0.1)
        assert refused.json()["error"]["code"] == "too_many_connections"
        assert not any(_closed_by_server(sock) for sock in waiters)
        for sock in waiters:
            sock.close()
    finally:
        server.stop()


def test_a_connection_that_sends_no_whole_head_is_closed(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "s").start()
    try:
        silent = _open_from("127.0.0.1", server.port)
        partial = _open_from("127.0.0.1", server.port)
        assert silent is not None and partial is not None
        partial.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        started = time.monotonic()
        for sock in (silent, partial):
            sock.settimeout(GUARD_S)
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(65536) == b""
        took = time.monotonic() - started
        # SPEC §7.7: 10 s; the slack is for a loaded machine, and the keep-alive
        # idle timeout (30 s) would have been the old bound.
        assert took < 10 + 5, f"closed after {took:.1f} s"
        silent.close()
        partial.close()
        assert _served(server)
    finally:
        server.stop()
