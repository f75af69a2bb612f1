"""Waiting in line for a lock (SPEC §3.1) or a pool slot (§4.2).

The line itself lives in the store (tickets in arrival order), so it is fair
across replicas; this module parks the local request and wakes it when the
store reports that something may be free. A waiter wakes on that event, or at
least every RECHECK_S as a safety net for a lost wake-up.

Locks and pools differ only in how they talk to the store, which each states as
a `Line`: try, retry with a ticket, leave, hand a grant back, and the error of
a wait that ran out. `wait_for_grant` does the rest for both.
"""

from __future__ import annotations

import asyncio
import bisect
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from fencepost.errors import FencepostError, ShuttingDown
from fencepost.store.base import Freed

RECHECK_S = 1.0
# A waiter's place in line lasts this long unless refreshed; each retry refreshes it.
# The waiters of a server process that died leave sooner, at the next reap of any
# live replica (store/sql/replicas.py); this is the safety net for a process that
# hangs without dying, or whose host vanished without closing its connections.
WAITER_ALIVE_MS = 5000

T = TypeVar("T")
Place = tuple[str, str, str]  # (kind, project, name): which line, as the store's Freed names it


class ClientGone(Exception):
    """The waiting caller closed its connection."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What one try at getting in gave: a grant, or a refusal and (maybe) a
    place in line."""

    granted: T | None
    ticket: int | None = None
    refusal: FencepostError | None = None  # what to answer if the wait ends now
    recheck_s: float | None = None  # when the refusal is known to end, if it is


class Line(Protocol[T]):
    """One line in the store, as a waiter needs it: for a lock set (SPEC §3.7)
    one place in each of its keys' lines, all under one ticket."""

    @property
    def places(self) -> tuple[Place, ...]: ...

    async def try_once(self, wait: bool) -> Outcome[T]:
        """The first try; with `wait`, a refusal joins the line (a ticket)."""

    async def retry(self, ticket: int) -> Outcome[T]:
        """Try again holding `ticket` (which keeps the place alive)."""

    async def leave(self, ticket: int) -> None:
        """Give the place up."""

    async def hand_back(self, granted: T) -> None:
        """Undo a grant whose caller has gone."""

    def timed_out(self, last: Outcome[T]) -> FencepostError:
        """The answer to a wait that ran out, from its last refusal."""


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
        self._lines: dict[Place, list[_Parked]] = {}
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

    def park(self, places: tuple[Place, ...], ticket: int) -> _Parked:
        """Park one waiter in every line it stands in (a lock set stands in
        several): an event on any of them wakes it."""
        parked = _Parked(ticket)
        for place in places:
            bisect.insort(self._lines.setdefault(place, []), parked)
        return parked

    def unpark(self, places: tuple[Place, ...], parked: _Parked) -> None:
        for place in places:
            waiting = self._lines.get(place)
            if waiting is None:
                continue
            if parked in waiting:
                waiting.remove(parked)
            if not waiting:
                del self._lines[place]

    def shut(self) -> None:
        """Answer every parked request now (the server is stopping)."""
        self.closing.set()


async def wait_for_grant(room: WaitRoom, line: Line[T], wait_s: float, gone: asyncio.Event) -> T:
    """A grant from `line`, waiting up to `wait_s` for one (0: try once).

    Raises the refusal when there is no place in line (fail-fast, or the line
    is full), `line.timed_out(last)` when the wait runs out, ClientGone when
    `gone` (the caller's connection closed) is set, ShuttingDown when the
    server stops. A grant that arrives after the caller left is handed straight
    back: never leave a lease or a slot with someone who is gone.
    """
    first = await line.try_once(wait_s > 0)
    if first.granted is not None:
        return first.granted
    if first.ticket is None:
        assert first.refusal is not None
        raise first.refusal
    granted = await _wait(room, line, first.ticket, wait_s, gone)
    await asyncio.sleep(0)  # let a connection loss already queued be seen
    if gone.is_set():
        await line.hand_back(granted)
        raise ClientGone()
    return granted


async def _wait(
    room: WaitRoom, line: Line[T], ticket: int, wait_s: float, gone: asyncio.Event
) -> T:
    """Wait in line holding `ticket`. Whatever ends the wait other than a
    grant, the place in line is given up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    places = line.places
    parked = room.park(places, ticket)
    granted = False
    try:
        while True:
            if gone.is_set():
                raise ClientGone()
            # Clear before retrying, never after: a wake-up that arrives while
            # the retry is in flight must survive to end the wait below.
            parked.wake.clear()
            # Retry at once after parking too: a wake-up between joining the line
            # and parking would otherwise be missed.
            outcome = await line.retry(ticket)
            if outcome.granted is not None:
                granted = True
                return outcome.granted
            if outcome.ticket is None:  # the store took us out of line
                assert outcome.refusal is not None
                raise outcome.refusal
            if outcome.ticket != ticket:  # rejoined at the back after being dropped
                room.unpark(places, parked)
                ticket = outcome.ticket
                parked = room.park(places, ticket)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise line.timed_out(outcome)
            pause = min(remaining, RECHECK_S, outcome.recheck_s or RECHECK_S)
            await _wait_any((parked.wake, gone, room.closing), max(pause, 0.005))
            if gone.is_set():
                raise ClientGone()
            if room.closing.is_set():
                raise ShuttingDown()
    finally:
        room.unpark(places, parked)
        if not granted:
            try:
                await line.leave(ticket)
            except FencepostError:
                pass  # the reaper drops the place once it stops being refreshed


async def _wait_any(events: tuple[asyncio.Event, ...], timeout: float) -> None:
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
