"""Workload (g), hand-off: how long a waiter waits after the lock became free.

SPEC §3.1 grants a waiter within 100 ms of the lock becoming free, §4.2 does
the same for pool waiters, and §7.4 frees a dead holder's lease within 1 s of
its `expires_at`. No test may hold a wall-clock bound, so this measures them.
Every client runs in this one process, on one asyncio loop, each on a
connection of its own (bench/fpbench/aioconn.py); the doors per system are in
bench/fpbench/handoff_doors.py. Cases:

- `release`: WAITERS clients wait in line on one lock while another holds it.
  Each holder holds HOLD_S, releases, and joins the back of the line again,
  so the chain goes on for the whole run. Sample n: the monotonic time the
  n-th grant's answer was read, minus the time the n-th release's answer was
  read (both read by this process: one clock).
- `release under load`: the same while workload (a) runs at the run's
  connection count against the same server (wrk; for Redis, redisload).
- `expiry`: EXPIRY_LOCKS locks, each taken for EXPIRY_TTL_S by a holder that
  then does nothing, with one waiter behind it; the holders' grants are
  spread over one second. Sample: the wall-clock time the waiter's grant was
  read minus the holder's `expires_at` (the server's clock: this machine's).
- `pool`: `release` on a pool of limit 1.

Also per case, the loop's own lag (how late a 1 ms sleep wakes): a timestamp
taken on this loop is late by at most about that. A grant read before its
release's answer counts as a hand-off of 0 (its raw value stays in `min_ms`).
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from dataclasses import dataclass
from typing import Awaitable, Callable

from fpbench.handoff_doors import Door, Seat, open_door
from fpbench.systems import System

CASES = ("release", "release under load", "expiry", "pool")
WAITERS = 20
HOLD_S = 0.005
EXPIRY_LOCKS = 50
EXPIRY_TTL_S = 5  # the shortest lease fencepost grants
CHAIN_WAIT_S = 120.0  # far more than a turn in a line of WAITERS should take
BOUND_MS = {"release": 100, "release under load": 100, "expiry": 1000, "pool": 100}
_SETTLE_S = 10.0  # the longest a join may take to show in line
_MS = 1_000_000

# A background load for `release under load`: seconds -> a one-line summary.
Load = Callable[[int], str]


@dataclass
class Handoff:
    """One system on one hand-off case: measured, or why not."""

    system: str
    case: str
    status: str  # "ok", "n/a", "skipped", "failed"
    reason: str = ""
    samples: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    min_ms: float = 0.0
    over_100ms: int = 0
    over_1s: int = 0
    bound_ms: int = 0
    waiters: int = 0
    client_lag_p99_ms: float = 0.0
    client_lag_max_ms: float = 0.0
    note: str = ""

    @property
    def within_bound(self) -> bool | None:
        if self.status != "ok":
            return None
        return (self.over_1s if self.bound_ms >= 1000 else self.over_100ms) == 0


def _rank(ordered: list[int], share: float) -> int:
    """Nearest-rank percentile of a sorted list."""
    return ordered[max(0, min(len(ordered) - 1, math.ceil(len(ordered) * share) - 1))]


def _summary(row: Handoff, took_ns: list[int], lag_ns: list[int]) -> Handoff:
    if not took_ns:
        row.status, row.reason = "failed", "no hand-off happened"
        return row
    # A grant read before its release's answer (both came in one wake-up of
    # the loop; Redis writes them in one go) is a hand-off of 0.
    took = sorted(max(0, t) for t in took_ns)
    row.samples = len(took)
    row.p50_ms, row.p99_ms = _rank(took, 0.5) / _MS, _rank(took, 0.99) / _MS
    row.max_ms, row.min_ms = took[-1] / _MS, min(took_ns) / _MS
    row.over_100ms = sum(1 for t in took if t > 100 * _MS)
    row.over_1s = sum(1 for t in took if t > 1000 * _MS)
    if lag_ns:
        lag = sorted(lag_ns)
        row.client_lag_p99_ms, row.client_lag_max_ms = _rank(lag, 0.99) / _MS, lag[-1] / _MS
    return row


async def _watch_lag(lag_ns: list[int]) -> None:
    """How late this loop wakes from a 1 ms sleep, all the time the case runs."""
    while True:
        started = time.monotonic_ns()
        await asyncio.sleep(0.001)
        lag_ns.append(time.monotonic_ns() - started - _MS)


async def _until_waiting(door: Door, count: int) -> None:
    deadline = time.monotonic() + _SETTLE_S
    while await door.waiting() < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {await door.waiting()} of {count} waiters showed in line")
        await asyncio.sleep(0.01)


@dataclass
class _Chain:
    """The release chain's records, in the order they happened."""

    grants: list[int]
    releases: list[int]
    recording: bool = False

    def granted(self) -> None:
        if self.recording:
            self.grants.append(time.monotonic_ns())

    def released(self) -> None:
        if self.recording:
            self.releases.append(time.monotonic_ns())

    def took_ns(self) -> list[int]:
        """Release n to grant n: the server grants the n-th time only after the
        n-th release, whichever answer this process happened to read first."""
        return [grant - release for release, grant in zip(self.releases, self.grants,
                                                          strict=False)]


async def _take_turns(chain: _Chain, seat: Seat, holding: bool) -> None:
    while True:
        if not holding:
            await seat.take(CHAIN_WAIT_S)
            chain.granted()
        holding = False
        await asyncio.sleep(HOLD_S)
        await seat.give_back()
        chain.released()


async def _line_up(chain: _Chain, door: Door, seats: list[Seat],
                   turns: list[asyncio.Task[None]]) -> None:
    """The first seat takes the lock, every other one joins its line (a turn
    each, added to `turns`): the chain starts with all of them in line."""
    await seats[0].take(0)
    for number, seat in enumerate(seats[1:], start=1):
        turns.append(asyncio.create_task(_take_turns(chain, seat, False)))
        await _until_waiting(door, number)


async def _run_chain(chain: _Chain, holder: Seat, seconds: float,
                     turns: list[asyncio.Task[None]]) -> _Chain:
    """The holder releases, and hand-offs follow for `seconds`."""
    chain.recording = True
    turns.append(asyncio.create_task(_take_turns(chain, holder, True)))
    done, _ = await asyncio.wait(turns, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
    chain.recording = False
    for task in done:
        task.result()  # a turn only ends by raising
    return chain


async def _one_expiry(door: Door, start_s: float) -> int:
    """Take the lock for EXPIRY_TTL_S and never renew it; the waiter behind
    it returns how long after `expires_at` its grant arrived."""
    await asyncio.sleep(start_s)
    holder = await door.seat(EXPIRY_TTL_S)
    waiter = await door.seat(EXPIRY_TTL_S + 60)  # outlives its wait (etcd: its lease)
    try:
        expires_ns = (await holder.take(0)).expires_ns
        assert expires_ns is not None
        await waiter.take(EXPIRY_TTL_S + 30)
        return time.time_ns() - expires_ns
    finally:
        holder.close()
        waiter.close()


async def _expiries(system: System, nonce: str) -> list[int]:
    doors = []
    try:
        for index in range(EXPIRY_LOCKS):
            door = await open_door(system, "expiry", f"handoff-{nonce}-expiry-{index}")
            assert not isinstance(door, str)
            doors.append(door)
        return list(await asyncio.wait_for(asyncio.gather(*(
            _one_expiry(door, index / EXPIRY_LOCKS) for index, door in enumerate(doors))),
            EXPIRY_TTL_S + 45))
    finally:
        for door in doors:
            door.close()


async def _under(row: Handoff, load: Load | None, seconds: int,
                 measured: Callable[[], Awaitable[object]]) -> None:
    """`measured()` alone, or inside `load` begun a second before it (its
    summary goes to the row's note)."""
    if load is None:
        await measured()
        return
    background = asyncio.create_task(asyncio.to_thread(load, seconds + 2))
    try:
        await asyncio.sleep(1.0)
        if background.done():
            background.result()  # raises what stopped it
        await measured()
    finally:
        row.note = await background


async def _case(system: System, case: str, seconds: int, nonce: str,
                load: Load | None) -> Handoff:
    row = Handoff(system.name, case, "ok", bound_ms=BOUND_MS[case])
    # The expiry case opens a door per lock; this one says whether there is any.
    door = await open_door(system, case, f"handoff-{nonce}-{case.replace(' ', '-')}")
    if isinstance(door, str):
        return Handoff(system.name, case, "n/a", door, bound_ms=BOUND_MS[case])
    lag_ns: list[int] = []
    watcher = asyncio.create_task(_watch_lag(lag_ns))
    seats: list[Seat] = []
    turns: list[asyncio.Task[None]] = []
    try:
        if case == "expiry":
            row.waiters = EXPIRY_LOCKS
            took = await _expiries(system, nonce)
            return _summary(row, took, lag_ns)
        row.waiters = WAITERS
        seats = [await door.seat(int(seconds) + 60) for _ in range(WAITERS + 1)]
        chain = _Chain([], [])
        await _line_up(chain, door, seats, turns)
        lag_ns.clear()  # the lag while the chain runs
        await _under(row, load if case == "release under load" else None, seconds,
                     lambda: _run_chain(chain, seats[0], seconds, turns))
        return _summary(row, chain.took_ns(), lag_ns)
    finally:
        for task in [watcher, *turns]:
            task.cancel()
        await asyncio.gather(watcher, *turns, return_exceptions=True)
        for seat in seats:
            seat.close()
        door.close()


def measure(system: System, seconds: int, load: Load | None,
            say: Callable[[str], None] = print) -> list[Handoff]:
    """Every case of CASES against `system` (running); `load` gives the background."""
    nonce = uuid.uuid4().hex[:10]
    found = []
    for case in CASES:
        try:
            row = asyncio.run(_case(system, case, seconds, nonce, load))
        except Exception as exc:  # noqa: BLE001 - one broken case must not end the run
            row = Handoff(system.name, case, "failed", f"{type(exc).__name__}: {exc}"[:500],
                          bound_ms=BOUND_MS[case])
        say(f"       {case}: {one_line(row)}")
        found.append(row)
    return found


def one_line(row: Handoff) -> str:
    if row.status != "ok":
        return f"{row.status}: {row.reason}"
    text = (f"{row.samples} hand-offs, p50 {row.p50_ms:.1f} ms, p99 {row.p99_ms:.1f} ms, "
            f"max {row.max_ms:.1f} ms, over 100 ms {row.over_100ms}, over 1 s {row.over_1s}")
    return text + f" (client loop lag p99 {row.client_lag_p99_ms:.1f} ms)"


def not_run(system: str, status: str, reason: str) -> list[Handoff]:
    """Every case of CASES, not measured for `reason`."""
    return [Handoff(system, case, status, reason, bound_ms=BOUND_MS[case]) for case in CASES]
