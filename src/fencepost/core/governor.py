"""Adaptive admission for pools (SPEC §4.5): learn an upstream's real capacity
from the outcomes that slot holders report on release.

The control law is AIMD, as in TCP congestion control (RFC 5681) and Netflix's
concurrency-limits library: add about one slot per round trip while calls
succeed, multiply by BETA when the upstream throttles. Two refinements keep the
throttled share low once the limit has been found:

- one decrease per round trip (the pool's typical slot hold time), as TCP
  reduces once per window, so a burst of 429s from one overload is one signal;
- a plateau near the limit where throttling last began (CUBIC, RFC 8312): for
  PLATEAU_MS after a decrease the limit climbs back quickly to one slot below
  that point, crosses that last slot slowly, so the pool sits near capacity
  instead of crossing it every few round trips, and past the plateau (or after
  PLATEAU_MS) grows at full speed again, which finds capacity that came back.

Retry hints pause new admissions of the pool; reported rate-limit state teaches
a per-minute rate and when the upstream's window resets. Everything here is
pure: the store keeps the state, `now_ms` is a parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fencepost.core.ratelimit_headers import RateLimitInfo

# Multiplicative decrease. CUBIC uses 0.7; measured in bench/adaptive, 0.85
# keeps goodput near capacity at steady state (a failed probe costs one slot,
# not a third of them) at the price of more round trips to shed a big overload.
BETA = 0.85
PLATEAU_MS = 5_000
SLOW_PROBE = 0.1  # share of the normal increase while probing past the plateau
MIN_ROUND_TRIP_MS = 20
HOLD_EWMA_WEIGHT = 0.2
MAX_PAUSE_MS = 600_000  # never trust a retry hint longer than ten minutes


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one release reported, with how long the slot was held."""

    status: int | None = None
    throttled: int = 0
    retry_after_ms: int | None = None
    rate: RateLimitInfo | None = None
    hold_ms: int | None = None

    @property
    def was_throttled(self) -> bool:
        hinted = self.retry_after_ms is not None or (
            self.rate is not None and self.rate.retry_after_ms is not None
        )
        return self.status == 429 or self.throttled > 0 or (self.status == 503 and hinted)

    @property
    def retry_hint_ms(self) -> int | None:
        hints = [h for h in (self.retry_after_ms, self.rate and self.rate.retry_after_ms) if h]
        return max(hints) if hints else None


@dataclass(frozen=True, slots=True)
class GovernorState:
    limit: float  # the learned concurrency limit (admit while in_use < floor(limit))
    plateau: float | None = None  # the limit at which throttling last began
    last_decrease_ms: int = 0
    hold_ms: float | None = None  # EWMA of how long a slot is held: the round trip
    paused_until_ms: int = 0
    learned_rpm: int | None = None  # requests per minute the upstream says it allows
    window_reset_ms: int | None = None  # when the upstream's current window resets


def initial(limit: int) -> GovernorState:
    return GovernorState(limit=float(limit))


def effective_limit(state: GovernorState, configured: int, min_limit: int, adaptive: bool) -> int:
    if not adaptive:
        return configured
    return max(min_limit, min(configured, math.floor(state.limit)))


def round_trip_ms(state: GovernorState) -> float:
    return max(float(MIN_ROUND_TRIP_MS), state.hold_ms or 0.0)


def on_report(
    state: GovernorState,
    outcome: Outcome,
    now_ms: int,
    *,
    configured: int,
    min_limit: int,
    adaptive: bool,
    learns_rate: bool = True,
) -> GovernorState:
    """The state after one reported outcome. `adaptive` pools move their limit;
    pools that `learns_rate` (adaptive, or with an rpm) honour retry hints and
    learn the upstream's rate."""
    if outcome.hold_ms is not None and outcome.hold_ms >= 0:
        previous = state.hold_ms if state.hold_ms is not None else float(outcome.hold_ms)
        hold = previous + HOLD_EWMA_WEIGHT * (outcome.hold_ms - previous)
        state = replace(state, hold_ms=hold)
    if learns_rate:
        state = _learn_rate(state, outcome, now_ms)
        hint = outcome.retry_hint_ms
        if hint is not None and hint > 0:
            until = now_ms + min(hint, MAX_PAUSE_MS)
            state = replace(state, paused_until_ms=max(state.paused_until_ms, until))
    if not adaptive:
        return state
    if outcome.was_throttled:
        return _decrease(state, now_ms, min_limit)
    if outcome.status is not None and outcome.status < 500:
        return _increase(state, now_ms, configured)
    return state  # a 5xx that is not throttling says nothing about capacity


def _decrease(state: GovernorState, now_ms: int, min_limit: int) -> GovernorState:
    if now_ms - state.last_decrease_ms < round_trip_ms(state):
        return state  # the same overload, already answered
    return replace(
        state,
        plateau=state.limit,
        limit=max(float(min_limit), state.limit * BETA),
        last_decrease_ms=now_ms,
    )


def _increase(state: GovernorState, now_ms: int, configured: int) -> GovernorState:
    step = 1.0 / max(state.limit, 1.0)  # about +1 per round trip of `limit` successes
    # Slow only in the last slot below the plateau: once past it, capacity has
    # come back (or was never there) and full speed finds the new level soonest.
    near_plateau = (
        state.plateau is not None
        and now_ms - state.last_decrease_ms < PLATEAU_MS
        and state.plateau - 1 <= state.limit < state.plateau
    )
    if near_plateau:
        step *= SLOW_PROBE
    return replace(state, limit=min(float(configured), state.limit + step))


def _learn_rate(state: GovernorState, outcome: Outcome, now_ms: int) -> GovernorState:
    rate = outcome.rate
    if rate is None:
        return state
    if rate.request_limit is not None and rate.request_limit > 0:
        # The dialects that report a request limit (OpenAI, Anthropic, IETF
        # policies normalised by the parser) state it per minute.
        state = replace(state, learned_rpm=rate.request_limit)
    if rate.request_reset_ms is not None:
        reset_at = now_ms + rate.request_reset_ms
        state = replace(state, window_reset_ms=reset_at)
        if rate.request_remaining == 0:
            # The window is spent: nothing more gets through until it resets.
            until = now_ms + min(rate.request_reset_ms, MAX_PAUSE_MS)
            state = replace(state, paused_until_ms=max(state.paused_until_ms, until))
    return state


def pause_remaining_ms(state: GovernorState, now_ms: int) -> int | None:
    """Milliseconds until admissions resume, or None when not paused."""
    return state.paused_until_ms - now_ms if state.paused_until_ms > now_ms else None


def effective_rpm(configured_rpm: int | None, state: GovernorState) -> int | None:
    """The admissions-per-minute cap: the configured one, lowered by what was learned."""
    rates = [r for r in (configured_rpm, state.learned_rpm) if r is not None]
    return min(rates) if rates else None


def rpm_wait_ms(
    admitted_in_window: int, oldest_in_window_ms: int | None, rpm: int | None, now_ms: int
) -> int | None:
    """With `admitted_in_window` admissions in the last rolling minute, how long
    until one more may be admitted (None: now)."""
    if rpm is None or admitted_in_window < rpm:
        return None
    if oldest_in_window_ms is None:
        return 1
    return max(1, oldest_in_window_ms + 60_000 - now_ms)
