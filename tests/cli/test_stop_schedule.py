"""The rules of `fencepost run`'s stop schedule (fencepost.cli.stopping)."""

from __future__ import annotations

import pytest

from fencepost.cli.stopping import (
    DEFAULT_GRACE_S,
    MIN_LOCK_WINDOW_S,
    StopSchedule,
    choose_grace,
    margin_for,
)


def test_the_margin_is_a_second_and_a_drift_allowance_or_a_quarter_of_a_short_lease() -> None:
    assert margin_for(60) == pytest.approx(1.06)
    assert margin_for(5) == pytest.approx(1.005)
    assert margin_for(3) == pytest.approx(0.75)
    assert margin_for(1) == pytest.approx(0.25)


def test_sigkill_comes_before_the_lease_can_end_and_sigterm_a_grace_earlier() -> None:
    schedule = StopSchedule(lease_s=60, grace_s=10, last_sent=100.0, cap=10_000.0)
    assert schedule.kill_at() == pytest.approx(160 - 1.06)
    assert schedule.term_at() == pytest.approx(160 - 1.06 - 10)
    schedule.granted(120.0)  # a renewal sent later moves both on
    assert schedule.kill_at() == pytest.approx(180 - 1.06)
    schedule.granted(110.0)  # an older send (answered late) never moves them back
    assert schedule.kill_at() == pytest.approx(180 - 1.06)


def test_the_cap_bounds_the_lease_whatever_the_renewals() -> None:
    schedule = StopSchedule(lease_s=30, grace_s=5, last_sent=0.0, cap=40.0)
    schedule.granted(20.0)
    assert schedule.kill_at() == pytest.approx(40 - margin_for(30))


def test_grace_must_leave_room_for_renewals() -> None:
    assert choose_grace(1, 6, MIN_LOCK_WINDOW_S) == 1
    assert choose_grace(None, 60, MIN_LOCK_WINDOW_S) == DEFAULT_GRACE_S
    # The default shrinks to fit a short lease; it is never negative.
    assert choose_grace(None, 6, MIN_LOCK_WINDOW_S) == pytest.approx(6 - 1.006 - 1.5)
    assert choose_grace(None, 5, MIN_LOCK_WINDOW_S) == pytest.approx(5 - 1.005 - 1.5)
    with pytest.raises(ValueError, match="at most 2.49 s fits"):
        choose_grace(3, 5, MIN_LOCK_WINDOW_S)
    # A lease too short for its renewals fits no grace, not even the default.
    for asked in (0, None):
        with pytest.raises(ValueError, match="leaves no time"):
            choose_grace(asked, 3, 2.5)
