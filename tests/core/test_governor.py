"""The adaptive control law and rate gate with a fake clock (no sleeps)."""

from __future__ import annotations

import math

from fencepost.core import governor as gov
from fencepost.core.governor import GovernorState, Outcome
from fencepost.core.ratelimit_headers import RateLimitInfo

T0 = 1_800_000_000_000
OK = Outcome(status=200, hold_ms=50)
THROTTLED = Outcome(status=429, hold_ms=50)


def report(state, outcome, now, configured=20, min_limit=1, adaptive=True, learns_rate=True):
    return gov.on_report(state, outcome, now, configured=configured, min_limit=min_limit,
                         adaptive=adaptive, learns_rate=learns_rate)


def test_throttling_cuts_the_limit_by_beta():
    state = report(gov.initial(20), THROTTLED, T0)
    assert state.limit == 20 * gov.BETA
    assert state.plateau == 20
    assert gov.effective_limit(state, 20, 1, True) == math.floor(20 * gov.BETA)


def test_a_burst_of_429s_within_one_round_trip_is_one_decrease():
    state = report(gov.initial(20), THROTTLED, T0)
    for offset in (1, 10, 40):
        state = report(state, THROTTLED, T0 + offset)
    assert state.limit == 20 * gov.BETA
    state = report(state, THROTTLED, T0 + 60)  # a round trip (~50 ms hold) later
    assert math.isclose(state.limit, 20 * gov.BETA * gov.BETA)


def test_other_throttle_signals():
    base = gov.initial(10)
    assert report(base, Outcome(status=200, throttled=2), T0).limit < 10
    assert report(base, Outcome(status=503, retry_after_ms=1000), T0).limit < 10
    assert report(base, Outcome(status=503), T0).limit == 10  # plain 503: not throttling
    hinted = Outcome(status=503, rate=RateLimitInfo(retry_after_ms=500))
    assert report(base, hinted, T0).limit < 10


def test_success_raises_about_one_per_round_trip_and_never_past_the_limit():
    state = GovernorState(limit=10.0)
    for i in range(10):
        state = report(state, OK, T0 + i)
    assert math.isclose(state.limit, 11.0, rel_tol=0.01)
    for i in range(1000):
        state = report(state, OK, T0 + i)
    assert state.limit == 20  # the configured limit is the ceiling


def test_never_below_min_limit():
    state = gov.initial(4)
    for i in range(50):
        state = report(state, THROTTLED, T0 + i * 1000, configured=4, min_limit=2)
    assert state.limit == 2
    assert gov.effective_limit(GovernorState(limit=0.5), 4, 2, True) == 2


def test_growth_is_slow_near_the_plateau_then_fast_again():
    state = report(gov.initial(20), THROTTLED, T0)  # plateau 20, limit 14
    now = T0
    while state.limit < 19:  # fast recovery below the plateau
        now += 1
        state = report(state, OK, now)
    fast_steps = now - T0
    before = state.limit
    for _ in range(20):
        now += 1
        state = report(state, OK, now)
    assert state.limit - before < 20 * (1 / before) * 0.2  # probing slowly
    later = now + gov.PLATEAU_MS
    quick = report(state, OK, later)
    assert quick.limit - state.limit > 0.9 / state.limit  # full speed after the plateau
    assert fast_steps < 200


def test_rpm_pools_keep_their_limit_but_honour_hints():
    state = report(gov.initial(8), Outcome(status=429, retry_after_ms=2_000), T0, adaptive=False)
    assert gov.effective_limit(state, 8, 1, False) == 8
    assert gov.pause_remaining_ms(state, T0) == 2_000


def test_retry_hint_pauses_then_resumes():
    state = report(gov.initial(8), Outcome(status=429, retry_after_ms=1_500), T0)
    assert gov.pause_remaining_ms(state, T0 + 500) == 1_000
    assert gov.pause_remaining_ms(state, T0 + 1_500) is None
    # a shorter hint later never shortens a pause
    state = report(state, Outcome(status=429, retry_after_ms=100), T0 + 600)
    assert gov.pause_remaining_ms(state, T0 + 1_000) == 500


def test_absurd_hints_are_capped():
    state = report(gov.initial(8), Outcome(status=429, retry_after_ms=10**12), T0)
    assert gov.pause_remaining_ms(state, T0) == gov.MAX_PAUSE_MS


def test_rate_state_teaches_rpm_and_window():
    rate = RateLimitInfo(request_limit=600, request_remaining=0, request_reset_ms=4_000)
    state = report(gov.initial(8), Outcome(status=200, rate=rate), T0)
    assert state.learned_rpm == 600
    assert state.window_reset_ms == T0 + 4_000
    assert gov.pause_remaining_ms(state, T0) == 4_000  # window spent
    assert gov.effective_rpm(1_000, state) == 600
    assert gov.effective_rpm(None, state) == 600
    assert gov.effective_rpm(300, state) == 300
    assert gov.effective_rpm(None, gov.initial(1)) is None


def test_hold_time_is_averaged():
    state = report(gov.initial(8), Outcome(status=200, hold_ms=100), T0)
    assert state.hold_ms == 100
    state = report(state, Outcome(status=200, hold_ms=200), T0)
    assert state.hold_ms == 100 + gov.HOLD_EWMA_WEIGHT * 100
    assert gov.round_trip_ms(GovernorState(limit=1, hold_ms=1)) == gov.MIN_ROUND_TRIP_MS


class TestRpmWindow:
    def test_admits_up_to_rpm_in_a_rolling_minute(self):
        assert gov.rpm_wait_ms(9, T0 - 30_000, 10, T0) is None
        assert gov.rpm_wait_ms(10, T0 - 30_000, 10, T0) == 30_000
        assert gov.rpm_wait_ms(10, T0 - 59_999, 10, T0) == 1

    def test_no_rpm_no_gate(self):
        assert gov.rpm_wait_ms(10**6, T0, None, T0) is None


def test_plain_pools_learn_nothing():
    hinted = Outcome(status=429, retry_after_ms=2_000,
                     rate=RateLimitInfo(request_limit=60, request_remaining=0, request_reset_ms=1))
    state = report(gov.initial(8), hinted, T0, adaptive=False, learns_rate=False)
    assert gov.pause_remaining_ms(state, T0) is None
    assert state.learned_rpm is None and state.limit == 8
