"""The client's key-refresh schedule with injected clocks: no sleeps, no I/O."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fencepost.client.key_refresh import RETRY_AFTER_FAILURE_S, KeyRefresh

WALL0 = datetime(2026, 12, 1, tzinfo=UTC)


class Clocks:
    def __init__(self) -> None:
        self.mono = 100.0
        self.wall = WALL0.timestamp()

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def schedule() -> tuple[KeyRefresh, Clocks]:
    clocks = Clocks()
    return KeyRefresh(wall=lambda: clocks.wall, monotonic=lambda: clocks.mono), clocks


def test_due_to_learn_first_then_after_two_thirds_of_the_remaining_life() -> None:
    state, clocks = schedule()
    assert state.is_due() and not state.known
    state.learn(WALL0 + timedelta(seconds=90))
    assert not state.is_due()
    clocks.advance(59.9)
    assert not state.is_due()
    clocks.advance(0.1)
    assert state.is_due()


def test_a_successor_is_measured_from_its_creation_not_the_local_wall_clock() -> None:
    state, clocks = schedule()
    clocks.wall += 3600  # the local wall clock is an hour off the server's
    state.learn(WALL0 + timedelta(seconds=30), created_at=WALL0)
    clocks.advance(19.9)
    assert not state.is_due()
    clocks.advance(0.1)
    assert state.is_due()


def test_a_key_without_expiry_is_never_due_and_a_failure_backs_off() -> None:
    state, clocks = schedule()
    state.learn(None)
    clocks.advance(10**9)
    assert not state.is_due()
    state.learn(WALL0 + timedelta(seconds=3))
    clocks.advance(2)
    assert state.is_due()
    state.failed()
    assert not state.is_due()
    clocks.advance(RETRY_AFTER_FAILURE_S)
    assert state.is_due()


def test_a_refusal_that_names_a_wait_is_retried_after_it() -> None:
    # A lineage refreshes once a minute (SPEC §5): keys sharing a first key
    # may be refused with Retry-After, and asking every few seconds meanwhile
    # would only be refused again.
    state, clocks = schedule()
    state.learn(WALL0 + timedelta(seconds=3600))
    clocks.advance(2401)
    assert state.is_due()
    state.failed(retry_after_s=42.0)
    clocks.advance(41.9)
    assert not state.is_due()
    clocks.advance(0.1)
    assert state.is_due()
