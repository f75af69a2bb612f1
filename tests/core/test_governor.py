"""The adaptive control law and rate gate with a fake clock (no sleeps)."""

from __future__ import annotations

import math
from dataclasses import replace

from fencepost.core import governor as gov
from fencepost.core import slots
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
    state = GovernorState(limit=10.0, last_decrease_ms=T0)  # no latency probe due
    for i in range(10):
        state = report(state, OK, T0 + i)
    assert math.isclose(state.limit, 11.0, rel_tol=0.01)
    for i in range(1000):
        state = report(state, OK, T0 + i)
    assert state.limit == 20  # the configured limit is the ceiling


def test_a_latency_probe_keeps_the_lower_limit_when_calls_get_faster():
    # Everything admitted at once: every call is slow, there is no faster reference.
    quiet = GovernorState(limit=40.0, last_decrease_ms=T0 - gov.PROBE_EVERY_MS)  # long ago
    state = report(quiet, Outcome(status=200, hold_ms=3_000), T0, configured=40)
    assert state.probe_since_ms == T0 and state.limit == 40 * gov.PROBE_SHARE
    # still slow: admitted before the probe, it says nothing
    state = report(state, Outcome(status=200, hold_ms=3_000), T0 + 500, configured=40)
    assert state.probe_since_ms == T0 and state.limit == 20
    # admitted during the probe, and much faster: the upstream was congested
    state = report(state, Outcome(status=200, hold_ms=1_000), T0 + 1_200, configured=40)
    assert state.probe_since_ms == 0 and state.limit < 20.2
    assert state.base_hold_ms == 1_000


def test_a_latency_probe_is_undone_when_calls_are_no_faster():
    quiet = GovernorState(limit=40.0, last_decrease_ms=T0 - gov.PROBE_EVERY_MS)
    state = report(quiet, Outcome(status=200, hold_ms=200), T0, configured=40)
    assert state.limit == 20
    state = report(state, Outcome(status=200, hold_ms=210), T0 + 300, configured=40)
    assert state.probe_since_ms == 0 and state.limit >= 40
    # and the next probe waits PROBE_EVERY_MS
    state = report(state, Outcome(status=200, hold_ms=200), T0 + gov.PROBE_EVERY_MS - 1,
                   configured=40)
    assert state.limit >= 40 and state.probe_since_ms == 0


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


def spent(reset_ms, limit=600, window_ms=None, retry_after_ms=None):
    """What a holder reports when the upstream says its budget is spent."""
    return RateLimitInfo(request_limit=limit, request_remaining=0, request_reset_ms=reset_ms,
                         request_window_ms=window_ms, retry_after_ms=retry_after_ms,
                         retry_after_from="retry-after" if retry_after_ms else None)


def test_rpm_pools_keep_their_limit_and_pause_on_an_empty_budget():
    throttled = Outcome(status=429, rate=spent(2_000), hold_ms=5)
    state = report(gov.initial(8), throttled, T0, adaptive=False)
    assert gov.effective_limit(state, 8, 1, False) == 8
    assert gov.pause_remaining_ms(state, T0) == 2_000


def test_a_throttle_naming_no_budget_lowers_the_limit_and_does_not_pause():
    # A cap on calls in progress: 429 with a whole-second Retry-After, no rate headers.
    capped = Outcome(status=429, rate=RateLimitInfo(retry_after_ms=1_000,
                                                    retry_after_from="retry-after"), hold_ms=5)
    state = report(gov.initial(8), capped, T0)
    assert gov.pause_remaining_ms(state, T0) is None
    assert state.limit == 8 * gov.BETA
    assert state.last_hint == gov.Hint("retry-after", 1_000, T0)
    # and a budget that is not spent (remaining > 0) is no reason to pause either
    named = RateLimitInfo(request_limit=600, request_remaining=40, request_reset_ms=90,
                          retry_after_ms=1_000)
    state = report(gov.initial(8), Outcome(status=429, rate=named), T0)
    assert gov.pause_remaining_ms(state, T0) is None and state.limit < 8


def test_an_empty_budget_pauses_for_the_most_precise_time():
    # OpenAI: retry-after rounded up to 1 s, the reset in milliseconds
    state = report(gov.initial(8), Outcome(status=429, rate=spent(150, retry_after_ms=1_000)), T0)
    assert gov.pause_remaining_ms(state, T0) == 150
    assert state.last_hint == gov.Hint("reset", 150, T0)
    assert state.limit == 8  # the rate's doing, not the concurrency's
    # remaining 0 without a reset: the retry hint is all there is
    state = report(gov.initial(8), Outcome(status=429, rate=spent(None, retry_after_ms=3_000)),
                   T0)
    assert gov.pause_remaining_ms(state, T0) == 3_000
    # the last call succeeded with remaining 0: pacing spaces the next, no pause
    state = report(gov.initial(8), Outcome(status=200, rate=spent(400)), T0)
    assert gov.pause_remaining_ms(state, T0) is None and state.learned_rpm == 600


def test_hinted_throttles_from_several_holders_with_no_success_pause():
    hinted = Outcome(status=429, retry_after_ms=1_000, hold_ms=5)
    state = report(gov.initial(8), Outcome(status=200, hold_ms=100), T0)  # calls take ~100 ms
    now = T0
    for _ in range(gov.EMPTY_STREAK):
        now += 50
        state = report(state, hinted, now)
        assert gov.pause_remaining_ms(state, now) is None  # a success came <= 150 ms ago
    now += 100  # 250 ms without a success, more than two round trips
    state = report(state, hinted, now)
    assert gov.pause_remaining_ms(state, now) == 1_000


def test_a_concurrency_cap_never_pauses_the_pool():
    hinted = Outcome(status=429, retry_after_ms=1_000, hold_ms=5)
    ok = Outcome(status=200, hold_ms=100)
    state = gov.initial(20)
    now = T0
    for _ in range(200):  # three throttles for every success, successes every 25 ms
        now += 25
        state = report(state, ok, now)
        for _ in range(3):
            state = report(state, hinted, now)
        assert gov.pause_remaining_ms(state, now) is None


def test_only_a_call_admitted_during_the_pause_ends_it_early():
    state = report(gov.initial(8), Outcome(status=429, rate=spent(10_000)), T0)
    # admitted before the pause (held 500 ms): says nothing about the budget now
    state = report(state, Outcome(status=200, hold_ms=500), T0 + 100)
    assert gov.pause_remaining_ms(state, T0 + 100) == 9_900
    # a probe admitted during the pause got through: resume
    state = report(state, Outcome(status=200, hold_ms=50), T0 + 300)
    assert gov.pause_remaining_ms(state, T0 + 300) is None
    assert gov.probe_wait_ms(state, T0 + 300) is None


def test_probes_during_a_pause_start_at_one_refill_interval_and_double():
    state = report(gov.initial(8), Outcome(status=429, rate=spent(6_000, limit=600)), T0)
    assert gov.refill_interval_ms(state) == 100  # 600 a minute
    assert gov.probe_wait_ms(state, T0) == 100
    now, probes = T0, []
    while (wait := gov.probe_wait_ms(state, now)) is not None:
        now += wait
        if gov.pause_remaining_ms(state, now) is None:
            break
        probes.append(now - T0)
        state = gov.after_probe(state, now)
    assert probes == [100, 300, 700, 1_500, 3_100]  # gaps 100, 200, 400, 800, 1600
    assert gov.probe_wait_ms(state, T0 + 6_000) is None  # the pause is over


def test_a_shorter_hint_later_never_shortens_a_pause():
    state = report(gov.initial(8), Outcome(status=429, rate=spent(1_500)), T0)
    state = report(state, Outcome(status=429, rate=spent(100)), T0 + 600)
    assert gov.pause_remaining_ms(state, T0 + 1_000) == 500
    assert gov.pause_remaining_ms(state, T0 + 1_500) is None


def test_absurd_hints_are_capped():
    absurd = Outcome(status=429, rate=spent(None, retry_after_ms=10**12), reporter="a")
    state = report(gov.initial(8), absurd, T0)
    assert gov.pause_remaining_ms(state, T0) == gov.ONE_REPORTER_PAUSE_MS
    state = report(state, replace(absurd, reporter="b"), T0 + 1)
    # Ten minutes from the first claim, both reporters' claims being capped.
    assert gov.pause_remaining_ms(state, T0) == gov.MAX_PAUSE_MS


def test_one_reporter_alone_pauses_for_a_minute_at_most():
    ten_minutes = Outcome(status=429, rate=spent(600_000), reporter="hostile")
    state = report(gov.initial(8), ten_minutes, T0)
    assert gov.pause_remaining_ms(state, T0) == 60_000
    # Saying it again, and again, from the same key: a minute from its latest word.
    for offset in (1_000, 30_000, 59_000):
        state = report(state, ten_minutes, T0 + offset)
        assert gov.pause_remaining_ms(state, T0 + offset) == 60_000
    # No report at all for a minute: the pause is over, admissions go on.
    assert gov.pause_remaining_ms(state, T0 + 59_000 + 60_000) is None
    # Anonymous reports (no key known) are one reporter too.
    anonymous = replace(ten_minutes, reporter=None)
    state = report(report(gov.initial(8), anonymous, T0), anonymous, T0 + 1)
    assert gov.pause_remaining_ms(state, T0 + 1) == 60_000


def test_a_second_reporter_extends_the_pause_as_far_as_both_say():
    first = Outcome(status=429, rate=spent(600_000), reporter="a")
    state = report(gov.initial(8), first, T0)
    # b says 5 minutes: both agree on at least that much.
    state = report(state, Outcome(status=429, rate=spent(300_000), reporter="b"), T0 + 1_000)
    assert gov.pause_remaining_ms(state, T0 + 1_000) == 300_000
    # c says more than b did: the pause runs as far as both say, b's 5 minutes.
    state = report(state, Outcome(status=429, rate=spent(400_000), reporter="c"), T0 + 2_000)
    assert gov.pause_remaining_ms(state, T0 + 2_000) == 299_000
    # and d, agreeing with c, takes it to c's claim (the shorter of the two).
    state = report(state, Outcome(status=429, rate=spent(500_000), reporter="d"), T0 + 3_000)
    assert gov.pause_remaining_ms(state, T0 + 3_000) == 399_000
    # A short hint never shortens it.
    state = report(state, Outcome(status=429, rate=spent(10), reporter="e"), T0 + 3_500)
    assert gov.pause_remaining_ms(state, T0 + 3_500) == 398_500
    # A success of a call admitted during the pause still ends it, and forgets who asked.
    state = report(state, Outcome(status=200, hold_ms=10), T0 + 4_000)
    assert gov.pause_remaining_ms(state, T0 + 4_000) is None
    assert state.pause_reporter is None and state.pause_claim_ms == 0


def test_rate_state_teaches_the_quota_and_its_window():
    rate = RateLimitInfo(request_limit=600, request_remaining=10, request_reset_ms=4_000)
    state = report(gov.initial(8), Outcome(status=200, rate=rate), T0)
    assert state.learned_rpm == 600 and state.window_ms == gov.DEFAULT_WINDOW_MS
    assert state.window_reset_ms == T0 + 4_000
    share = gov.LEARNED_PACE_SHARE  # learned rates are paced a little below
    assert gov.effective_rpm(1_000, state) == round(600 * share)
    assert gov.effective_rpm(None, state) == round(600 * share)
    assert gov.effective_rpm(300, state) == 300
    assert gov.effective_rpm(None, gov.initial(1)) is None
    # GitHub: 5000 an hour is about 83 a minute, not 5000
    hourly = RateLimitInfo(request_limit=5_000, request_remaining=4_000,
                           request_window_ms=3_600_000)
    state = report(gov.initial(8), Outcome(status=200, rate=hourly), T0)
    assert state.window_ms == 3_600_000
    assert gov.effective_rpm(None, state) == round(5_000 / 60 * share)
    assert gov.pace_interval_ms(None, state) == 720 / share


class TestPacing:
    def test_admissions_are_spaced_by_the_interval_with_a_small_burst(self):
        interval = gov.pace_interval_ms(600, gov.initial(1))
        assert interval == 100
        tat, now, admitted = 0.0, T0, []
        for _ in range(100):  # 1 s of many callers trying every 10 ms
            while slots.pace_wait_ms(tat, interval, now) is None:
                admitted.append(now - T0)
                tat = slots.paced(tat, interval, now)
            now += 10
        assert admitted[:slots.PACE_BURST] == [0] * slots.PACE_BURST  # the burst allowed
        assert len(admitted) == 10 + slots.PACE_BURST - 1  # about 10 a second, not 600
        paced = admitted[slots.PACE_BURST - 1:]
        gaps = [b - a for a, b in zip(paced, paced[1:], strict=False)]
        assert gaps and all(g == 100 for g in gaps)

    def test_wait_until_the_next_turn(self):
        assert slots.pace_wait_ms(T0 + 500.0, 100.0, T0) == 400 - 100 * (slots.PACE_BURST - 2)
        assert slots.pace_wait_ms(T0 + 500.0, None, T0) is None

    def test_idle_time_is_not_saved_up(self):
        tat = slots.paced(float(T0), 100.0, T0 + 60_000)
        assert tat == T0 + 60_100


def test_a_slowing_upstream_counts_as_congestion_once_a_probe_proved_it():
    quiet = GovernorState(limit=40.0, last_decrease_ms=T0 - gov.PROBE_EVERY_MS)
    state = report(quiet, Outcome(status=200, hold_ms=600), T0, configured=40)  # probe: 20
    now = T0 + 300
    state = report(state, Outcome(status=200, hold_ms=250), now, configured=40)
    assert state.latency_bound and 20 <= state.limit < 20.2  # faster at a lower limit
    for _ in range(20):  # unloaded: 100 ms calls
        now += 10
        state = report(state, Outcome(status=200, hold_ms=100), now, configured=40)
    before = state.limit
    for _ in range(20):  # calls now take three times as long, and never 429
        now += 10
        state = report(state, Outcome(status=200, hold_ms=300), now, configured=40)
    assert state.limit < before and state.plateau is not None


def test_a_service_slower_for_everyone_is_not_congestion():
    quiet = GovernorState(limit=20.0, last_decrease_ms=T0 - gov.PROBE_EVERY_MS)
    state = report(quiet, Outcome(status=200, hold_ms=100), T0)  # probe: 10
    state = report(state, Outcome(status=200, hold_ms=100), T0 + 200)  # no faster
    assert not state.latency_bound and state.limit >= 20
    now = T0 + 200
    for _ in range(150):  # every call three times as long, at any limit
        now += 10
        state = report(state, Outcome(status=200, hold_ms=300), now)
    # slow calls were suspect; a probe found them no faster at half the limit:
    # the limit is back, and the slower time is the new baseline
    assert state.limit == 20 and not state.latency_bound and state.probe_since_ms == 0
    assert state.base_hold_ms == 300


def test_hold_time_is_averaged():
    state = report(gov.initial(8), Outcome(status=200, hold_ms=100), T0)
    assert state.hold_ms == 100
    state = report(state, Outcome(status=200, hold_ms=200), T0)
    assert state.hold_ms == 100 + gov.HOLD_EWMA_WEIGHT * 100
    assert gov.round_trip_ms(GovernorState(limit=1, hold_ms=1)) == gov.MIN_ROUND_TRIP_MS


def test_plain_pools_learn_nothing():
    hinted = Outcome(status=429, retry_after_ms=2_000,
                     rate=RateLimitInfo(request_limit=60, request_remaining=0, request_reset_ms=1))
    state = report(gov.initial(8), hinted, T0, adaptive=False, learns_rate=False)
    assert gov.pause_remaining_ms(state, T0) is None
    assert state.learned_rpm is None and state.limit == 8


def test_no_latency_probe_while_the_upstream_throttles():
    quiet = GovernorState(limit=20.0, last_decrease_ms=T0 - gov.PROBE_EVERY_MS,
                          latency_bound=True, base_hold_ms=100.0, ok_hold_ms=100.0)
    state = report(quiet, THROTTLED, T0)
    assert not state.latency_bound and state.last_throttle_ms == T0
    now = T0
    for _ in range(50):  # slow successes: suspect, but 429s are telling the limit
        now += 100
        state = report(state, Outcome(status=200, hold_ms=400), now)
        assert state.probe_since_ms == 0
    assert now - T0 < gov.PROBE_EVERY_MS


# --- slow start (SPEC §4.5) -------------------------------------------------------


def test_a_new_pool_starts_low_and_doubles_each_round_trip() -> None:
    state = gov.starting(20, 1)
    assert (state.limit, state.slow_start) == (gov.SLOW_START_FROM, True)
    now = 1_000
    for expected in (4, 8, 16):
        for _ in range(int(state.limit)):  # a round trip: every slot succeeds once
            now += 10
            state = report(state, OK, now)
        assert state.limit == expected and state.slow_start
    for _ in range(16):
        now += 10
        state = report(state, OK, now)
    assert state.limit == 20 and not state.slow_start  # ends at the configured limit


def test_the_first_throttle_ends_slow_start() -> None:
    state = report(gov.starting(20, 1), OK, 1_000)
    state = report(state, THROTTLED, 1_100)
    assert not state.slow_start and state.limit == 3 * gov.BETA
    state = report(state, OK, 1_200)
    assert state.limit < 3 * gov.BETA + 1  # about one slot a round trip now


def test_slow_start_respects_a_higher_floor_and_a_small_limit() -> None:
    assert gov.starting(20, 5).limit == 5
    tiny = gov.starting(2, 1)
    assert tiny.limit == 2 and not tiny.slow_start  # nothing to grow into


def test_stale_evidence_restarts_from_a_quarter() -> None:
    state = GovernorState(limit=40.0, last_success_ms=1_000)
    assert gov.effective_limit(state, 40, 1, True, 1_000 + gov.STALE_MS) == 40
    later = 1_000 + gov.STALE_MS + 1
    assert gov.stale(state, later)
    assert gov.effective_limit(state, 40, 1, True, later) == 10
    assert gov.effective_limit(state, 40, 1, False, later) == 40  # fixed pools: as set
    restarted = report(state, OK, later, configured=40)
    assert restarted.slow_start and restarted.limit == 11
    assert not gov.stale(restarted, later)
