"""A request and a response as the routes see them: plain objects built by the
connection (server/wire.py), with only what the routes use."""

from __future__ import annotations

import asyncio
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


class Request:
    __slots__ = (
        "method", "path", "query_string", "headers", "path_params", "client",
        "body", "request_id", "gone", "_query",
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
