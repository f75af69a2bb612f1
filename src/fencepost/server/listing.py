"""Query parameters of the list routes (`GET /v1/locks`, `GET /v1/pools`), and
how many of their answers are built at once."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

from fencepost.core.names import is_valid_name
from fencepost.errors import ValidationError
from fencepost.server.messages import Request, Response

T = TypeVar("T")
# List answers built at once per process (SPEC §7.7: memory stays bounded
# whatever clients ask): a page of 1,000 locks is a megabyte and a half of
# JSON and some ten times that in objects while it is built. 120 clients
# asking for one each at once took the server from 57 to 275 MiB, and the
# allocator kept most of it after they left; four at a time, 73 and 72 MiB
# (this machine, 2026-12-05). The others wait their turn.
LISTS_AT_ONCE = 4
MAX_LIST_LIMIT = 1000
DEFAULT_LIST_LIMIT = 100
_LIST_PARAMS = {"prefix", "limit", "after"}
_PREFIX_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


def list_query(
    request: Request, allowed: frozenset[str] | set[str] = _LIST_PARAMS
) -> tuple[str, str | None, int]:
    """(prefix, after, limit); every bad or unknown parameter (one not
    `allowed`) is named in one 422."""
    query = request.query_params
    details = [
        {"field": name, "message": "unknown query parameter"}
        for name in query.keys()
        if name not in allowed
    ]
    prefix = query.get("prefix", "")
    if len(prefix) > 128 or not set(prefix) <= _PREFIX_CHARS:
        details.append({"field": "prefix", "message": "must be up to 128 name characters"})
    after = query.get("after") or None
    if after is not None and not is_valid_name(after):
        details.append({"field": "after", "message": "must be a cursor from `next`"})
    raw_limit = query.get("limit", str(DEFAULT_LIST_LIMIT))
    # isascii: str.isdigit also accepts '²' and other digits that int() refuses.
    numeric = raw_limit.isascii() and raw_limit.isdigit() and len(raw_limit) <= 6
    limit = int(raw_limit) if numeric else 0
    if not 1 <= limit <= MAX_LIST_LIMIT:
        details.append({"field": "limit", "message": f"must be an integer 1..{MAX_LIST_LIMIT}"})
    if details:
        raise ValidationError(details)
    return prefix, after, limit


def no_query(request: Request) -> None:
    """Routes that take no query parameters refuse any, naming each (a typo
    such as `?limt=5` must not pass silently)."""
    details = [
        {"field": name, "message": "unknown query parameter"}
        for name in request.query_params.keys()
    ]
    if details:
        raise ValidationError(details)


def list_turns() -> asyncio.Semaphore:
    """One app's turns at building list answers (LISTS_AT_ONCE)."""
    return asyncio.Semaphore(LISTS_AT_ONCE)


async def one_page(
    request: Request, turns: asyncio.Semaphore,
    fetch: Callable[[str, str | None, int], Awaitable[list[T]]],
    name_of: Callable[[T], str], answer: Callable[[list[T], str | None], Response],
    allowed: frozenset[str] | set[str] = _LIST_PARAMS,
) -> Response:
    """The page the request's query asks for: `fetch(prefix, after, count)`
    reads it, `answer(items, next cursor)` encodes it, in one of `turns`."""
    prefix, after, limit = list_query(request, allowed)
    async with turns:
        items, cursor = page(await fetch(prefix, after, limit + 1), limit, name_of)
        return answer(items, cursor)


def page(fetched: list[T], limit: int, name_of: Callable[[T], str]) -> tuple[list[T], str | None]:
    """One page from `limit + 1` fetched items, and the cursor for the next page
    (None when this is the last): fetching one extra tells whether more exist."""
    items = fetched[:limit]
    return items, name_of(items[-1]) if len(fetched) > limit else None
