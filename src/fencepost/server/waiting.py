"""Parked requests: callers waiting in line for a lock (SPEC §3.1) or a pool slot (§4.2).

The line itself lives in the store (tickets in arrival order), so it is fair
across replicas; this module only parks the local request and wakes it when the
store reports that something may be free. A waiter wakes on that event, or at
least every RECHECK_S as a safety net for a lost wake-up.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Generic, Sequence, TypeVar

from fencepost.errors import FencepostError, ShuttingDown
from fencepost.store.base import Freed

RECHECK_S = 1.0
# A waiter's place in line lasts this long unless refreshed; each retry refreshes it.
# The waiters of a server process that died leave sooner, at the next reap of any
# live replica (store/sql/replicas.py); this is the safety net for a process that
# hangs without dying, or whose host vanished without closing its connections.
WAITER_ALIVE_MS = 5000

T = TypeVar("T")
Line = tuple[str, str, str]  # (kind, project, name)


class ClientGone(Exception):
    """The waiting caller closed its connection."""


@dataclass(frozen=True, slots=True)
class Attempt(Generic[T]):
    """One try at getting in: granted, or refused and (maybe) holding a place in line."""

    granted: T | None
    ticket: int | None = None
    refusal: FencepostError | None = None  # what to answer if the wait ends now
    recheck_s: float | None = None  # when the refusal is known to end, if it is


@dataclass(order=True, slots=True)
class _Parked:
    ticket: int
    wake: asyncio.Event = field(compare=False, default_factory=asyncio.Event)


class WaitRoom:
    """Local waiters by line, ordered by ticket. Each event wakes one waiter:
    the first in line not already woken. Waking all would stampede; waking
    only the head would lose the second of two events that arrive before the
    head has run (a release, then the chain wake of the head's own admission),
    leaving a free slot idle until the periodic re-check."""

    def __init__(self) -> None:
        self._lines: dict[Line, list[_Parked]] = {}
        self.closing = asyncio.Event()

    def on_freed(self, event: Freed) -> None:
        line = self._lines.get((event.kind, event.project, event.name))
        if not line:
            return
        if event.wake_all:
            for parked in line:
                parked.wake.set()
            return
        for parked in line:
            if not parked.wake.is_set():
                parked.wake.set()
                return

    def parked(self) -> int:
        """How many requests wait in this process now (the metrics)."""
        return sum(len(line) for line in self._lines.values())

    def park(self, lines: Sequence[Line], ticket: int) -> _Parked:
        """Park one waiter on every line it stands in (a lock set stands in
        several, SPEC §3.7): an event on any of them wakes it."""
        parked = _Parked(ticket)
        for line in lines:
            bisect.insort(self._lines.setdefault(line, []), parked)
        return parked

    def unpark(self, lines: Sequence[Line], parked: _Parked) -> None:
        for line in lines:
            waiting = self._lines.get(line)
            if waiting is None:
                continue
            if parked in waiting:
                waiting.remove(parked)
            if not waiting:
                del self._lines[line]

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


async def wait_in_line(
    room: WaitRoom,
    lines: Sequence[Line],
    first: Attempt[T],
    retry: Callable[[int], Awaitable[Attempt[T]]],
    leave: Callable[[int], Awaitable[None]],
    wait_s: float,
    disconnected: asyncio.Event,
    on_timeout: Callable[[Attempt[T]], FencepostError],
) -> T:
    """Wait up to `wait_s` for a grant, starting from the caller's `first` attempt.

    Raises `on_timeout(last attempt)` when the wait runs out, ClientGone when
    the caller left, ShuttingDown when the server stops. Whatever ends the wait
    other than a grant, the caller's place in line is given up.
    """
    if first.granted is not None:
        return first.granted
    if first.ticket is None:
        assert first.refusal is not None
        raise first.refusal
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    ticket = first.ticket
    parked = room.park(lines, ticket)
    granted = False
    try:
        while True:
            if disconnected.is_set():
                raise ClientGone()
            # Clear before retrying, never after: a wake-up that arrives while
            # the retry is in flight must survive to end the wait below.
            parked.wake.clear()
            # Retry at once after parking too: a wake-up between joining the line
            # and parking would otherwise be missed.
            attempt = await retry(ticket)
            if attempt.granted is not None:
                granted = True
                return attempt.granted
            if attempt.ticket is None:  # the store took us out of line
                assert attempt.refusal is not None
                raise attempt.refusal
            if attempt.ticket != ticket:  # rejoined at the back after being dropped
                room.unpark(lines, parked)
                ticket = attempt.ticket
                parked = room.park(lines, ticket)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise on_timeout(attempt)
            pause = min(remaining, RECHECK_S, attempt.recheck_s or RECHECK_S)
            await _wait_any(parked, disconnected, room.closing, max(pause, 0.005))
            if disconnected.is_set():
                raise ClientGone()
            if room.closing.is_set():
                raise ShuttingDown()
    finally:
        room.unpark(lines, parked)
        if not granted:
            try:
                await leave(ticket)
            except FencepostError:
                pass  # the reaper drops the place once it stops being refreshed


async def watch_disconnect(
    receive: Callable[[], Awaitable[dict[str, object]]], flag: asyncio.Event
) -> None:
    """Set `flag` when the client closes the connection (the body was already read)."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            flag.set()
            return


@contextlib.asynccontextmanager
async def watching_disconnect(
    receive: Callable[[], Awaitable[dict[str, object]]],
) -> AsyncIterator[asyncio.Event]:
    """An event set when the client goes away, for the duration of the block."""
    flag = asyncio.Event()
    watcher = asyncio.ensure_future(watch_disconnect(receive, flag))
    try:
        yield flag
    finally:
        watcher.cancel()
