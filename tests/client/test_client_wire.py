"""The `AsyncClient`'s own connections (`fencepost.client.wire`), against small
servers that misbehave on purpose: keep-alive, what a failure says about
whether the request may have reached the server (retries depend on it),
timeouts, cancellation, chunked answers, forged headers, and the httpx path
kept for proxies. The happy path against a real server is every other
`AsyncClient` test that passes no transport (and tests/http/test_tls.py)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

import fencepost
from fencepost.client import Retries
from fencepost.errors import NotFound, TransportError
from support import ServerProcess, free_port, unique_name

ONCE = Retries(attempts=1)


@dataclass
class Seen:
    """What the fake server received: connections opened and request heads."""

    connections: int = 0
    heads: list[str] = field(default_factory=list)


Answer = Callable[[asyncio.StreamWriter, str, Seen], Awaitable[bool]]
"""Answers one request (its head given); returns False to close the connection."""


def not_found(key: str, *, chunked: bool = False, close: bool = False) -> bytes:
    body = json.dumps({"error": {"code": "not_found", "message": f"no lock {key}"}}).encode()
    head = "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
    if close:
        head += "Connection: close\r\n"
    if chunked:
        half = len(body) // 2
        parts = (body[:half], body[half:])
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunks
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def key_of(head: str) -> str:
    match = re.search(r"/v1/locks/([^/ ]+) ", head)
    return match.group(1) if match else "?"


async def answer_not_found(writer: asyncio.StreamWriter, head: str, seen: Seen) -> bool:
    writer.write(not_found(key_of(head)))
    return True


@pytest.fixture
async def fake() -> AsyncIterator[Callable[[Answer], Awaitable[tuple[str, Seen]]]]:
    """Starts a server on 127.0.0.1 that reads request heads (the client's
    requests here have no body) and answers each with `answer`."""
    servers: list[asyncio.Server] = []

    async def start(answer: Answer) -> tuple[str, Seen]:
        seen = Seen()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.connections += 1
            try:
                while True:
                    head = (await reader.readuntil(b"\r\n\r\n")).decode()
                    seen.heads.append(head)
                    if not await answer(writer, head, seen):
                        break
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}", seen

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def test_requests_share_one_kept_alive_connection_and_carry_the_client_headers(
        fake: Callable[[Answer], Awaitable[tuple[str, Seen]]]) -> None:
    url, seen = await fake(answer_not_found)
    async with fencepost.AsyncClient(url, "secret-key", retries=ONCE) as client:
        for i in range(5):
            with pytest.raises(NotFound, match=f"no lock k{i}"):
                await client.get_lock(f"k{i}")
    assert seen.connections == 1
    assert len(seen.heads) == 5
    head = seen.heads[0]
    assert head.startswith("GET /v1/locks/k0 HTTP/1.1\r\n")
    assert f"\r\nHost: {url.removeprefix('http://')}\r\n" in head
    assert "\r\nAuthorization: Bearer secret-key\r\n" in head
    assert f"\r\nUser-Agent: fencepost-python/{fencepost.__version__}\r\n" in head
    assert re.search(r"\r\nX-Request-Id: [0-9a-f-]{36}\r\n", head)


async def test_a_chunked_answer_is_read_whole(
        fake: Callable[[Answer], Awaitable[tuple[str, Seen]]]) -> None:
    async def chunked(writer: asyncio.StreamWriter, head: str, seen: Seen) -> bool:
        writer.write(not_found(key_of(head), chunked=True))
        return True

    url, _ = await fake(chunked)
    async with fencepost.AsyncClient(url, retries=ONCE) as client:
        with pytest.raises(NotFound, match="no lock chunky"):
            await client.get_lock("chunky")


async def test_connection_close_and_a_server_closing_idle_connections_cost_no_request(
        fake: Callable[[Answer], Awaitable[tuple[str, Seen]]]) -> None:
    async def then_close(writer: asyncio.StreamWriter, head: str, seen: Seen) -> bool:
        # every other answer says it closes; the rest close without saying so
        writer.write(not_found(key_of(head), close=len(seen.heads) % 2 == 1))
        return False

    url, seen = await fake(then_close)
    async with fencepost.AsyncClient(url, retries=ONCE) as client:
        for i in range(4):
            with pytest.raises(NotFound, match=f"no lock k{i}"):
                await client.get_lock(f"k{i}")
            await asyncio.sleep(0.05)  # the close reaches the client while idle
    assert seen.connections == 4


async def test_a_refused_connection_was_not_sent() -> None:
    async with fencepost.AsyncClient(f"http://127.0.0.1:{free_port()}", retries=ONCE) as client:
        with pytest.raises(TransportError, match="Cannot reach") as caught:
            await client.get_lock("k")
    assert caught.value.maybe_sent is False


@pytest.mark.parametrize(("sent", "close", "error"), [
    (not_found("k")[:40], True, "Cannot reach .*closed the connection"),  # cut off
    (b"SPDY/9 what\r\n\r\n", False, "malformed answer"),  # not HTTP
])
async def test_a_broken_answer_is_a_transport_error_that_may_have_been_sent(
        fake: Callable[[Answer], Awaitable[tuple[str, Seen]]],
        sent: bytes, close: bool, error: str) -> None:
    async def broken(writer: asyncio.StreamWriter, head: str, seen: Seen) -> bool:
        writer.write(sent)
        return not close

    url, _ = await fake(broken)
    async with fencepost.AsyncClient(url, retries=ONCE) as client:
        with pytest.raises(TransportError, match=error) as caught:
            await client.get_lock("k")
    assert caught.value.maybe_sent is True


async def test_no_answer_in_time_is_a_timeout_that_may_have_been_sent(
        fake: Callable[[Answer], Awaitable[tuple[str, Seen]]]) -> None:
    async def silent(writer: asyncio.StreamWriter, head: str, seen: Seen) -> bool:
        await asyncio.sleep(5)
        return False

    url, _ = await fake(silent)
    async with fencepost.AsyncClient(url, timeout=0.2, retries=ONCE) as client:
        with pytest.raises(TransportError, match="in time") as caught:
            await client.get_lock("k")
    assert caught.value.maybe_sent is True


async def test_a_cancelled_request_leaves_no_stray_answer_for_the_next(
        fake: Callable[[Answer], Awaitable[tuple[str, Seen]]]) -> None:
    async def slow_first(writer: asyncio.StreamWriter, head: str, seen: Seen) -> bool:
        if len(seen.heads) == 1:
            await asyncio.sleep(0.3)
        writer.write(not_found(key_of(head)))
        return True

    url, seen = await fake(slow_first)
    async with fencepost.AsyncClient(url, retries=ONCE) as client:
        first = asyncio.create_task(client.get_lock("first"))
        while not seen.heads:
            await asyncio.sleep(0.01)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        with pytest.raises(NotFound, match="no lock second"):
            await client.get_lock("second")
        await asyncio.sleep(0.4)  # the first answer comes, to a closed connection
        with pytest.raises(NotFound, match="no lock third"):
            await client.get_lock("third")


async def test_a_line_break_in_a_header_is_refused_before_sending(
        fake: Callable[[Answer], Awaitable[tuple[str, Seen]]]) -> None:
    url, seen = await fake(answer_not_found)
    async with fencepost.AsyncClient(url, retries=ONCE) as client:
        with pytest.raises(TransportError, match="line break") as caught:
            await client.renew_lock("k", "token\r\nX-Forged: 1", ttl=30)
    assert caught.value.maybe_sent is False
    assert seen.connections == 0


async def test_a_proxy_in_the_environment_is_honoured(
        fake: Callable[[Answer], Awaitable[tuple[str, Seen]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    proxy, seen = await fake(answer_not_found)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    async with fencepost.AsyncClient("http://fencepost.invalid:7440", retries=ONCE) as client:
        with pytest.raises(NotFound):
            await client.get_lock("k")
    assert seen.heads[0].startswith("GET http://fencepost.invalid:7440/v1/locks/k HTTP/1.1")


async def test_a_closed_client_sends_nothing(
        fake: Callable[[Answer], Awaitable[tuple[str, Seen]]]) -> None:
    url, seen = await fake(answer_not_found)
    client = fencepost.AsyncClient(url, retries=ONCE)
    await client.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await client.get_lock("k")
    assert seen.connections == 0


def test_the_client_runs_on_uvloop(server: ServerProcess) -> None:
    """uvloop's transports are not asyncio's classes; the server runs on uvloop,
    and so may a program using the client."""
    import uvloop  # a dependency wherever the server runs on it (CPython, not Windows)

    async def hold_and_fail() -> tuple[int, bool]:
        async with fencepost.AsyncClient(server.base_url, server.admin_key) as client:
            lease = await client.acquire_lock(unique_name("uvloop"), ttl=30)
            for _ in range(3):
                await client.renew_lock(lease.key, lease.lock_token, ttl=30)
            await client.release_lock(lease.key, lease.lock_token)
        async with fencepost.AsyncClient(f"http://127.0.0.1:{free_port()}",
                                         retries=ONCE) as nowhere:
            with pytest.raises(TransportError) as caught:
                await nowhere.whoami()
        return lease.fencing_token, caught.value.maybe_sent

    token, maybe_sent = uvloop.run(hold_and_fail())
    assert token > 0 and maybe_sent is False
