"""HTTP/1.1 connections, straight from the socket to the routes.

httptools (llhttp, the parser in Node.js) parses; this module keeps the
connection: one request served at a time in arrival order (pipelined requests
wait their turn), bodies capped at 64 KiB, `Expect: 100-continue`, keep-alive
with an idle timeout, back-pressure both ways, and a graceful close.

Proxied requests (SPEC §4.7; `Connections.streams_body` says which) are the
exception to whole bodies: such a request goes to its route as soon as its
head is parsed, with its body streaming in behind it (messages.BodyStream,
reading paused while the route lags), and its answer may stream out
(messages.StreamingResponse, written as the socket takes it).

Everything a client controls is bounded per connection, so memory stays bounded
whatever a client sends or refuses to read: at most MAX_PIPELINED parsed
requests wait (the rest of the input stays unparsed, and reading stops), no
request is answered while the client is not reading the previous answers, a
client that reads nothing for SEND_STALL_S is cut off, and the listener holds at
most `max_connections` connections. One source cannot take them all (SPEC
§7.7): each address holds at most `max_per_source` (a trusted proxy excepted:
it speaks for many), a connection must send a whole request head within
HEAD_READ_S of opening (and of starting each request), and at the cap the
connection idle the longest is closed to make room for a new one; only when
none is idle is the newcomer answered 503 and closed at once. It exists
because the general ASGI path (uvicorn + Starlette) cost most of the server's
CPU per request in the benchmark's profile (README "Benchmarks"); every route
is served here, so there is one path to test, not a fast one and a slow one.
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import http
import logging
import time
import urllib.parse
from typing import AsyncIterator, Awaitable, Callable, cast

import httptools

from fencepost.server.http import MAX_BODY_BYTES
from fencepost.server.messages import (
    Address,
    BodyStalled,
    BodyStream,
    Request,
    Response,
    StreamingResponse,
)
from fencepost.server.proxies import TrustedProxies

_log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024  # request line and headers together
KEEP_ALIVE_S = 30.0
# One request's head and body must arrive within this, however slowly they
# trickle in (a client sending a byte now and then holds no connection forever).
REQUEST_READ_S = 30.0
# A new connection's first request head, and each request's head once begun,
# must arrive within this (SPEC §7.7): connections opened and left silent are
# the cheapest way to hold a server's connections.
HEAD_READ_S = 10.0
# Connections one source address may hold at once, by default.
DEFAULT_MAX_PER_SOURCE = 256
# Answers waiting for clients that do not read, all connections together
# (SPEC §7.7): past it, the connections with the most unread output are cut off.
# 600 clients that never read a 1.5 MB answer each held 830 MB without it.
DEFAULT_OUTPUT_BUDGET = 128 * 1024 * 1024
# A body at least this large goes out beside its head, not copied after it.
_LARGE_BODY = 64 * 1024
# After a 413 the rest of the body is read and dropped, up to this much and
# this long, so that the client reads the answer instead of a reset (closing
# a socket with unread input resets it, and the reset destroys the answer).
MAX_DISCARD_BYTES = 4 * 1024 * 1024
LINGER_S = 5.0
# Parsed requests waiting behind the one being served; past this many the
# connection stops parsing (and reading) until they are answered.
MAX_PIPELINED = 8
# Input is parsed this much at a time, so that one read full of tiny pipelined
# requests queues at most about a hundred of them, not thousands (the parser
# cannot be paused inside a feed).
FEED_BYTES = 2048
# So at most this many parsed requests wait at once (the shortest request,
# `GET / HTTP/1.0` and a blank line, is 18 bytes).
MAX_QUEUED = MAX_PIPELINED + FEED_BYTES // 18
# A client whose unread answers fill the socket (writing paused) and that
# reads nothing for this long is cut off: its buffered answer would otherwise
# hold memory, and its connection, forever.
SEND_STALL_S = 30.0
# Headers that name one thing: a request that repeats one is ambiguous (which
# line a proxy or the server reads decides who the caller is), so it is refused
# and the connection closed (SPEC §2). Content-Length is refused by the parser.
_SINGLE_HEADERS = frozenset({
    "authorization", "x-api-key", "x-lock-token", "x-request-id", "content-length", "host",
})

_STATUS_LINES = {
    status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode("latin-1")
    for status in http.HTTPStatus
}
_STATUS_LINES[499] = b"HTTP/1.1 499 Client Closed Request\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# The app: a request in, a response out; it never raises.
Handle = Callable[[Request], Awaitable["Response | StreamingResponse"]]
# Whether a request target's body streams to its route (proxy mode).
StreamsBody = Callable[[bytes], bool]
# A streamed body's chunk is written at most this big, so that one chunk never
# holds much memory in the transport's buffer.
_STREAM_CHUNK = 64 * 1024
_NO_BODY_STATUSES = frozenset({204, 304})
# An error answered by the connection itself (malformed HTTP, oversize body),
# from its status, message and the request's headers: the response and its
# request ID.
Refusal = Callable[[int, str, dict[str, str]], tuple[Response, str]]


def _nothing() -> None:
    pass


def _end_head(
    out: list[bytes], request_id: str, headers: list[tuple[str, str]], keep_alive: bool,
    http10: bool,
) -> bytes:
    """An answer's head from its first lines `out`: the request ID, `headers`
    in order (a name may repeat), how the connection goes on, the blank line."""
    if request_id:
        out.append(b"x-request-id: " + request_id.encode("latin-1") + b"\r\n")
    for name, value in headers:
        out.append(f"{name}: {value}\r\n".encode("latin-1", "replace"))
    if not keep_alive:
        out.append(b"connection: close\r\n")
    elif http10:
        out.append(b"connection: keep-alive\r\n")
    out.append(b"\r\n")
    return b"".join(out)


class _DateHeader:
    """The Date header (RFC 9110 §6.6.1), formatted once a second."""

    def __init__(self) -> None:
        self._second = 0
        self._value = b""

    def get(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = b"date: " + email.utils.formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._value


class Connections:
    """What every connection of one listener shares, and the set of them, so a
    shutdown can close idle ones and wait for busy ones."""

    def __init__(
        self, handle: Handle, refuse: Refusal, proxies: TrustedProxies,
        max_connections: int | None = None, max_per_source: int | None = None,
        output_budget: int | None = DEFAULT_OUTPUT_BUDGET,
        streams_body: StreamsBody | None = None,
    ) -> None:
        self.handle = handle
        self.streams_body = streams_body
        self.refuse = refuse
        self.proxies = proxies
        self.max_connections = max_connections
        self.max_per_source = max_per_source  # None or 0: no cap per source
        self.date = _DateHeader()
        self.open: set[HttpConnection] = set()
        self.per_source: collections.Counter[str] = collections.Counter()
        self.output_budget = output_budget  # None or 0: no global budget
        # Connections whose last answer did not all go out at once.
        self.backlogged: set[HttpConnection] = set()
        self.closing = False
        self.aborted = False  # stop waiting for busy connections

    def protocol(self) -> HttpConnection:
        return HttpConnection(self)

    def shut(self) -> None:
        """Stop taking requests: idle connections close now, busy ones after
        their current response."""
        self.closing = True
        for connection in list(self.open):
            connection.close_when_idle()

    def busy(self) -> int:
        return sum(1 for connection in self.open if connection.busy)

    def admit(self, connection: HttpConnection, source: str) -> str | None:
        """Count `connection` in, or say why not: its source holds its share,
        or every connection is busy at the cap. At the cap an idle connection
        is closed to make room: the one idle the longest (a connection that
        never sent a request is idle since it opened)."""
        cap = self.max_per_source
        if cap and self.per_source[source] >= cap and not self.proxies.trusts(source):
            return f"This address holds {cap} connections, the most one may; close some."
        if self.max_connections is not None and len(self.open) >= self.max_connections:
            idlest = min(
                (c for c in self.open if c.idle_since is not None and not c.busy),
                key=lambda c: c.idle_since or 0.0, default=None,
            )
            if idlest is None:
                return "The server has too many open connections; retry shortly."
            idlest.make_room()
        self.open.add(connection)
        self.per_source[source] += 1
        return None

    def owe(self, connection: HttpConnection) -> None:
        """`connection` holds unsent output: keep all such output within the
        budget by cutting off the connections holding the most (the furthest
        over an even share), largest first. Only answers that did not go out
        at once get here, so a client that reads costs nothing."""
        budget = self.output_budget
        if not budget:
            return
        self.backlogged.add(connection)
        held: list[tuple[int, HttpConnection]] = []
        total = 0
        for each in list(self.backlogged):
            size = each.unsent()
            if size <= 0:
                self.backlogged.discard(each)
                continue
            held.append((size, each))
            total += size
        if total <= budget:
            return
        for size, each in sorted(held, key=lambda entry: entry[0], reverse=True):
            each.abort()
            self.backlogged.discard(each)
            total -= size
            if total <= budget:
                return

    def leave(self, connection: HttpConnection, source: str) -> None:
        self.backlogged.discard(connection)
        if connection in self.open:
            self.open.discard(connection)
            self.per_source[source] -= 1
            if self.per_source[source] <= 0:
                del self.per_source[source]

    def abort(self) -> None:
        for connection in list(self.open):
            connection.abort()


class _Pending:
    """A parsed request waiting for its turn: either one for the app, or an
    answer the connection gives itself (`refusal`)."""

    __slots__ = ("method", "url", "headers", "body", "keep_alive", "http10", "refusal",
                 "stream", "header_list")

    def __init__(
        self, method: str, url: bytes, headers: dict[str, str], body: bytes, keep_alive: bool,
        http10: bool = False, refusal: tuple[int, str] | None = None,
        stream: BodyStream | None = None, header_list: list[tuple[str, str]] | None = None,
    ) -> None:
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.http10 = http10  # keep-alive must then be announced
        self.refusal = refusal
        self.stream = stream  # a body that streams in while the route runs
        self.header_list = header_list  # every line, for a streamed request


class HttpConnection(asyncio.Protocol):
    def __init__(self, shared: Connections) -> None:
        self._shared = shared
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._peer: Address | None = None
        self._gone = asyncio.Event()
        self._queue: collections.deque[_Pending] = collections.deque()
        self.busy = False
        self._reading_paused = False
        self._writing_paused = False
        self._close_after = False  # close once the current response is out
        self._broken = False  # no more requests from this connection
        self._draining = False  # ...but read and drop its input (after a 413)
        self._discarded = 0
        self._continue_owed = False  # a 100 Continue to send once it is our turn
        self._unparsed = b""  # input held back while MAX_PIPELINED requests wait
        self._answer_owed = False  # the next queued request waits for writing to resume
        self._stall_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self.idle_since: float | None = None  # the loop's time when it last fell idle
        self._head_pending = True  # no whole request head yet: the first, or a begun one
        self._head_deadline: asyncio.TimerHandle | None = None
        self._source = ""
        self._linger: asyncio.TimerHandle | None = None
        self._read_deadline: asyncio.TimerHandle | None = None
        self._partial = False  # a request begun and not yet complete
        # The request being parsed.
        self._url = b""
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._head_refusal: tuple[int, str] | None = None
        self._repeated = False
        # A streamed request (proxy mode): None until its URL is known.
        self._streamed: bool | None = None
        self._header_list: list[tuple[str, str]] = []
        self._stream: BodyStream | None = None  # the body now streaming in
        self._streaming: asyncio.Task[None] | None = None  # an answer streaming out
        self._writable = asyncio.Event()
        self._writable.set()

    # --- asyncio.Protocol ---------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self._peer = Address(str(peer[0]), int(peer[1]))
            self._source = self._peer.host
        shared = self._shared
        refused = shared.admit(self, self._source)
        if refused is not None:
            self._refuse_connection(refused)
            return
        if shared.closing:
            transport.close()
            return
        self._wait_idle()
        self._head_deadline = self._loop.call_later(HEAD_READ_S, self._head_too_slow)

    def _refuse_connection(self, message: str) -> None:
        """Over a connection cap: one fixed 503, then close, before reading a
        byte (a connection costs nothing more than this)."""
        self._broken = True
        transport = self._transport
        self._transport = None
        if transport is None:
            return
        response, request_id = self._shared.refuse(503, message, {})
        pending = _Pending("", b"", {}, b"", False)
        transport.write(self._head(response, pending, request_id, False) + response.body)
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._shared.leave(self, self._source)
        self._gone.set()  # parked waiters see that their caller left (Request.gone)
        self._stop_idle_timer()
        for timer in (self._linger, self._read_deadline, self._stall_timer, self._head_deadline):
            if timer is not None:
                timer.cancel()
        self._queue.clear()
        self._unparsed = b""
        self._transport = None
        self._writable.set()  # a writer waiting for room finds the connection gone
        if self._stream is not None:
            self._stream.fail(ConnectionError("the client closed the connection"))
        if self._streaming is not None:
            # An answer streaming out ends now, and with it the upstream call
            # and its slot (SPEC §4.7: released at once).
            self._streaming.cancel()

    def data_received(self, data: bytes) -> None:
        # Input alone does not reset the idle timer: only a whole request does
        # (on_message_complete), so a client that sends nothing but line breaks,
        # or half a request, is still closed at the idle timeout.
        if self._broken:
            if self._draining:
                self._discarded += len(data)
                if self._discarded > MAX_DISCARD_BYTES and self._transport is not None:
                    self._transport.abort()
            return
        self._feed(self._unparsed + data if self._unparsed else data)

    def _feed(self, data: bytes) -> None:
        """Parse input a slice at a time while fewer than MAX_PIPELINED requests
        wait; keep the rest unparsed (reading stays paused until it is used)."""
        self._unparsed = b""
        view = memoryview(data)
        offset = 0
        while offset < len(data) and not self._broken and len(self._queue) < MAX_PIPELINED:
            self._parse(view[offset:offset + FEED_BYTES])
            offset += FEED_BYTES
        self._unparsed = data[offset:] if offset < len(data) and not self._broken else b""
        self._update_reading()
        if self._partial and self._read_deadline is None and not self._broken \
                and self._stream is None:
            # Only a request that spans reads gets a deadline: most arrive
            # whole, and a timer per request would cost every one of them.
            self._read_deadline = self._loop.call_later(REQUEST_READ_S, self._read_too_slow)
        if self._head_pending and self._head_deadline is None and not self._broken:
            self._head_deadline = self._loop.call_later(HEAD_READ_S, self._head_too_slow)

    def _parse(self, data: memoryview) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No protocol switching here: the request is answered as plain
            # HTTP (it is queued), and whatever follows it is not HTTP/1.1.
            self._close_after = True
            self._stop_reading_input()
            if not self.busy and not self._queue and self._transport is not None:
                self._transport.close()
        except httptools.HttpParserError:
            if self._stream is not None:
                # Mid-way through a streamed body, whose route already runs:
                # it sees the body break; nothing more is read.
                self._stream.fail(BodyStalled("the request body is not valid HTTP/1.1"))
                self._stream = None
                self._close_after = True
                self._stop_reading_input()
            elif not self._broken:
                self._refuse_and_stop(400, "The request is not valid HTTP/1.1.")
            elif self._draining:  # the parser stopped mid-body: what follows is dropped
                self._discarded += len(data)

    def pause_writing(self) -> None:
        # The client is not reading its responses: stop reading its requests,
        # stop answering them, and cut it off if it stays that way.
        self._writing_paused = True
        self._writable.clear()
        self._update_reading()
        if self._stall_timer is None:
            self._stall_timer = self._loop.call_later(SEND_STALL_S, self._send_stalled)

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._writable.set()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if self._answer_owed:
            self._answer_owed = False
            self._serve_next()
        self._update_reading()

    def _send_stalled(self) -> None:
        self._stall_timer = None
        if self._writing_paused and self._transport is not None:
            self._transport.abort()  # close() would wait for the buffer to drain

    # --- httptools callbacks ------------------------------------------------
    def on_message_begin(self) -> None:
        self._partial = True
        self._head_pending = True
        self._continue_owed = False
        self._url = b""
        self._headers = {}
        self._head_bytes = 0
        self._body = []
        self._body_bytes = 0
        self._head_refusal = None
        self._repeated = False
        self._streamed = None
        self._header_list = []

    def on_url(self, url: bytes) -> None:
        if self._grow_head(len(url), "The request's URL is too long."):
            self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._grow_head(len(name) + len(value), "The request's headers are too large."):
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if self._streamed is None:  # the URL is whole once headers begin
            streams = self._shared.streams_body
            self._streamed = streams is not None and streams(self._url)
        if self._streamed:
            self._header_list.append((name.decode("latin-1"), text))
        earlier = self._headers.get(key)
        if earlier is None:
            self._headers[key] = text
        elif key in _SINGLE_HEADERS:
            if self._head_refusal is None:
                self._head_refusal = (400, f"The request repeats the {name.decode('latin-1')} "
                                           "header; send it once.")
            self._repeated = True
        else:
            # Lines of a list header are one value, in order (RFC 9110 §5.3):
            # X-Forwarded-For from a proxy that appends its own line included.
            self._headers[key] = f"{earlier}, {text}"

    def _grow_head(self, size: int, message: str) -> bool:
        """Count the request head; False once it is over the cap (the request
        will be refused), and a parse error far beyond it (cut the connection)."""
        self._head_bytes += size
        if self._head_bytes <= MAX_HEAD_BYTES:
            return True
        if self._head_bytes > 2 * MAX_HEAD_BYTES:
            raise httptools.HttpParserError("request head far over the limit")
        if self._head_refusal is None:
            self._head_refusal = (400, message)
        return False

    def on_headers_complete(self) -> None:
        self._head_pending = False
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        if self._repeated or (
            "host" not in self._headers and self._parser.get_http_version() == "1.1"
        ):
            # Ambiguous or incomplete framing (SPEC §2, RFC 9112 §3.2): answer
            # 400 and read nothing more from this connection.
            refusal = self._head_refusal if self._repeated else None
            self._refuse_and_stop(*(refusal or (400, "An HTTP/1.1 request needs a Host header.")))
            return
        if "transfer-encoding" in self._headers and "content-length" in self._headers:
            self._refuse_and_stop(400, "A request may not have both Content-Length and "
                                       "Transfer-Encoding.")
            return
        if self._streamed is None:
            streams = self._shared.streams_body
            self._streamed = streams is not None and streams(self._url)
        if self._streamed:
            self._begin_stream()
            return
        declared = self._headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            # Answered at once, without reading a byte of the body.
            self._refuse_and_stop(413, "The request body is over 64 KiB.", drain=True)
        elif self._headers.get("expect", "").lower() == "100-continue":
            if self._transport is not None and not self.busy and not self._queue:
                self._transport.write(_CONTINUE)
            else:  # earlier requests are still being answered: after them
                self._continue_owed = True

    def _begin_stream(self) -> None:
        """Queue a streamed request now, its body to follow. Its route decides
        the body's fate: a 100 Continue (owed when asked) goes out only once
        the route reads, so a body it refuses unread (413) is never sent by a
        client that waits for one."""
        expects = self._headers.get("expect", "").lower() == "100-continue"
        stream = BodyStream(self._update_reading, self._send_continue if expects else _nothing)
        self._stream = stream
        if self._read_deadline is not None:
            # A streamed body may take long; its route bounds each pause instead.
            self._read_deadline.cancel()
            self._read_deadline = None
        method = self._parser.get_method().decode("ascii", "replace")
        self._queue.append(_Pending(
            method, self._url, self._headers, b"", self._parser.should_keep_alive(),
            self._parser.get_http_version() == "1.0", None, stream, self._header_list,
        ))
        self._update_reading()
        if not self.busy:
            self._serve_next()

    def _send_continue(self) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing() and self._stream is not None:
            transport.write(_CONTINUE)

    def on_body(self, chunk: bytes) -> None:
        if self._stream is not None:
            self._stream.put(bytes(chunk))
            self._update_reading()
            return
        if self._broken:
            return
        self._body_bytes += len(chunk)
        if self._body_bytes > MAX_BODY_BYTES:  # chunked: refused before it ends
            self._body = []
            self._refuse_and_stop(413, "The request body is over 64 KiB.", drain=True)
        else:
            self._body.append(chunk)

    def on_message_complete(self) -> None:
        self._not_idle()  # only a whole request counts as activity
        self._partial = False
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None
        self._continue_owed = False
        if self._stream is not None:
            self._stream.end()  # queued when its head was parsed
            self._stream = None
            self._update_reading()
            return
        if self._broken:
            return
        keep_alive = self._parser.should_keep_alive()
        http10 = self._parser.get_http_version() == "1.0"
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        method = self._parser.get_method().decode("ascii", "replace")
        self._queue.append(_Pending(
            method, self._url, self._headers, body, keep_alive, http10, self._head_refusal
        ))
        self._update_reading()
        if not self.busy:
            self._serve_next()

    # --- serving ------------------------------------------------------------
    def _serve_next(self) -> None:
        if not self._queue or self._transport is None:
            if self._unparsed and not self._broken and self._transport is not None:
                self._feed(self._unparsed)  # input held back now has room
            return
        pending = self._queue.popleft()
        self.busy = True
        self._update_reading()
        if pending.refusal is not None:
            status, message = pending.refusal
            response, request_id = self._shared.refuse(status, message, pending.headers)
            self._respond(response, pending, request_id, False)
            return
        self._loop.create_task(self._serve(pending))

    async def _serve(self, pending: _Pending) -> None:
        try:
            request = self._request(pending)
        except (httptools.HttpParserError, ValueError):
            # A target that is no path (CONNECT's host:port, say): no route.
            refused, request_id = self._shared.refuse(
                400, "The request target is not a path.", pending.headers
            )
            self._respond(refused, pending, request_id, False)
            return
        try:
            response: Response | StreamingResponse = await self._shared.handle(request)
        except Exception:  # noqa: BLE001 - the app answers its own errors; this is a bug
            _log.exception("a request failed unexpectedly")
            response, _ = self._shared.refuse(500, "The server failed unexpectedly.", {})
        if pending.stream is not None and not pending.stream.complete:
            # The route answered before the whole body came (a 413, a 404, an
            # error): the rest cannot be told from the next request, so the
            # connection reads and drops it, then closes after this answer.
            self._close_after = True
            self._draining = True
            self._broken = True
            self._stream = None
            self._update_reading()
        if isinstance(response, StreamingResponse):
            self._streaming = asyncio.current_task()
            try:
                await self._stream_out(response, pending, request.request_id)
            except asyncio.CancelledError:
                # The client left (connection_lost cancels this); anything else
                # that cancels an answer half sent must not leave it looking whole.
                if self._transport is not None:
                    self.abort()
                return
            finally:
                self._streaming = None
            return
        self._respond(response, pending, request.request_id, pending.method == "HEAD")

    def _request(self, pending: _Pending) -> Request:
        url = httptools.parse_url(pending.url)
        # An absolute-form target without a path ("GET http://host") means "/".
        path = url.path.decode("latin-1") if url.path else "/"
        if "%" in path:
            path = urllib.parse.unquote(path)
        query = url.query.decode("latin-1") if url.query else ""
        client = self._peer
        if client is not None and self._shared.proxies:
            host = self._shared.proxies.client(client.host, pending.headers.get("x-forwarded-for"))
            if host != client.host:
                client = Address(host, 0)
        request = Request(pending.method, path, query, pending.headers, client,
                          pending.body, "", self._gone)
        if pending.stream is not None:
            request.body_stream = pending.stream
            request.raw_path = url.path.decode("latin-1") if url.path else "/"
            request.header_list = pending.header_list or []
        return request

    def _respond(self, response: Response, pending: _Pending, request_id: str, head: bool) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return  # the client left; nobody to answer
        keep_alive = pending.keep_alive and not self._close_after and not self._shared.closing
        out = self._head(response, pending, request_id, keep_alive)
        body = b"" if head else response.body
        if len(body) >= _LARGE_BODY:
            transport.writelines((out, body))  # no second copy of a large body
        else:
            transport.write(out + body if body else out)
        if transport.get_write_buffer_size():
            self._shared.owe(self)
        self._finish(transport, keep_alive)

    def _finish(self, transport: asyncio.Transport, keep_alive: bool) -> None:
        """After an answer is out: close, or serve the next request, or idle."""
        self.busy = False
        if not keep_alive:
            self._close(transport)
            return
        if self._queue or self._unparsed:
            if self._writing_paused:
                # The client is not reading: the next answer waits until it
                # does, so unread answers never pile up in memory.
                self._answer_owed = True
                return
            self._serve_next()
            if self.busy:
                return
        if self._continue_owed:
            self._continue_owed = False
            transport.write(_CONTINUE)
        self._update_reading()
        self._wait_idle()

    def _head(
        self, response: Response, pending: _Pending, request_id: str, keep_alive: bool,
    ) -> bytes:
        """The status line and headers of `response`."""
        body = response.body
        out = [
            _STATUS_LINES.get(response.status_code)
            or f"HTTP/1.1 {response.status_code} Unknown\r\n".encode(),
            self._shared.date.get(),
            b"content-length: %d\r\n" % len(body),
        ]
        if response.media_type:
            out.append(b"content-type: " + response.media_type.encode("latin-1") + b"\r\n")
        pairs = [(name.lower(), value) for name, value in (response.headers or {}).items()]
        return _end_head(out, request_id, pairs, keep_alive, pending.http10)

    async def _stream_out(
        self, response: StreamingResponse, pending: _Pending, request_id: str,
    ) -> None:
        """Write a streamed answer as its body comes and the socket takes it.
        Framed by Content-Length when the length is known, else chunked (or,
        for HTTP/1.0, by closing). A body that fails, or that ends short of its
        length, cuts the connection: the caller sees a broken answer, never a
        short one that looks whole."""
        body = response.body
        try:
            transport = self._transport
            if transport is None or transport.is_closing():
                return
            keep_alive = pending.keep_alive and not self._close_after and not self._shared.closing
            bodyless = (response.bodyless or pending.method == "HEAD"
                        or response.status_code in _NO_BODY_STATUSES
                        or response.status_code < 200)
            chunked = not bodyless and response.length is None and not pending.http10
            if not bodyless and response.length is None and pending.http10:
                keep_alive = False  # HTTP/1.0 knows no chunks: the close ends the body
            transport.write(self._stream_head(response, pending, request_id, keep_alive,
                                              chunked, bodyless))
            if bodyless:
                # Run the body to its end all the same (it yields nothing):
                # what its source does when it ends (a proxied call releases
                # its slot) must happen, and an unstarted generator's aclose
                # runs none of it.
                async for _ in body:
                    pass
            else:
                sent = await self._write_body(body, chunked, response.deadline)
                if sent is None or (response.length is not None and sent != response.length):
                    self._streaming = None  # its own abort must not cancel it mid-cleanup
                    self.abort()
                    return
                if chunked:
                    transport.write(b"0\r\n\r\n")
            self._finish(transport, keep_alive)
        finally:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _write_body(
        self, body: AsyncIterator[bytes], chunked: bool, deadline: float | None,
    ) -> int | None:
        """Bytes of `body` written, or None when it failed, the client left, or
        the deadline came first."""
        try:
            async with asyncio.timeout_at(deadline):
                return await self._write_chunks(body, chunked)
        except TimeoutError:
            _log.info("a streamed answer was cut off at its deadline")
            return None
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the body's source failed mid-way
            _log.info("a streamed answer broke off", exc_info=True)
            return None

    async def _write_chunks(self, body: AsyncIterator[bytes], chunked: bool) -> int | None:
        sent = 0
        async for chunk in body:
            transport = self._transport
            if transport is None or transport.is_closing():
                return None
            for start in range(0, len(chunk), _STREAM_CHUNK):
                part = chunk[start:start + _STREAM_CHUNK]
                if chunked:
                    transport.writelines((b"%x\r\n" % len(part), part, b"\r\n"))
                else:
                    transport.write(part)
                sent += len(part)
                if not self._writable.is_set():
                    await self._writable.wait()  # the client reads slower than we get
                    if self._transport is None:
                        return None
        return sent

    def _stream_head(
        self, response: StreamingResponse, pending: _Pending, request_id: str,
        keep_alive: bool, chunked: bool, bodyless: bool,
    ) -> bytes:
        out = [
            _STATUS_LINES.get(response.status_code)
            or f"HTTP/1.1 {response.status_code} Unknown\r\n".encode(),
        ]
        if not any(name == "date" for name, _ in response.headers):
            out.append(self._shared.date.get())
        if chunked:
            out.append(b"transfer-encoding: chunked\r\n")
        elif response.length is not None and (not bodyless or pending.method == "HEAD"):
            out.append(b"content-length: %d\r\n" % response.length)
        return _end_head(out, request_id, response.headers, keep_alive, pending.http10)

    def _close(self, transport: asyncio.Transport) -> None:
        if not self._draining or not transport.can_write_eof():
            transport.close()
            return
        # The answer is out; half-close, and keep reading (and dropping) what
        # the client still sends until it closes, or for LINGER_S at most.
        transport.write_eof()
        self._linger = self._loop.call_later(LINGER_S, transport.close)

    # --- connection state ---------------------------------------------------
    def _refuse_and_stop(self, status: int, message: str, drain: bool = False) -> None:
        """Answer once everything before it is answered, then close. `drain`:
        keep reading and dropping the input meanwhile (see MAX_DISCARD_BYTES)."""
        self._broken = True
        self._draining = drain
        refusal = (status, message)
        self._queue.append(_Pending("", b"", self._headers, b"", False, False, refusal))
        self._stop_reading_input()
        if not self.busy:
            self._serve_next()

    def _stop_reading_input(self) -> None:
        self._broken = True
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None:
            return
        pause = (
            (self._broken and not self._draining)
            or self._writing_paused
            or len(self._queue) >= MAX_PIPELINED
            or bool(self._unparsed)
            or (self._stream is not None and self._stream.full)
        )
        if pause and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not pause and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    def _wait_idle(self) -> None:
        # One timer per connection, armed once and moved on when it fires
        # early, rather than a timer made and cancelled for every request
        # (that churn was 2 % of a busy server's CPU).
        self.idle_since = self._loop.time()
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_later(KEEP_ALIVE_S, self._idle_timeout)

    def _not_idle(self) -> None:
        """Not idle (a request is being served): the armed timer finds that
        when it fires, and waits for the next idle spell."""
        self.idle_since = None

    def _stop_idle_timer(self) -> None:
        self.idle_since = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _read_too_slow(self) -> None:
        self._read_deadline = None
        if self._transport is not None and not self._broken:
            self._transport.close()

    def _head_too_slow(self) -> None:
        """No whole request head within HEAD_READ_S: of a connection's first
        request, or of one begun and stalled (a request being answered, or
        one already whole, is never cut off here)."""
        self._head_deadline = None
        if self._head_pending and not self.busy and not self._queue \
                and self._transport is not None:
            self._transport.close()

    def make_room(self) -> None:
        """Closed, idle, to admit a new connection at the cap."""
        if self._transport is not None:
            self._transport.close()
        self._shared.leave(self, self._source)  # counted out now: the newcomer takes its place

    def _idle_timeout(self) -> None:
        self._idle_timer = None
        if self.idle_since is None:
            return  # busy: the next idle spell arms the timer again
        left = self.idle_since + KEEP_ALIVE_S - self._loop.time()
        if left > 0:  # active since the timer was armed
            self._idle_timer = self._loop.call_later(left, self._idle_timeout)
        elif not self.busy and not self._queue and self._transport is not None:
            self._transport.close()

    def close_when_idle(self) -> None:
        self._close_after = True
        if not self.busy and not self._queue and self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def unsent(self) -> int:
        """Bytes of answers written and not yet taken by the socket."""
        transport = self._transport
        return 0 if transport is None or transport.is_closing() else \
            transport.get_write_buffer_size()
