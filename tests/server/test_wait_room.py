"""The local wait room: who is woken by which event (no sleeps)."""

from __future__ import annotations

from fencepost.server.waiting import WaitRoom
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


def test_a_lock_set_parked_on_several_lines_wakes_from_any_and_leaves_all() -> None:
    room = WaitRoom()
    lines = [("lock", "default", "a"), ("lock", "default", "b")]
    waiting_set = room.park(lines, 1)
    room.on_freed(Freed(*lines[1]))
    assert waiting_set.wake.is_set()
    room.unpark(lines, waiting_set)
    assert room.parked() == 0
