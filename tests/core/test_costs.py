"""The unit budget's rules (SPEC §4.6, core/costs.py) on a fake clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fencepost.core import costs
from fencepost.core.costs import COST_BURST_MS, CostState

BUDGET = 60_000.0  # one unit a millisecond


def test_no_budget_never_waits_and_has_nothing_remaining() -> None:
    state = CostState()
    assert costs.per_minute(None, state) is None
    assert costs.wait_ms(state, None, 0) is None
    assert costs.remaining(state, None, 0) is None


def test_a_learned_budget_is_paced_a_little_below_and_the_lower_one_wins() -> None:
    learned = CostState(learned_per_minute=90_000)
    assert costs.per_minute(None, learned) == 90_000 * costs.LEARNED_SHARE
    assert costs.per_minute(60_000, learned) == 60_000
    assert costs.per_minute(100_000, learned) == 90_000 * costs.LEARNED_SHARE


def test_calls_conform_while_what_was_spent_refills_within_a_second() -> None:
    now = 1_000_000
    state = CostState()
    admitted = 0
    while costs.wait_ms(state, BUDGET, now) is None:
        state = costs.admitted(state, 400, True, BUDGET, now)
        admitted += 1
    # 400 units each, one second of budget (1,000 units) of tolerance: three go.
    assert admitted == 3
    assert costs.wait_ms(state, BUDGET, now) == 3 * 400 - COST_BURST_MS


def test_conformance_does_not_depend_on_the_call_s_own_size() -> None:
    state = costs.admitted(CostState(), 500, True, BUDGET, 0)
    assert costs.wait_ms(state, BUDGET, 0) is None  # a call of 10 or of 10,000 alike


def test_an_undeclared_cost_is_charged_the_average() -> None:
    assert costs.charge(None, CostState()) == 0
    state = costs.admitted(CostState(), 1_000, True, BUDGET, 0)
    assert costs.charge(None, state) == 1_000
    state = costs.admitted(state, 2_000, True, BUDGET, 0)
    assert costs.charge(None, state) == 1_100  # moved a tenth of the way
    assert costs.charge(7, state) == 7


def test_a_release_settles_the_difference() -> None:
    state = costs.admitted(CostState(), 1_000, True, BUDGET, 0)
    assert state.tat_ms == 1_000
    cheaper = costs.released(state, 1_000, 200, BUDGET)
    assert cheaper.tat_ms == 200
    dearer = costs.released(state, 1_000, 3_000, BUDGET)
    assert dearer.tat_ms == 3_000


def test_the_upstream_s_count_moves_the_clock_forward_only() -> None:
    now = 10_000
    state = costs.learned(CostState(), 60_000, 30_000, None, now)
    assert state.learned_per_minute == 60_000
    # Half the budget spent upstream: that half refills over 30 s (at the paced budget).
    assert abs(state.tat_ms - (now + 30_000 * costs.unit_ms(60_000 * costs.LEARNED_SHARE))) < 1
    fuller = costs.learned(state, 60_000, 59_000, None, now)
    assert fuller.tat_ms == state.tat_ms  # never back: our own calls may be unseen upstream


def test_remaining_is_the_minute_s_budget_less_what_is_owed() -> None:
    state = costs.admitted(CostState(), 15_000, True, BUDGET, 0)
    assert costs.remaining(state, BUDGET, 0) == 45_000
    assert costs.remaining(state, BUDGET, 15_000) == 60_000


@given(st.lists(st.integers(min_value=0, max_value=50_000), min_size=1, max_size=200),
       st.integers(min_value=1, max_value=200))
def test_paced_admissions_never_exceed_the_budget_over_a_window(
    sizes: list[int], step_ms: int,
) -> None:
    """Whatever the call sizes and arrivals, the units admitted by any instant
    t stay within what refilled by t, plus the second of tolerance and the
    last call admitted."""
    state, now, admitted = CostState(), 0, 0
    for size in sizes:
        while costs.wait_ms(state, BUDGET, now) is not None:
            now += step_ms
        state = costs.admitted(state, size, True, BUDGET, now)
        admitted += size
        assert admitted <= now * BUDGET / 60_000 + BUDGET / 60 + size
