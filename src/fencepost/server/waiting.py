"""Parked acquire requests: waiting in line for a lock (SPEC §3.1).

The line itself lives in the store (tickets in arrival order), so it is fair
across replicas; this module only parks the local request and wakes it when the
store reports that the lock may be free. A waiter wakes on that event, or at
least every RECHECK_S as a safety net for a lost wake-up.
"""

from __future__ import annotations

import asyncio
import bisect
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from fencepost.core.leases import AcquireRequest, Granted
from fencepost.errors import FencepostError, ShuttingDown
from fencepost.store.base import LockFreed, Store

RECHECK_S = 1.0
# A waiter's place in line lasts this long unless refreshed; each retry refreshes it,
# so the place of a waiter whose server died is given up within this time.
WAITER_ALIVE_MS = 5000


class ClientGone(Exception):
    """The waiting caller closed its connection."""


@dataclass(order=True, slots=True)
class _Parked:
    ticket: int
    wake: asyncio.Event = field(compare=False, default_factory=asyncio.Event)


class WaitRoom:
    """Local waiters by lock, ordered by ticket. Wakes only the local head: the
    others cannot be granted before it anyway, and waking all would stampede."""

    def __init__(self) -> None:
        self._lines: dict[tuple[str, str], list[_Parked]] = {}
        self.closing = asyncio.Event()

    def on_freed(self, event: LockFreed) -> None:
        line = self._lines.get((event.project, event.key))
        if line:
            line[0].wake.set()

    def park(self, project: str, key: str, ticket: int) -> _Parked:
        parked = _Parked(ticket)
        bisect.insort(self._lines.setdefault((project, key), []), parked)
        return parked

    def unpark(self, project: str, key: str, parked: _Parked) -> None:
        line = self._lines.get((project, key))
        if line is None:
            return
        if parked in line:
            line.remove(parked)
        if not line:
            del self._lines[(project, key)]

    def shut(self) -> None:
        """Answer every parked request now (the server is stopping)."""
        self.closing.set()


async def _wait_any(
    parked: _Parked, disconnected: asyncio.Event, closing: asyncio.Event, timeout: float
) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in (parked.wake, disconnected, closing)]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def acquire_waiting(
    store: Store,
    room: WaitRoom,
    project: str,
    key: str,
    request: AcquireRequest,
    wait_s: float,
    disconnected: asyncio.Event,
) -> Granted:
    """Acquire, waiting up to `wait_s` in line. Raises LockHeld when the wait runs
    out, ClientGone when the caller left, ShuttingDown when the server stops."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    first = await store.acquire_lock(
        project, key, request, wait_alive_ms=WAITER_ALIVE_MS if wait_s > 0 else None
    )
    if isinstance(first.outcome, Granted) or first.ticket is None:
        return _granted_or_raise(first.outcome)
    ticket = first.ticket
    parked = room.park(project, key, ticket)
    granted = False
    try:
        while True:
            # Retry at once after parking too: a wake-up between joining the line
            # and parking would otherwise be missed.
            result = await store.retry_waiter(project, key, request, ticket, WAITER_ALIVE_MS)
            if isinstance(result.outcome, Granted):
                granted = True
                return result.outcome
            if result.ticket is not None and result.ticket != ticket:
                room.unpark(project, key, parked)
                ticket = result.ticket
                parked = room.park(project, key, ticket)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise result.outcome.to_error()
            parked.wake.clear()
            await _wait_any(parked, disconnected, room.closing, min(remaining, RECHECK_S))
            if disconnected.is_set():
                raise ClientGone()
            if room.closing.is_set():
                raise ShuttingDown()
    finally:
        room.unpark(project, key, parked)
        if not granted:
            await _leave_quietly(store.leave_line, project, key, ticket)


async def _leave_quietly(
    leave: Callable[[str, str, int], Awaitable[None]], project: str, key: str, ticket: int
) -> None:
    try:
        await leave(project, key, ticket)
    except FencepostError:
        pass  # the reaper drops the place once it stops being refreshed


def _granted_or_raise(outcome: object) -> Granted:
    if isinstance(outcome, Granted):
        return outcome
    raise outcome.to_error()  # type: ignore[attr-defined]


async def watch_disconnect(receive: Callable[[], Awaitable[dict[str, object]]], flag: asyncio.Event) -> None:
    """Set `flag` when the client closes the connection (the body was already read)."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            flag.set()
            return
