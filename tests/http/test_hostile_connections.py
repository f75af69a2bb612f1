"""Hostile connections against a real `fencepost serve` process (SPEC §7.7):
clients that never read, floods of connections, and the open-file limit.
Memory is measured from outside, as the server's resident set size."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from support import ServerProcess, track

FLOODERS = 50
PIPELINE_BYTES = 64 * 1024
# A connection may hold its parsed requests (a few dozen), one read of input,
# the socket's write buffer and one answer. 50 such connections stay far below
# this; before the connection layer was bounded they took about 2.3 GB.
RSS_GROWTH_LIMIT = 96 * 1024 * 1024
GUARD_S = 30.0


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc status")


def settled_rss(pid: int) -> int:
    """The RSS once it stops growing (two readings 0.5 s apart within 1 MiB),
    or the last reading after GUARD_S."""
    deadline = time.monotonic() + GUARD_S
    last = rss_bytes(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = rss_bytes(pid)
        if abs(now - last) < 1024 * 1024:
            return now
        last = now
    return last


@contextlib.contextmanager
def connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            # A small receive buffer: the kernel holds little of the answers, so
            # nearly all of what is unread would have to sit in the server.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def push(sock: socket.socket, data: bytes) -> int:
    """Write as much of `data` as the socket takes without blocking."""
    sock.setblocking(False)
    sent = 0
    with contextlib.suppress(BlockingIOError, ConnectionError):
        while sent < len(data):
            sent += sock.send(data[sent:])
    return sent


def test_clients_that_pipeline_and_never_read_hold_bounded_memory(
    fresh_server: ServerProcess,
) -> None:
    assert fresh_server.proc is not None
    pid = fresh_server.proc.pid
    with fresh_server.client() as c:  # warm up: the document is built once
        assert c.get("/openapi.json").status_code == 200
    before = settled_rss(pid)
    request = b"GET /openapi.json HTTP/1.1\r\nHost: fencepost\r\n\r\n"
    flood = request * (PIPELINE_BYTES // len(request))
    with connections(fresh_server.port, FLOODERS) as socks:
        pushed = sum(push(sock, flood) for sock in socks)
        assert pushed > FLOODERS * 4096  # the server did read from them
        during = settled_rss(pid)
        # Everyone else is still served meanwhile.
        with fresh_server.client() as c:
            assert c.get("/v1/whoami").status_code == 200
    growth = during - before
    assert growth < RSS_GROWTH_LIMIT, f"server grew by {growth / 2**20:.0f} MiB"
    with fresh_server.client() as c:
        assert c.get("/healthz").status_code == 200


def read_response(sock: socket.socket) -> tuple[int, dict[str, object]]:
    sock.settimeout(GUARD_S)
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {raw!r}"
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return int(head.split(b" ")[1]), json.loads(body)


def test_max_connections_makes_room_by_closing_idle_ones(tmp_path: Path) -> None:
    """At --max-connections, a newcomer is served and the idlest connection (one
    that never sent a request counts as idle since it opened) is closed; when
    they leave, everyone is served as before. (Busy connections at the cap:
    tests/http/test_connection_flood.py.)"""
    server = ServerProcess(tmp_path / "capped", extra_args=["--max-connections", "5"]).start()
    try:
        # wait_ready's own connections are closed; hold five idle ones.
        with connections(server.port, 5) as held:
            time.sleep(0.2)
            with connections(server.port, 3) as extra:
                for sock in extra:
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    assert read_response(sock)[0] == 200
            closed = 0
            for sock in held:
                sock.settimeout(GUARD_S)
                with contextlib.suppress(ConnectionResetError):
                    closed += sock.recv(1) == b""
            assert closed >= 3  # made room for the three newcomers
        deadline = time.monotonic() + GUARD_S
        while True:  # once they are gone, newcomers are served again
            try:
                if httpx.get(f"{server.base_url}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "never served again after the flood"
            time.sleep(0.1)
    finally:
        server.stop()


def _low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (160, 160))


@pytest.mark.parametrize("flood", [300])
def test_a_flood_past_the_open_file_limit_is_refused_not_fatal(
    tmp_path: Path, flood: int,
) -> None:
    """With the open-file limit at 160 and no --max-connections, the server caps
    itself below the limit: the flood's newest connections are admitted by
    closing its idlest (never an accept error), and callers are served
    throughout."""
    server = ServerProcess(tmp_path / "fdlimit")
    server.workdir.mkdir(parents=True)
    import subprocess
    import sys

    server.proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost", "serve", "--store", server.store_url,
         "--host", "127.0.0.1", "--port", str(server.port),
         "--access-log", str(server.access_log)],
        cwd=server.workdir, env=server.env(), stdout=open(server.stdout_path, "ab"),
        stderr=open(server.stderr_path, "ab"), preexec_fn=_low_file_limit,
        start_new_session=True,  # ServerProcess.stop signals the process group
    )
    track(server.proc, own_group=True)
    try:
        server.wait_ready()
        with connections(server.port, flood) as socks:
            # The newest are served (the idlest made room for them).
            for sock in socks[-20:]:
                sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_response(sock)[0] == 200
        with server.client() as c:
            deadline = time.monotonic() + GUARD_S
            while True:
                try:
                    if c.get("/v1/whoami").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "never served again after the flood"
                time.sleep(0.1)
        assert server.proc.poll() is None
        assert "Traceback" not in server.stderr_path.read_text()
    finally:
        server.stop()
