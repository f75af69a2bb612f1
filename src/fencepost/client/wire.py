"""The `AsyncClient`'s own HTTP/1.1 connections: a keep-alive pool over asyncio
protocols, answers parsed by httptools (llhttp, the parser the server uses too).

It exists for CPU: one request through httpx cost the client about a
millisecond of CPU (request and response objects, cookies, a pool that checks
every idle socket, h11), most of what a process renewing thousands of leases
spends (docs/benchmarks.md "Client transports"). Here a request is one write of
bytes built from the `Call`, and the answer is parsed as it arrives. What the
client needs of HTTP is small: one origin, requests it builds itself, JSON
bodies of known length, answers with a length or chunked (the parser handles
both), keep-alive, TLS.

A connection carries one exchange at a time. One that the server closed leaves
the pool when it closes (the event loop says so), not when it is next picked;
one idle for IDLE_S is closed rather than reused, before the server's own idle
timeout could close it under a request being sent.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections import deque
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlencode, urlsplit

import httptools

from fencepost.client.calls import Reply
from fencepost.errors import TransportError

# Below the server's keep-alive timeout (30 s): a connection idle this long is
# closed by the client, so the server never closes one as a request goes out.
IDLE_S = 15.0
# An answer larger than this is refused (the server's largest is a page of a list).
MAX_ANSWER_BYTES = 64 * 1024 * 1024
_BREAK = re.compile("[\r\n\0]")
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


class Failure(Exception):
    """What went wrong, before it is worded as a `TransportError` by `Pool`."""

    def __init__(self, kind: str, detail: str, *, sent: bool, timeout: bool = False) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.sent = sent
        self.timeout = timeout


class Connection(asyncio.Protocol):
    """One keep-alive connection; `exchange` sends a request and waits for its answer."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[Reply] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self.closed = False
        self.idle_since = time.monotonic()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's do not subclass asyncio.Transport).
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._answer.done():
            self.close()  # bytes nobody asked for: the connection is out of step
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(Failure("RemoteProtocolError", f"malformed answer: {exc}", sent=True))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._answer is not None and not self._answer.done():
            detail = str(exc) if exc else "the server closed the connection without an answer"
            self._fail(Failure("RemoteProtocolError", detail, sent=True))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > MAX_ANSWER_BYTES:
            self._fail(Failure("RemoteProtocolError", "answer too large", sent=True))
            self.close()
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:
            self._headers, self._body, self._size = {}, [], 0  # 1xx: the answer follows
            return
        reply = Reply(status, self._headers, b"".join(self._body))
        if not self._parser.should_keep_alive():
            self.close()
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(reply)

    # the exchange

    async def exchange(self, request: bytes, timeout: float) -> Reply:
        """Send `request` and wait up to `timeout` seconds for the whole answer."""
        assert self._transport is not None
        self._headers, self._body, self._size = {}, [], 0
        self._answer = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        try:
            async with asyncio.timeout(timeout):
                return await self._answer
        except TimeoutError:
            self.close()
            raise Failure("ReadTimeout", "no answer in time", sent=True, timeout=True) from None
        except BaseException:
            # Failed or cancelled mid-exchange: what the server still sends
            # would be read as the next request's answer.
            self.close()
            raise
        finally:
            self._answer = None
            self.idle_since = time.monotonic()

    def _fail(self, failure: Failure) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(failure)

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class Pool:
    """Keep-alive connections to one server, at most `size` open at once.

    `headers` go with every request (a request's own win). `send` returns the
    `Reply`, or raises `TransportError` whose `maybe_sent` says
    whether any byte of the request may have reached the server."""

    def __init__(self, url: str, *, headers: Mapping[str, str], size: int,
                 tls: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(url)
        self._url = url
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path.rstrip("/")
        self._tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        default_port = self._port == (443 if parts.scheme == "https" else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        authority = host if default_port else f"{host}:{self._port}"
        self._host_line = f"Host: {authority}\r\n".encode("ascii")
        self._defaults = dict(headers)
        self._size = size
        self._open = 0
        self._idle: deque[Connection] = deque()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def send(self, method: str, path: str, *, params: Mapping[str, str] | None,
                   headers: Mapping[str, str], body: bytes | None,
                   connect_timeout: float, read_timeout: float) -> Reply:
        if self._closed:
            raise RuntimeError("the client is closed: no request can be sent")
        request = self._request(method, path, params, {**self._defaults, **headers}, body)
        try:
            connection = await self._checkout(connect_timeout, read_timeout)
            try:
                reply = await connection.exchange(request, read_timeout)
            finally:
                self._checkin(connection)
        except Failure as failure:
            raise self._error(failure) from None
        return reply

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()
        for waiter in self._waiters:
            waiter.cancel()

    def _request(self, method: str, path: str, params: Mapping[str, str] | None,
                 headers: Mapping[str, str], body: bytes | None) -> bytes:
        target = self._prefix + path + ("?" + urlencode(params) if params else "")
        if _BREAK.search("".join((target, *headers.keys(), *headers.values()))):
            # A line break would end the head early (a forged header): nothing is sent.
            raise TransportError(f"Cannot send to {self._url}: a line break or NUL in the "
                                 "request's target or headers.", maybe_sent=False)
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        elif method in _WITH_BODY:
            head += "Content-Length: 0\r\n"
        try:
            return b"".join((f"{method} {target} HTTP/1.1\r\n".encode("ascii"), self._host_line,
                             head.encode("ascii"), b"\r\n", body or b""))
        except UnicodeEncodeError:
            raise TransportError(f"Cannot send to {self._url}: a header that is not ASCII.",
                                 maybe_sent=False) from None

    async def _checkout(self, connect_timeout: float, wait_timeout: float) -> Connection:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()  # the most recently used: likeliest alive
            if not connection.closed and now - connection.idle_since < IDLE_S:
                return connection
            connection.close()
            self._open -= 1
        if self._open >= self._size:
            await self._wait_for_room(wait_timeout)
            return await self._checkout(connect_timeout, wait_timeout)
        self._open += 1
        try:
            return await self._connect(connect_timeout)
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise

    async def _wait_for_room(self, timeout: float) -> None:
        room: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(room)
        try:
            async with asyncio.timeout(timeout):
                await room
        except TimeoutError:
            raise Failure("PoolTimeout", "every connection busy", sent=False,
                          timeout=True) from None
        finally:
            if not room.done():
                room.cancel()

    def _wake_one(self) -> None:
        while self._waiters:
            room = self._waiters.popleft()
            if not room.done():
                room.set_result(None)
                return

    def _checkin(self, connection: Connection) -> None:
        if connection.closed or self._closed:
            connection.close()
            self._open -= 1
        else:
            self._idle.append(connection)
        self._wake_one()

    async def _connect(self, timeout: float) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_connection(
                    Connection, self._host, self._port, ssl=self._tls,
                    server_hostname=self._host if self._tls else None)
        except TimeoutError:
            raise Failure("ConnectTimeout", "connecting took too long", sent=False,
                          timeout=True) from None
        except (OSError, ssl.SSLError) as exc:
            raise Failure("ConnectError", str(exc) or type(exc).__name__, sent=False) from None
        return connection

    def _error(self, failure: Failure) -> TransportError:
        if failure.timeout:
            message = f"No answer from {self._url} in time ({failure.kind})."
        else:
            message = f"Cannot reach {self._url}: {failure.detail}."
        return TransportError(message, maybe_sent=failure.sent)
