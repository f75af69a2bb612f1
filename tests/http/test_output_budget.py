"""Clients that ask for large answers and never read them (SPEC §7.7): the
answers waiting for them share one budget (`--max-output-buffer`); past it the
connections holding the most are cut off at once (not after 30 s of not
reading), and everyone else is served meanwhile."""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from pathlib import Path

from test_hostile_connections import connections, push, settled_rss

from support import ServerProcess

BUDGET_MIB = 4
READERS = 40
LOCKS = 1000
GUARD_S = 20.0


def _fill(server: ServerProcess) -> int:
    """LOCKS held locks with a kilobyte of metadata each: GET /v1/locks?limit=1000
    answers about a megabyte and a half. Returns the answer's size."""
    with server.client(timeout=30) as c:
        for index in range(LOCKS):
            resp = c.put(f"/v1/locks/big-{index:04d}/lease", json={
                "ttl_seconds": 600, "metadata": {"note": "x" * 1000}},
                headers={"X-Lock-Token": str(uuid.uuid4()), "X-Request-Id": str(uuid.uuid4())})
            assert resp.status_code == 201, resp.text
        return len(c.get("/v1/locks?limit=1000").content)


def _cut_off(sock: socket.socket) -> bool:
    """Whether the server ended the connection (the unread answers are dropped
    with it: reading what arrived finds the end, or a reset)."""
    sock.settimeout(0.5)
    try:
        while chunk := sock.recv(1 << 20):
            del chunk
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def test_unread_answers_share_one_budget(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "s", extra_args=[
        "--max-output-buffer", str(BUDGET_MIB), "--max-connections-per-source", "0"]).start()
    try:
        size = _fill(server)
        assert size > 1_000_000
        request = (f"GET /v1/locks?limit=1000 HTTP/1.1\r\nHost: x\r\n"
                   f"Authorization: Bearer {server.admin_key}\r\n\r\n").encode()
        started = time.monotonic()
        with connections(server.port, READERS) as socks:
            for sock in socks:
                push(sock, request * 3)
            time.sleep(2.0)  # every answer produced that the budget and the sockets allow
            with server.client(timeout=30) as c:  # everyone else is served meanwhile
                assert c.get("/v1/whoami").status_code == 200
            cut = sum(_cut_off(sock) for sock in socks)
            took = time.monotonic() - started
        print(f"\n{READERS} readers of {size / 2**20:.1f} MiB answers, {BUDGET_MIB} MiB budget: "
              f"{cut} cut off within {took:.1f} s")
        # Each holds at least one answer beyond what its socket took; far more
        # than the budget together, so most must go, long before the 30 s after
        # which a client that reads nothing is cut off anyway.
        assert cut >= READERS // 2, f"only {cut} of {READERS} cut off"
        assert took < GUARD_S
    finally:
        with contextlib.suppress(Exception):
            server.stop()


def test_memory_stays_bounded_and_comes_back(tmp_path: Path) -> None:
    """120 clients ask for a 1.3 MiB list each (three times, pipelined) and read
    nothing. Bound during: the output budget (16 MiB) plus the few answers
    built at once (listing.LISTS_AT_ONCE, each some ten times its JSON in
    objects) plus the parsed requests and sockets: 64 MiB over the baseline
    (measured 10; without the turns at building lists, 218). After they leave:
    within 32 MiB of the baseline (measured 10; before, 212 stayed)."""
    server = ServerProcess(tmp_path / "s", extra_args=[
        "--max-output-buffer", "16", "--max-connections-per-source", "0"]).start()
    try:
        assert server.proc is not None
        pid = server.proc.pid
        _fill(server)
        before = settled_rss(pid)
        request = (f"GET /v1/locks?limit=1000 HTTP/1.1\r\nHost: x\r\n"
                   f"Authorization: Bearer {server.admin_key}\r\n\r\n").encode()
        with connections(server.port, 120) as socks:
            for sock in socks:
                push(sock, request * 3)
            during = settled_rss(pid)
            with server.client(timeout=30) as c:
                assert c.get("/v1/whoami").status_code == 200
        after = settled_rss(pid)
        print(f"\nRSS {before / 2**20:.0f} -> {during / 2**20:.0f} -> {after / 2**20:.0f} MiB")
        assert during - before < 64 * 2**20, f"grew by {(during - before) / 2**20:.0f} MiB"
        assert after - before < 32 * 2**20, f"kept {(after - before) / 2**20:.0f} MiB"
    finally:
        server.stop()
