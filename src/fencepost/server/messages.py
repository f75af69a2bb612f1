"""A request and a response as the routes see them: plain objects built by the
connection (server/wire.py), with only what the routes use."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple, overload
from urllib.parse import parse_qsl


class Address(NamedTuple):
    host: str
    port: int


class Headers:
    """Request headers by lower-case name. A repeated header keeps its first
    value, as most frameworks' `get` does."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, str]) -> None:
        self._values = values

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(name.lower(), default)

    def items(self) -> list[tuple[str, str]]:
        return list(self._values.items())


class QueryParams:
    """Query parameters; a repeated parameter keeps its last value."""

    __slots__ = ("_values",)

    def __init__(self, query_string: str) -> None:
        self._values = dict(parse_qsl(query_string, keep_blank_values=True))

    def keys(self) -> list[str]:
        return list(self._values)

    @overload
    def get(self, name: str) -> str | None: ...

    @overload
    def get(self, name: str, default: str) -> str: ...

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(name, default)


class BodyStalled(Exception):
    """A streamed request body stopped arriving (or the connection broke)."""


class BodyStream:
    """A request body that arrives while its route already runs (proxy mode,
    SPEC §4.7): the connection puts chunks in as they are parsed, the route
    takes them out. At most HIGH_WATER bytes wait in between: past it the
    connection stops reading the socket until the route has taken some, so a
    body of any size costs that much memory, never the whole body."""

    HIGH_WATER = 256 * 1024

    __slots__ = ("_chunks", "_size", "_done", "_error", "_wake", "taken",
                 "_on_drain", "_on_first_read")

    def __init__(self, on_drain: Callable[[], None], on_first_read: Callable[[], None]) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._done = False
        self._error: BaseException | None = None
        self._wake = asyncio.Event()
        self.taken = False  # the route began reading
        self._on_drain = on_drain  # resume reading the socket
        self._on_first_read = on_first_read  # send an owed 100 Continue

    def put(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        self._wake.set()

    @property
    def full(self) -> bool:
        return self._size >= self.HIGH_WATER

    @property
    def complete(self) -> bool:
        """The whole body arrived (taken or not)."""
        return self._done

    def end(self) -> None:
        self._done = True
        self._wake.set()

    def fail(self, error: BaseException) -> None:
        if not self._done:
            self._error = error
            self._wake.set()

    async def chunks(self, idle_s: float) -> AsyncIterator[bytes]:
        """The body's chunks as they come; BodyStalled when none comes for
        `idle_s`, or the connection broke before the body ended."""
        if not self.taken:
            self.taken = True
            self._on_first_read()
        while True:
            while self._chunks:
                was_full = self.full
                chunk = self._chunks.popleft()
                self._size -= len(chunk)
                if was_full and not self.full:
                    self._on_drain()
                yield chunk
            if self._error is not None:
                raise BodyStalled(str(self._error) or "the connection broke")
            if self._done:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), idle_s)
            except TimeoutError:
                raise BodyStalled(f"no body data for {idle_s:g} s") from None


class Request:
    __slots__ = (
        "method", "path", "query_string", "headers", "path_params", "client",
        "body", "request_id", "gone", "_query", "raw_path", "header_list", "body_stream",
    )

    def __init__(
        self,
        method: str,
        path: str,
        query_string: str,
        headers: dict[str, str],
        client: Address | None,
        body: bytes,
        request_id: str,
        gone: asyncio.Event,
    ) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = Headers(headers)
        self.path_params: dict[str, str] = {}
        self.client = client
        # Whole and at most MAX_BODY_BYTES: the connection refuses larger (413).
        self.body = body
        self.request_id = request_id
        # Set by the connection once the client has gone (a parked waiter
        # watches it to leave the line).
        self.gone = gone
        self._query: QueryParams | None = None
        # Proxied requests only (wire.py's streamed requests): the path as
        # sent (percent-encoding kept), every header line in order, and the
        # body as it arrives instead of `body`.
        self.raw_path = ""
        self.header_list: list[tuple[str, str]] = []
        self.body_stream: BodyStream | None = None

    @property
    def query_params(self) -> QueryParams:
        if self._query is None:
            self._query = QueryParams(self.query_string)
        return self._query


class Response:
    __slots__ = ("body", "status_code", "headers", "media_type")

    def __init__(
        self,
        content: bytes = b"",
        status_code: int = 200,
        headers: dict[str, str] | None = None,
        media_type: str | None = None,
    ) -> None:
        self.body = content
        self.status_code = status_code
        self.headers = headers
        self.media_type = media_type


class StreamingResponse:
    """An answer whose body is produced while it is sent (proxy mode): the
    connection writes `headers` as given (names may repeat: Set-Cookie) and
    frames `body` itself, with Content-Length when `length` is known, else
    chunked. Iterating `body` may raise: the connection then cuts the answer
    off, so that the caller never mistakes a truncated body for a whole one."""

    __slots__ = ("status_code", "headers", "body", "length", "bodyless", "deadline")

    def __init__(
        self, status_code: int, headers: list[tuple[str, str]], body: AsyncIterator[bytes],
        length: int | None, bodyless: bool = False, deadline: float | None = None,
    ) -> None:
        self.status_code = status_code
        self.headers = headers
        self.body = body
        self.length = length
        # The loop time by which the whole body must be written, else the
        # answer is cut off (a proxied call's slot cap, even for a caller that
        # never reads); None: no limit.
        self.deadline = deadline
        # No body whatever the headers say (an answer to HEAD, a 204 or 304):
        # the length, if any, is the upstream's, passed on as it was.
        self.bodyless = bodyless
