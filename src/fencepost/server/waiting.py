"""Waiting in line for a lock (SPEC §3.1) or a pool slot (§4.2).

The line itself lives in the store (tickets in arrival order), so it is fair
across replicas; this module parks the local request and wakes it when the
store reports that something may be free. Wake-ups are the only path a parked
waiter takes to the store; what used to be a re-check per waiter every second
(10,000 waiters: 10,000 store operations a second) is one sweep per process
(`WaitRoom.sweep_forever`): every SWEEP_S it refreshes, in store operations
of SWEEP_PORTION places each, the places of the parked waiters whose place is
running out (not refreshed by a retry for REFRESH_AFTER_S), holding each
line's key like any operation on it but ahead of those queued for it; a
waiter whose place the store no longer has (it ran out all the same) is
woken to rejoin. Every
SAFETY_WAKE_S it wakes the first waiter of each line, the safety net for a
lost wake-up (a notification that crossed a dropped connection).

A lease that expires frees its lock with no event at that instant (the
reaper notices it within REAP_INTERVAL_S): so the first waiter of each line
also re-checks when the lease in its way expires (`WaitRoom.wake_first_at`,
one timer per line and process), and is granted then, not at the next reap
(SPEC §3.1: within 100 ms of expiry). A renewal moves the expiry: that
re-check finds the lease renewed and sets the timer to the new expiry, one
store operation per line per lease term.

Locks and pools differ only in how they talk to the store, which each states as
a `Line`: try, retry with a ticket, leave, hand a grant back, and the error of
a wait that ran out. `wait_for_grant` does the rest for both.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import os
from dataclasses import KW_ONLY, dataclass, field
from typing import Awaitable, Callable, Generic, Protocol, TypeVar

from fencepost.errors import FencepostError, ShuttingDown, StoreUnavailable
from fencepost.store.base import Freed
from fencepost.store.batch import test_hooks_enabled

_log = logging.getLogger(__name__)


def hook_period(name: str, default: float) -> float:
    """`default`, or with the test hooks on (FENCEPOST_TEST_HOOKS=1) the
    seconds in FENCEPOST_<name>. Tests push the safety wake (and the reaper)
    far out so that a lost wake-up shows as a waiter that waits its whole
    wait, however loaded the machine, instead of as a grant that came a few
    seconds late."""
    value = os.environ.get(f"FENCEPOST_{name}")
    if value is None or not test_hooks_enabled():
        return default
    return float(value)


# A waiter's place in line lasts this long unless refreshed; each retry, and
# the sweep, refresh it. The waiters of a server process that died leave
# sooner, at the next reap of any live replica (store/sql/replicas.py); this is
# the safety net for a process that hangs without dying, or whose host
# vanished without closing its connections.
WAITER_ALIVE_MS = 10_000
# How often the sweep runs, and which places it refreshes: those that no
# retry or sweep refreshed for REFRESH_AFTER_S (so each is written about once
# every REFRESH_AFTER_S, and always with more than WAITER_ALIVE_MS -
# REFRESH_AFTER_S - SWEEP_S = 2.5 s left).
SWEEP_S = hook_period("SWEEP_S", 2.5)
REFRESH_AFTER_S = 5.0
# How often the first waiter of each line re-checks without a wake-up.
SAFETY_WAKE_S = hook_period("SAFETY_WAKE_S", 5.0)
# A line's expiry re-check runs this long after the lease's expiry as this
# process reckons it, so that the store, judging by its own clock, finds
# the lease dead (a re-check that still finds it live sets the timer again).
EXPIRY_MARGIN_S = 0.002
# Places refreshed per store operation. Waiters that parked together fall due
# together; 10,000 of them in one operation held SQLite's writer for 56 ms
# (measured), and every request behind it waited that long (workload (e)'s
# p99); 500 took 4.6 ms. In portions they ride in ordinary batches, one after
# another.
SWEEP_PORTION = 250

T = TypeVar("T")
Place = tuple[str, str, str]  # (kind, project, name): which line, as the store's Freed names it
# Refreshes places in the store, each line's tickets to last alive_ms more;
# returns, by line, the tickets no longer in line (Store.keep_waiting).
KeepWaiting = Callable[[dict[Place, list[int]], int], Awaitable[dict[Place, list[int]]]]


class ClientGone(Exception):
    """The waiting caller closed its connection."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What one try at getting in gave: a grant, or a refusal and (maybe) a
    place in line."""

    granted: T | None
    # Keyword-only: several are optional seconds, easy to pass in the wrong place.
    _: KW_ONLY
    ticket: int | None = None
    refusal: FencepostError | None = None  # what to answer if the wait ends now
    recheck_s: float | None = None  # when the refusal is known to end, if it is
    # The wait a first try settled on, when the store decides it (a pool clamps
    # the wait asked for to its configuration in the transaction that admits).
    wait_s: float | None = None
    # When the lease in the way dies unless it is renewed (its expiry), if
    # one is in the way: the line's first waiter re-checks then.
    frees_in_s: float | None = None


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


# A waiter parks before its first try, so that no wake-up between the store's
# join and the parking is lost; until the try tells its ticket it stands
# behind every real ticket (each store's tickets stay below 2^53), in arrival
# order among the others still trying.
_PROVISIONAL = 1 << 62
_provisional_tickets = itertools.count(_PROVISIONAL)


@dataclass(order=True, slots=True)
class _Parked:
    ticket: int
    wake: asyncio.Event = field(compare=False, default_factory=asyncio.Event)
    # When the place was last refreshed in the store (loop time).
    refreshed: float = field(compare=False, default=0.0)
    # Set when the store stopped answering for long enough that the place
    # may have run out: the waiter is told (503), never silently sent to the
    # back of the line.
    lapsed: FencepostError | None = field(compare=False, default=None)

    @property
    def provisional(self) -> bool:
        """Parked before its first try told it a ticket: no place in the
        store yet, so none to refresh."""
        return self.ticket >= _PROVISIONAL


class WaitRoom:
    """Local waiters by line, ordered by ticket. Each event wakes one waiter:
    the first in line not already woken. Waking all would stampede; waking
    only the head would lose the second of two events that arrive before the
    head has run (a release, then the chain wake of the head's own admission),
    leaving a free slot idle until the safety wake."""

    def __init__(self) -> None:
        self._lines: dict[Place, list[_Parked]] = {}
        # Per line: when its first waiter re-checks for an expiry (see the
        # module docstring), set by the latest refusal, which knows best.
        self._expiry_timers: dict[Place, asyncio.TimerHandle] = {}
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

    def park(self, places: tuple[Place, ...], ticket: int | None = None) -> _Parked:
        """Park one waiter in every line it stands in (a lock set stands in
        several): an event on any of them wakes it. Without a ticket it
        parks provisionally, behind every waiter with one, until `reticket`."""
        parked = _Parked(next(_provisional_tickets) if ticket is None else ticket)
        for place in places:
            bisect.insort(self._lines.setdefault(place, []), parked)
        return parked

    def reticket(self, places: tuple[Place, ...], parked: _Parked, ticket: int) -> None:
        """Move a parked waiter to its place by `ticket` (the one its first
        try drew). A wake-up it received meanwhile stays with it."""
        for place in places:
            waiting = self._lines.get(place)
            if waiting is not None and parked in waiting:
                waiting.remove(parked)
        parked.ticket = ticket
        for place in places:
            bisect.insort(self._lines.setdefault(place, []), parked)

    def unpark(self, places: tuple[Place, ...], parked: _Parked) -> None:
        """Take a waiter out of its lines. A wake-up it received and will not
        use (one that arrived while its last retry was in flight, which then
        granted or refused for good) passes to the next waiter of each line:
        each event wakes one waiter, so dropping it would leave a freed lock
        or slot idle until the safety wake."""
        for place in places:
            waiting = self._lines.get(place)
            if waiting is None:
                continue
            if parked in waiting:
                waiting.remove(parked)
            if not waiting:
                del self._lines[place]
                timer = self._expiry_timers.pop(place, None)
                if timer is not None:
                    timer.cancel()
        if parked.wake.is_set() and not self.closing.is_set():
            parked.wake.clear()
            for kind, project, name in places:
                self.on_freed(Freed(kind, project, name))

    def shut(self) -> None:
        """Answer every parked request now (the server is stopping)."""
        self.closing.set()
        for timer in self._expiry_timers.values():
            timer.cancel()
        self._expiry_timers.clear()

    def wake_first_at(self, places: tuple[Place, ...], delay_s: float) -> None:
        """Wake the first waiter of each of `places` (not one already woken)
        in `delay_s`, when the lease in the way will have expired unless it
        was renewed; this replaces the line's earlier timer."""
        loop = asyncio.get_running_loop()
        for place in places:
            if place not in self._lines:
                continue
            timer = self._expiry_timers.pop(place, None)
            if timer is not None:
                timer.cancel()
            self._expiry_timers[place] = loop.call_later(
                delay_s + EXPIRY_MARGIN_S, self._expired, place
            )

    def _expired(self, place: Place) -> None:
        self._expiry_timers.pop(place, None)
        kind, project, name = place
        self.on_freed(Freed(kind, project, name))

    def running_out(self, now: float) -> dict[Place, list[_Parked]]:
        """The parked waiters whose places no retry refreshed lately, by line."""
        due = now - REFRESH_AFTER_S
        found: dict[Place, list[_Parked]] = {}
        for place, line in self._lines.items():
            stale = [parked for parked in line
                     if parked.refreshed <= due and not parked.provisional]
            if stale:
                found[place] = stale
        return found

    def wake_heads(self) -> None:
        """Wake the first waiter of every line (not one already woken)."""
        for kind, project, name in list(self._lines):
            self.on_freed(Freed(kind, project, name))

    async def sweep_forever(self, keep_waiting: KeepWaiting, at_once: int = 1) -> None:
        """Keep the parked waiters' places alive in the store, and wake each
        line's first waiter now and then (see the module docstring). Up to
        `at_once` portions are refreshed at a time (the store's
        `Store.writers`): one after another, each portion would wait for a
        batch of its own, and behind a backlog of long batches (10,000
        waiters joining at once on PostgreSQL) the places ran out before the
        sweep reached them."""
        loop = asyncio.get_running_loop()
        woke = loop.time()
        while True:
            await asyncio.sleep(SWEEP_S)
            started = loop.time()
            due = self.running_out(started)
            if due:
                try:
                    gone = await _keep_all(keep_waiting, _portions(due, SWEEP_PORTION), at_once)
                except FencepostError as exc:  # tried again at the next sweep
                    _log.warning("refreshing parked waiters: %s", exc.message)
                    self._lapsing(due, started, exc)
                else:
                    self._refreshed(due, gone, started)
            if loop.time() - woke >= SAFETY_WAKE_S:
                woke = loop.time()
                self.wake_heads()

    def _lapsing(self, due: dict[Place, list[_Parked]], now: float,
                 failure: FencepostError) -> None:
        """The store did not take the refresh of `due` (SPEC §6: an outage, a
        failover). A place that would run out before the next sweep could
        refresh it is given up while the waiter still knows where it stood:
        its waiter is answered 503, to retry, rather than be sent to the back
        of the line once the store answers again."""
        # The next sweep comes SWEEP_S from now, and its refresh takes a moment.
        next_refresh = now + SWEEP_S + 0.5
        for line in due.values():
            for parked in line:
                if parked.refreshed + WAITER_ALIVE_MS / 1000 <= next_refresh:
                    parked.lapsed = StoreUnavailable(
                        f"The store did not answer while this request waited in line "
                        f"({failure.message}); its place would have run out, so it was given "
                        f"up. Retry the request.")
                    parked.wake.set()

    def _refreshed(
        self, due: dict[Place, list[_Parked]], gone: dict[Place, list[int]], at: float
    ) -> None:
        """Mark the places of `due` refreshed `at`, except those the store no
        longer has (`gone`): their waiters are woken, and their retry finds
        them out of line and rejoins at the back (a place that ran out cannot
        be given back; a waiter left parked on it would never be granted).
        A lock set's waiter stands in several lines: one gone place is enough."""
        lost = {(place, ticket) for place, tickets in gone.items() for ticket in tickets}
        dropped = {
            id(parked) for place, line in due.items() for parked in line
            if (place, parked.ticket) in lost
        }
        for line in due.values():
            for parked in line:
                if id(parked) in dropped:
                    parked.wake.set()
                else:
                    parked.refreshed = max(parked.refreshed, at)
        if dropped:
            _log.warning(
                "%d parked waiters had lost their place in line (not refreshed in time); "
                "they rejoin at the back", len(dropped))


async def _keep_all(
    keep_waiting: KeepWaiting, portions: list[dict[Place, list[int]]], at_once: int
) -> dict[Place, list[int]]:
    """Refresh every portion, `at_once` at a time; the tickets gone, by line."""
    gate = asyncio.Semaphore(at_once)

    async def keep(part: dict[Place, list[int]]) -> dict[Place, list[int]]:
        async with gate:
            return await keep_waiting(part, WAITER_ALIVE_MS)

    gone: dict[Place, list[int]] = {}
    for dropped in await asyncio.gather(*map(keep, portions)):
        for place, tickets in dropped.items():
            gone.setdefault(place, []).extend(tickets)
    return gone


def _portions(
    due: dict[Place, list[_Parked]], size: int
) -> list[dict[Place, list[int]]]:
    """The tickets of `due`, by line, in portions of at most `size` tickets (a
    long line is split across portions)."""
    portions: list[dict[Place, list[int]]] = []
    current: dict[Place, list[int]] = {}
    count = 0
    for place, line in due.items():
        for parked in line:
            if count == size:
                portions.append(current)
                current, count = {}, 0
            current.setdefault(place, []).append(parked.ticket)
            count += 1
    if current:
        portions.append(current)
    return portions


async def wait_for_grant(room: WaitRoom, line: Line[T], wait_s: float, gone: asyncio.Event) -> T:
    """A grant from `line`, waiting up to `wait_s` for one (0: try once); a
    first try's `Outcome.wait_s`, when given, replaces `wait_s` (the store
    settled the wait).

    Raises the refusal when there is no place in line (fail-fast, or the line
    is full), `line.timed_out(last)` when the wait runs out, ClientGone when
    `gone` (the caller's connection closed) is set, ShuttingDown when the
    server stops. A grant that arrives after the caller left is handed straight
    back: never leave a lease or a slot with someone who is gone.
    """
    if wait_s <= 0:
        first = await line.try_once(False)
        if first.granted is not None:
            return first.granted
        assert first.refusal is not None
        raise first.refusal
    # Parked before the first try: an event that arrives while the join is in
    # flight (a release right after it) wakes this waiter, which then retries.
    # Parking only after the join would need a retry right after every join
    # to catch such an event: two store operations per waiter, and a flood of
    # 10,000 waiters is 20,000 of them.
    loop = asyncio.get_running_loop()
    places = line.places
    parked = room.park(places)
    tried = loop.time()
    try:
        first = await line.try_once(True)
    except BaseException:
        room.unpark(places, parked)
        raise
    if first.granted is not None or first.ticket is None:  # no place in line
        room.unpark(places, parked)
        if first.granted is not None:
            return first.granted
        assert first.refusal is not None
        raise first.refusal
    if first.wait_s is not None:
        wait_s = first.wait_s
    room.reticket(places, parked, first.ticket)
    parked.refreshed = tried  # the join placed it with a full WAITER_ALIVE_MS
    granted = await _wait(room, line, parked, first, wait_s, gone)
    await asyncio.sleep(0)  # let a connection loss already queued be seen
    if gone.is_set():
        await line.hand_back(granted)
        raise ClientGone()
    return granted


async def _wait(
    room: WaitRoom, line: Line[T], parked: _Parked, joined: Outcome[T], wait_s: float,
    gone: asyncio.Event,
) -> T:
    """Wait in line, parked as `parked` after a join that gave `joined`.
    Whatever ends the wait other than a grant, the place in line is given
    up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    places = line.places
    outcome = joined
    granted = False
    try:
        while True:
            if gone.is_set():
                raise ClientGone()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise line.timed_out(outcome)
            if outcome.frees_in_s is not None and outcome.frees_in_s < remaining:
                room.wake_first_at(places, outcome.frees_in_s)
            # Woken by the store's events (and the sweep's safety wake), or
            # when a refusal is known to end (a lock delay, a pool's pacing).
            # A wake-up that came while the last try was in flight is
            # already set: then this returns at once.
            pause = min(remaining, outcome.recheck_s or remaining)
            await _wait_any((parked.wake, gone, room.closing), max(pause, 0.005))
            if gone.is_set():
                raise ClientGone()
            if room.closing.is_set():
                raise ShuttingDown()
            if parked.lapsed is not None:
                raise parked.lapsed
            # Clear before retrying, never after: a wake-up that arrives while
            # the retry is in flight must survive to end the next wait.
            parked.wake.clear()
            retried = loop.time()
            outcome = await line.retry(parked.ticket)
            parked.refreshed = retried
            if outcome.granted is not None:
                granted = True
                return outcome.granted
            if outcome.ticket is None:  # the store took us out of line
                assert outcome.refusal is not None
                raise outcome.refusal
            if outcome.ticket != parked.ticket:  # rejoined at the back after being dropped
                room.reticket(places, parked, outcome.ticket)
    finally:
        room.unpark(places, parked)
        if not granted:
            try:
                await line.leave(parked.ticket)
            except FencepostError:
                pass  # the reaper drops the place once it stops being refreshed


async def _wait_any(events: tuple[asyncio.Event, ...], timeout: float) -> None:
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
