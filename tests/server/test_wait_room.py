"""The local wait room: who is woken by which event (no sleeps)."""

from __future__ import annotations

import asyncio

import pytest

from fencepost.server import waiting
from fencepost.server.waiting import REFRESH_AFTER_S, WaitRoom
from fencepost.store.base import Freed

LINE = ("pool", "default", "api")


def test_each_event_wakes_one_waiter_in_ticket_order() -> None:
    room = WaitRoom()
    third = room.park([LINE], 30)
    first = room.park([LINE], 10)
    second = room.park([LINE], 20)
    room.on_freed(Freed(*LINE))
    assert (first.wake.is_set(), second.wake.is_set(), third.wake.is_set()) == (
        True, False, False)


def test_a_second_event_before_the_head_ran_wakes_the_next() -> None:
    # A release wakes the head; the head's own admission then announces room
    # for one more before the head has left the line: that must not be lost.
    room = WaitRoom()
    head, nxt = room.park([LINE], 1), room.park([LINE], 2)
    room.on_freed(Freed(*LINE))
    room.on_freed(Freed(*LINE))
    assert head.wake.is_set() and nxt.wake.is_set()


def test_wake_all_and_other_lines() -> None:
    room = WaitRoom()
    a, b = room.park([LINE], 1), room.park([LINE], 2)
    other = room.park([("lock", "default", "api")], 3)
    room.on_freed(Freed(*LINE, wake_all=True))
    assert a.wake.is_set() and b.wake.is_set() and not other.wake.is_set()


def test_unparked_waiters_are_forgotten() -> None:
    room = WaitRoom()
    a = room.park([LINE], 1)
    room.unpark([LINE], a)
    room.on_freed(Freed(*LINE))  # nobody to wake: no error
    assert not a.wake.is_set()


LOCK = ("lock", "default", "k")


async def sweep_until(
    room: WaitRoom, keep_waiting: waiting.KeepWaiting, swept: asyncio.Event, at_once: int = 1
) -> None:
    """Run the room's sweep until `keep_waiting` sets `swept`, and let the
    sweep finish its bookkeeping."""
    sweeper = asyncio.create_task(room.sweep_forever(keep_waiting, at_once))
    try:
        await swept.wait()
        for _ in range(10):  # the gathered portions' answers, then the bookkeeping
            await asyncio.sleep(0)
    finally:
        sweeper.cancel()


def test_only_places_no_retry_refreshed_lately_are_running_out() -> None:
    room = WaitRoom()
    stale, fresh = room.park((LINE,), 1), room.park((LINE,), 2)
    other = room.park((LOCK,), 3)
    stale.refreshed, fresh.refreshed, other.refreshed = 100.0, 104.0, 99.0
    due = room.running_out(now=100.0 + REFRESH_AFTER_S)
    assert due == {LINE: [stale], LOCK: [other]}
    assert room.running_out(now=99.0 + REFRESH_AFTER_S - 0.5) == {}


def test_wake_heads_wakes_the_first_waiter_of_every_line() -> None:
    room = WaitRoom()
    a, b, c = room.park((LINE,), 1), room.park((LINE,), 2), room.park((LOCK,), 3)
    room.wake_heads()
    assert (a.wake.is_set(), b.wake.is_set(), c.wake.is_set()) == (True, False, True)


async def test_the_sweep_refreshes_what_ran_out_and_wakes_who_lost_its_place(
    monkeypatch,
) -> None:
    monkeypatch.setattr(waiting, "SWEEP_S", 0.0)
    room = WaitRoom()
    a, b = room.park((LINE,), 1), room.park((LOCK,), 2)  # never refreshed: both running out
    asked: list[dict[tuple[str, str, str], list[int]]] = []
    swept = asyncio.Event()

    async def keep_waiting(lines, alive_ms):  # type: ignore[no-untyped-def]
        asked.append(lines)
        assert alive_ms == waiting.WAITER_ALIVE_MS
        swept.set()
        return {LOCK: [2]}  # its place ran out in the store: it must rejoin

    await sweep_until(room, keep_waiting, swept)
    assert asked[0] == {LINE: [1], LOCK: [2]}
    assert a.refreshed > 0 and not a.wake.is_set()
    assert b.refreshed == 0 and b.wake.is_set()


def test_a_lock_set_parked_on_several_lines_wakes_from_any_and_leaves_all() -> None:
    room = WaitRoom()
    lines = [("lock", "default", "a"), ("lock", "default", "b")]
    waiting_set = room.park(lines, 1)
    room.on_freed(Freed(*lines[1]))
    assert waiting_set.wake.is_set()
    room.unpark(lines, waiting_set)
    assert room.parked() == 0


async def test_a_set_that_lost_one_of_its_places_is_woken_though_its_other_was_kept(
    monkeypatch,
) -> None:
    monkeypatch.setattr(waiting, "SWEEP_S", 0.0)
    room = WaitRoom()
    both = room.park((LINE, LOCK), 1)
    swept = asyncio.Event()

    async def keep_waiting(lines, alive_ms):  # type: ignore[no-untyped-def]
        swept.set()
        return {LOCK: [1]}

    await sweep_until(room, keep_waiting, swept)
    assert both.refreshed == 0 and both.wake.is_set()


def test_a_wake_up_left_unused_passes_to_the_next_waiter() -> None:
    room = WaitRoom()
    first, second = room.park((LINE,), 1), room.park((LINE,), 2)
    room.on_freed(Freed(*LINE))  # for `first`, which leaves without needing it
    room.unpark((LINE,), first)
    assert second.wake.is_set()


class _GatedLine:
    """A pool line whose tries wait for the test to answer them, so that an
    event can be made to arrive while a try is in flight. A first try's
    answer is a ticket (a join; None: granted), a retry's a grant (None:
    still refused)."""

    places = (LINE,)

    def __init__(self) -> None:
        # (what the try holds: None for a first try, else its ticket; the answer)
        self.tries: asyncio.Queue[tuple[int | None, asyncio.Future]] = asyncio.Queue()

    async def _asked(self, ticket: int | None):  # type: ignore[no-untyped-def]
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        await self.tries.put((ticket, answer))
        return await answer

    async def try_once(self, wait: bool) -> waiting.Outcome[str]:
        ticket = await self._asked(None)
        if ticket is None:
            return waiting.Outcome("slot-at-once")
        return waiting.Outcome(None, ticket=ticket, refusal=RuntimeError("busy"))  # type: ignore[arg-type]

    async def retry(self, ticket: int) -> waiting.Outcome[str]:
        granted = await self._asked(ticket)
        return waiting.Outcome(granted, ticket=None if granted else ticket,
                               refusal=None if granted else RuntimeError("busy"))  # type: ignore[arg-type]

    async def leave(self, ticket: int) -> None:
        pass

    async def hand_back(self, granted: str) -> None:
        pass

    def timed_out(self, last: waiting.Outcome[str]) -> Exception:  # type: ignore[override]
        return TimeoutError()


def _waiting(room: WaitRoom, line: _GatedLine, gone: asyncio.Event) -> asyncio.Task[str]:
    return asyncio.create_task(waiting.wait_for_grant(room, line, 60.0, gone))


async def _answer(line: _GatedLine, holding: int | None, answer: object) -> None:
    ticket, future = await asyncio.wait_for(line.tries.get(), timeout=5.0)
    assert ticket == holding
    future.set_result(answer)


async def test_two_releases_while_the_heads_retry_is_in_flight_admit_two() -> None:
    # Two slots are freed; the first release wakes the head, whose retry is in
    # flight (its wake cleared) when the second release's event arrives. That
    # event lands on the head again; the head is admitted by its retry, and the
    # second waiter must still be woken, not left for the safety wake.
    room, line, gone = WaitRoom(), _GatedLine(), asyncio.Event()
    head = _waiting(room, line, gone)
    await _answer(line, None, 1)  # joins: ticket 1
    nxt = _waiting(room, line, gone)
    await _answer(line, None, 2)
    await asyncio.sleep(0)  # both parked under their tickets
    room.on_freed(Freed(*LINE))  # the first release: wakes the head
    ticket, answer = await line.tries.get()
    assert ticket == 1
    room.on_freed(Freed(*LINE))  # the second release, while the head's retry runs
    answer.set_result("slot-1")
    assert await head == "slot-1"
    await _answer(line, 2, "slot-2")  # woken by the event the head did not need
    assert await nxt == "slot-2"


async def test_a_join_needs_no_retry_unless_an_event_came_while_it_was_in_flight() -> None:
    # The waiter parks before its first try: a release while the join is in
    # flight wakes it, and it retries at once; a join that nothing crossed
    # waits for an event, with no retry (one store operation per waiter).
    room, line, gone = WaitRoom(), _GatedLine(), asyncio.Event()
    quiet = _waiting(room, line, gone)
    await _answer(line, None, 1)
    for _ in range(5):
        await asyncio.sleep(0)  # the event loop's turns, not a wall-clock bound
    assert line.tries.empty() and not quiet.done()  # joined, parked, no retry
    crossed = _waiting(room, line, gone)
    ticket, join = await line.tries.get()
    assert ticket is None
    room.on_freed(Freed(*LINE))  # while the second join is in flight ...
    assert room._lines[LINE][0].wake.is_set()  # ... it goes to the first waiter
    room.on_freed(Freed(*LINE))  # a second event: to the waiter still joining
    join.set_result(2)
    await _answer(line, 1, None)  # the first waiter was woken: it retries
    await _answer(line, 2, "slot-2")  # the joining one was woken too: it retries at once
    assert await crossed == "slot-2"
    for _ in range(5):
        await asyncio.sleep(0)
    assert line.tries.empty() and not quiet.done()  # refused, parked again: no retry
    room.on_freed(Freed(*LINE))
    await _answer(line, 1, "slot-1")
    assert await quiet == "slot-1"


async def test_a_waiter_that_joins_takes_its_place_by_ticket_not_by_arrival() -> None:
    # Parked provisionally while the join is in flight, a waiter stands behind
    # every waiter with a ticket; its ticket then places it (an earlier
    # ticket drawn by a join that finished later goes ahead).
    room, line, gone = WaitRoom(), _GatedLine(), asyncio.Event()
    early = _waiting(room, line, gone)
    late = _waiting(room, line, gone)
    (_, join_early), (_, join_late) = await line.tries.get(), await line.tries.get()
    join_late.set_result(7)
    await asyncio.sleep(0)
    assert [p.ticket for p in room._lines[LINE]][0] == 7  # the provisional stands behind
    join_early.set_result(5)
    await asyncio.sleep(0)
    assert [p.ticket for p in room._lines[LINE]] == [5, 7]
    room.on_freed(Freed(*LINE))
    await _answer(line, 5, "slot-5")
    assert await early == "slot-5"
    gone.set()
    with pytest.raises(waiting.ClientGone):
        await late
    assert not room._lines


async def test_a_waiter_granted_or_refused_at_its_first_try_leaves_no_parked_trace() -> None:
    room, line, gone = WaitRoom(), _GatedLine(), asyncio.Event()
    other = _waiting(room, line, gone)
    await _answer(line, None, 1)
    at_once = _waiting(room, line, gone)
    _, join = await line.tries.get()
    room.on_freed(Freed(*LINE))  # lands on the first waiter
    room.on_freed(Freed(*LINE))  # lands on the provisional one, which then needs none
    join.set_result(None)  # granted at its first try
    assert await at_once == "slot-at-once"
    assert [p.ticket for p in room._lines[LINE]] == [1]
    await _answer(line, 1, None)
    gone.set()
    with pytest.raises(waiting.ClientGone):
        await other
    assert not room._lines


def test_the_sweep_leaves_provisional_waiters_alone() -> None:
    room = WaitRoom()
    joined = room.park((LINE,), 3)
    joining = room.park((LINE,))
    assert joining.provisional and not joined.provisional
    assert room.running_out(1e9) == {LINE: [joined]}


async def test_the_sweep_refreshes_many_places_in_portions(monkeypatch) -> None:
    # Waiters that parked together fall due together: their places are
    # refreshed in several small store operations, never one large one, and a
    # lock set whose place in its second line is gone (found in a later
    # portion) is woken, not counted as refreshed.
    monkeypatch.setattr(waiting, "SWEEP_S", 0.0)
    monkeypatch.setattr(waiting, "SWEEP_PORTION", 2)
    room = WaitRoom()
    singles = [room.park((LINE,), ticket) for ticket in (1, 2, 3)]
    both = room.park((LINE, LOCK), 4)
    asked: list[dict[tuple[str, str, str], list[int]]] = []
    swept = asyncio.Event()

    async def keep_waiting(lines, alive_ms):  # type: ignore[no-untyped-def]
        asked.append(lines)
        if sum(len(t) for t in asked_tickets(asked)) >= 5:
            swept.set()
        return {LOCK: [4]} if LOCK in lines else {}

    def asked_tickets(calls):  # type: ignore[no-untyped-def]
        return [tickets for call in calls for tickets in call.values()]

    await sweep_until(room, keep_waiting, swept)
    first_sweep = asked[:3]
    assert [sum(len(t) for t in call.values()) for call in first_sweep] == [2, 2, 1]
    assert sorted(t for call in first_sweep for t in call.get(LINE, [])) == [1, 2, 3, 4]
    assert [t for call in first_sweep for t in call.get(LOCK, [])] == [4]
    assert all(p.refreshed > 0 and not p.wake.is_set() for p in singles)
    assert both.refreshed == 0 and both.wake.is_set()


def test_an_expiry_timer_wakes_the_first_waiter_and_the_latest_timer_counts() -> None:
    async def scenario() -> None:
        room = WaitRoom()
        first, second = room.park((LOCK,), 1), room.park((LOCK,), 2)
        room.wake_first_at((LOCK,), 3600)  # an expiry the holder then moved ...
        room.wake_first_at((LOCK,), 0.01)  # ... to sooner: this timer replaces it
        await asyncio.sleep(0.1)  # an event loop's timer, not a wall-clock bound
        assert first.wake.is_set() and not second.wake.is_set()
        assert not room._expiry_timers  # fired and forgotten

    asyncio.run(scenario())


def test_an_expiry_timer_of_a_line_nobody_waits_in_is_cancelled() -> None:
    async def scenario() -> None:
        room = WaitRoom()
        waiter = room.park((LOCK,), 1)
        room.wake_first_at((LOCK,), 3600)
        timer = room._expiry_timers[LOCK]
        room.unpark((LOCK,), waiter)
        assert timer.cancelled() and not room._expiry_timers
        room.wake_first_at((LOCK,), 0.01)  # no line: no timer
        assert not room._expiry_timers

    asyncio.run(scenario())


@pytest.mark.parametrize("at_once", [1, 3])
async def test_the_sweep_keeps_as_many_portions_in_flight_as_the_store_writes_at_once(
    monkeypatch, at_once: int
) -> None:
    # Behind a backlog of long batches, portions refreshed one after another
    # each wait for a batch of their own: places ran out before the sweep
    # reached them. Up to the store's writers go at once; never more.
    monkeypatch.setattr(waiting, "SWEEP_S", 0.0)
    monkeypatch.setattr(waiting, "SWEEP_PORTION", 1)
    room = WaitRoom()
    parked = [room.park((LINE,), ticket) for ticket in range(1, 8)]
    in_flight, most = 0, 0
    swept = asyncio.Event()
    asked: list[int] = []

    async def keep_waiting(lines, alive_ms):  # type: ignore[no-untyped-def]
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        asked.extend(lines[LINE])
        if len(asked) >= len(parked):
            swept.set()
        return {}

    await sweep_until(room, keep_waiting, swept, at_once)
    assert sorted(asked[:len(parked)]) == list(range(1, 8))
    assert most == at_once
    assert all(p.refreshed > 0 for p in parked)
