"""Proxy mode from Python (SPEC §4.7): the value that configures a pool's
upstream, and httpx clients whose requests go through a pool.

    with fencepost.Client() as fp, fp.proxy_client("llm", wait=30) as llm:
        answer = llm.post("chat/completions", json={...})  # a slot, the call, the release

Each request takes a slot of the pool (waiting in its line up to `wait`
seconds), is sent on by the server with the pool's own credentials, and gives
the slot back when its answer has been read: the caller never holds a slot,
never renews one and never reports, and the pool still learns from every answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from fencepost.client.bearer_token import BearerToken
from fencepost.client.transport import Settings, trust_context


@dataclass(frozen=True)
class Upstream:
    """A pool's upstream for `set_pool` / `update_pool`: its `base_url`, the
    `headers` the server adds to every proxied call (the credentials: the
    server never shows their values again), and `timeout_ms` for its answer.
    In `update_pool`, the parts left as None stay as they are."""

    base_url: str | None = None
    headers: Mapping[str, str] | None = None
    timeout_ms: int | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.base_url is not None:
            out["base_url"] = self.base_url
        if self.headers is not None:
            out["headers"] = dict(self.headers)
        if self.timeout_ms is not None:
            out["timeout_ms"] = self.timeout_ms
        return out

    def __repr__(self) -> str:
        # The values are secrets: a log line or a traceback shows names only.
        names = None if self.headers is None else sorted(self.headers)
        return f"Upstream(base_url={self.base_url!r}, headers={names!r}, " \
               f"timeout_ms={self.timeout_ms!r})"


class _CurrentKey(httpx.Auth):
    """The fencepost client's key at each request, so that a proxied client
    follows the fencepost client's own key refreshes; or its token from an
    identity provider (SPEC §5.1), with the key beside it in X-Api-Key."""

    def __init__(self, key: Callable[[], str | None], bearer: BearerToken | None) -> None:
        self._key = key
        self._bearer = bearer

    def _sign(self, request: httpx.Request, token: str | None) -> None:
        key = self._key()
        if token is not None:
            request.headers["Authorization"] = f"Bearer {token}"
            if key:
                request.headers["X-Api-Key"] = key
        elif key:
            request.headers["Authorization"] = f"Bearer {key}"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        token = None if self._bearer is None else self._bearer.current()
        self._sign(request, token)
        yield request

    async def async_auth_flow(
        self, request: httpx.Request,
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        token = None
        if self._bearer is not None:
            # Reading may run a command: off the event loop.
            token = await asyncio.to_thread(self._bearer.current)
        self._sign(request, token)
        yield request


def proxy_options(
    settings: Callable[[], Settings], pool: str, wait: float | None, no_queue: bool,
    timeout: float | None, bearer: BearerToken | None = None,
) -> dict[str, Any]:
    """Keyword arguments for an httpx client whose requests go through `pool`."""
    now = settings()
    headers: dict[str, str] = {}
    if wait is not None:
        headers["X-Queue-Timeout-Ms"] = str(max(0, round(wait * 1000)))
    if no_queue:
        headers["X-No-Queue"] = "1"
    # The upstream's answer may take long, and the wait in line comes first.
    read = None if timeout is None else timeout + (wait or 0)
    options: dict[str, Any] = {
        "base_url": f"{now.url}/v1/pools/{quote(pool, safe='')}/proxy/",
        "headers": headers,
        "auth": _CurrentKey(lambda: settings().api_key, bearer),
        "timeout": httpx.Timeout(read, connect=10.0),
        "follow_redirects": False,
    }
    if now.ca_bundle:
        options["verify"] = trust_context(now.ca_bundle)
    return options
