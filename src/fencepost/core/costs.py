"""Unit budgets (SPEC §4.6): a pool that knows how many units (tokens) per
minute its upstream allows admits a call only when its cost fits, spread over
the minute as call rates are.

The budget is a GCRA clock (as slots.py paces calls): `tat_ms`, the
theoretical time at which every unit admitted so far has been refilled. A
call conforms while the units it finds spent refill within COST_BURST_MS (so a
budget of 90,000 a minute lets about 1,500 go in any second, not 90,000 in the
first); it is then charged its cost, pushing the clock by `cost` refill
intervals. Conformance looks only at what was spent before: a call of 1,800
tokens waits no longer than one of 200, so the line's order (the head goes
first) keeps a large call from being starved by small ones.

A call that declares no cost is charged the pool's running average; a release
that says what the call really spent moves the clock by the difference, and
the average toward it. The upstream's own count wins when it is higher: a
report of `remaining` units moves the clock to where that many are left
(another client of the same account spends the budget too).

Everything here is pure: the store keeps the state, `now_ms` is a parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MINUTE_MS = 60_000
# Units that may go back to back: those that refill in this long.
COST_BURST_MS = 1_000
# The running average's weight for each new call.
AVERAGE_WEIGHT = 0.1
# A learned budget is paced a little below what the upstream states, as learned
# rates are (governor.LEARNED_PACE_SHARE): pacing at exactly the refill rate
# keeps a continuously refilling budget at zero, where any early call is refused.
LEARNED_SHARE = 0.99
MAX_COST = 10**9


@dataclass(frozen=True, slots=True)
class CostState:
    """What a pool keeps about its unit budget."""

    tat_ms: float = 0.0
    average: float | None = None  # running average of what calls cost
    learned_per_minute: int | None = None  # the budget the upstream's headers state


def per_minute(configured: int | None, state: CostState) -> float | None:
    """The budget to pace by: the configured one, or the learned one a little
    under what the upstream states, whichever is lower (None: no unit budget)."""
    learned = None if state.learned_per_minute is None else (
        state.learned_per_minute * LEARNED_SHARE)
    budgets = [b for b in (configured, learned) if b is not None and b > 0]
    return min(budgets) if budgets else None


def unit_ms(budget: float) -> float:
    """How long one unit takes to refill."""
    return MINUTE_MS / budget


def charge(cost: int | None, state: CostState) -> int:
    """What a call is charged at admission: its declared cost, else the average
    (0 while nothing is known)."""
    if cost is not None:
        return cost
    return 0 if state.average is None else math.ceil(state.average)


def wait_ms(state: CostState, budget: float | None, now_ms: int) -> int | None:
    """ms until one more call conforms to the unit budget (None: now)."""
    if budget is None:
        return None
    allowed_from = state.tat_ms - COST_BURST_MS
    return None if now_ms >= allowed_from else max(1, math.ceil(allowed_from - now_ms))


def _averaged(average: float | None, cost: float) -> float:
    return cost if average is None else average + AVERAGE_WEIGHT * (cost - average)


def admitted(state: CostState, charged: int, declared: bool, budget: float | None,
             now_ms: int) -> CostState:
    """The state after admitting a call charged `charged` units (`declared`: the
    caller said so, which the average learns from)."""
    tat = state.tat_ms
    if budget is not None:
        tat = max(tat, float(now_ms)) + charged * unit_ms(budget)
    average = _averaged(state.average, charged) if declared else state.average
    return CostState(tat, average, state.learned_per_minute)


def released(state: CostState, charged: int, actual: int, budget: float | None) -> CostState:
    """The state after a release that reports what the call really spent: the
    clock moves by the difference from its charge, the average toward it."""
    tat = state.tat_ms
    if budget is not None:
        tat += (actual - charged) * unit_ms(budget)
    average = state.average
    average = actual if average is None else average + AVERAGE_WEIGHT * (actual - charged)
    return CostState(tat, max(0.0, average), state.learned_per_minute)


def learned(state: CostState, limit: int | None, remaining: int | None, configured: int | None,
            now_ms: int) -> CostState:
    """The state after the upstream stated its unit budget (`limit` per minute)
    and what is `remaining` of it: the learned budget, and the clock moved
    forward to where the upstream's count says the budget stands."""
    new = state
    if limit is not None and limit > 0:
        new = CostState(state.tat_ms, state.average, limit)
    budget = per_minute(configured, new)
    if budget is not None and remaining is not None and new.learned_per_minute is not None:
        spent = max(0, new.learned_per_minute - remaining)
        upstream_tat = now_ms + spent * unit_ms(budget)
        new = CostState(max(new.tat_ms, upstream_tat), new.average, new.learned_per_minute)
    return new


def remaining(state: CostState, budget: float | None, now_ms: int) -> int | None:
    """Units of the minute's budget not yet spoken for (X-Remaining-Cost)."""
    if budget is None:
        return None
    owed = max(0.0, state.tat_ms - now_ms) / unit_ms(budget)
    return max(0, math.floor(budget - owed))
