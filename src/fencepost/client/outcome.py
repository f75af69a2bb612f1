"""The outcome of the work a pool slot admitted (SPEC §4.4), sent with its release."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(slots=True)
class Outcome:
    """What the upstream answered: its final HTTP `status`, how many 429s the holder
    saw (`throttled`), its retry hint, pre-parsed rate-limit state (`rate`, keys
    `limit`, `remaining`, `reset_ms`, `token_limit`, `token_remaining`,
    `token_reset_ms`) and/or its raw response `headers` for the server to parse,
    and the units the call really spent of the pool's budget (`cost`, such as
    the tokens an LLM API says it used; SPEC §4.6)."""

    status: int | None = None
    throttled: int | None = None
    retry_after_ms: int | None = None
    rate: dict[str, int] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    cost: int | None = None

    def to_body(self) -> dict[str, Any]:
        """The release body: only the fields that were reported."""
        body: dict[str, Any] = {}
        if self.status is not None:
            body["status"] = self.status
        if self.throttled is not None:
            body["throttled"] = self.throttled
        if self.retry_after_ms is not None:
            body["retry_after_ms"] = self.retry_after_ms
        if self.rate:
            body["rate"] = dict(self.rate)
        if self.headers:
            body["headers"] = dict(self.headers)
        if self.cost is not None:
            body["cost"] = self.cost
        return body


# Headers the server's rate-limit parser understands (SPEC §4.5); other upstream
# headers (cookies, auth echoes) are not sent on.
_RATE_HEADER_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "ratelimit")
_RATE_HEADERS = {"retry-after", "retry-after-ms"}
MAX_HEADERS = 256


def rate_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The upstream headers that describe rate limits, lower-cased."""
    kept: dict[str, str] = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower in _RATE_HEADERS or lower.startswith(_RATE_HEADER_PREFIXES):
            kept[lower] = value
            if len(kept) >= MAX_HEADERS:
                break
    return kept


def outcome_from_response(response: httpx.Response, *, previous: Outcome | None = None) -> Outcome:
    """An `Outcome` from an upstream `httpx.Response`: its status and rate-limit
    headers. A 429 adds one to the `throttled` count carried over from `previous`."""
    return merge_outcome(previous, status=response.status_code, headers=response.headers)


def merge_outcome(
    previous: Outcome | None,
    *,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
    throttled: int | None = None,
    retry_after_ms: int | None = None,
    rate: Mapping[str, int] | None = None,
    cost: int | None = None,
) -> Outcome:
    """A new report over an earlier one: later values win, and each reported 429
    counts one upstream throttle unless `throttled` is given outright."""
    base = previous or Outcome()
    count = base.throttled
    if throttled is not None:
        count = throttled
    elif status == 429:
        count = (count or 0) + 1
    return Outcome(
        status=status if status is not None else base.status,
        throttled=count,
        retry_after_ms=retry_after_ms if retry_after_ms is not None else base.retry_after_ms,
        rate=dict(rate) if rate is not None else base.rate,
        headers=rate_headers(headers) if headers is not None else dict(base.headers),
        cost=cost if cost is not None else base.cost,
    )
