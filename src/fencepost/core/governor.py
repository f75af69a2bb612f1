"""Adaptive admission for pools (SPEC §4.5): learn an upstream's real capacity
from the outcomes that slot holders report on release, and pace admissions by
the rate it allows.

Concurrency is AIMD, as in TCP congestion control (RFC 5681) and Netflix's
concurrency-limits library: add about one slot per round trip while calls
succeed, multiply by BETA when the upstream throttles. Refinements:

- one decrease per round trip (the pool's typical slot hold time), as TCP
  reduces once per window, so a burst of 429s from one overload is one signal;
- a plateau near the limit where throttling last began (CUBIC, RFC 8312): for
  PLATEAU_MS after a decrease the limit climbs back quickly to one slot below
  that point and crosses that last slot slowly;
- an upstream that never throttles but slows down (latency grows with calls in
  progress) is read from the hold time: once a latency probe (below) showed
  that calls get faster at a lower limit, successful holds much longer than
  the pool's unloaded baseline count as congestion, as in TCP Vegas.

Retry hints are evidence, not orders. A throttle that names no empty budget
(a 429 with a whole-second Retry-After and no rate headers is what a cap on
calls in progress sends) only lowers the limit: pausing the whole pool for
the hint's second would idle every slot. The pool pauses only when the
evidence says the shared budget is empty: a reported `remaining: 0`, or
hinted throttles from several holders while no call has succeeded for longer
than calls take. The pause lasts the most precise time reported (a reset in
ms beats a whole-second Retry-After); while paused a probe is let through
with spacing that doubles from one refill interval, and the first success of
a call admitted during the pause ends it: a continuously refilling budget
resumes after about one refill interval, a fixed window costs a few probes.

Slow start (SPEC §4.5), as TCP's (RFC 5681): an adaptive pool that knows
nothing of its upstream yet starts at SLOW_START_FROM slots and adds one for
each success, which doubles the limit every round trip, until the first
throttle (then AIMD as above) or the configured limit. A pool whose evidence
went stale (no report for STALE_MS: the upstream may have changed, its
capacity been taken by others) starts again from a quarter of what it had
learned, so that a burst after a quiet night does not meet an upstream that
halved its capacity with the whole learned limit at once.

The rate to pace by is the slower of the configured and learned ones (the
pacing itself, GCRA, is in slots.py). Everything here is pure: the store
keeps the state, `now_ms` is a parameter.
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
# One holder's report alone pauses the pool for at most this long (SPEC §4.5):
# a longer pause needs a second holder's evidence, so one buggy or hostile
# caller cannot stop everyone for ten minutes.
ONE_REPORTER_PAUSE_MS = 60_000
DEFAULT_WINDOW_MS = 60_000  # a rate whose window the headers do not state is per minute
# Several holders throttled in a row, with no success for this many successful
# round trips: the shared budget is empty, not the concurrency too high.
EMPTY_STREAK = 3
EMPTY_AFTER_ROUND_TRIPS = 2.0
MIN_PROBE_GAP_MS = 20
# Once a probe showed that the upstream's latency grows with the calls in
# progress, successful holds this much longer than the unloaded baseline mean
# congestion. (Without that proof a slower call may be a slower service.)
SLOWDOWN_TOLERANCE = 1.4
# The baseline creeps up toward slower holds with this time constant, so that
# a service that really got slower is not taken for congestion for ever.
BASELINE_DRIFT_MS = 60_000
BASELINE_DOWN = 0.3
# A pool that admits everything at once never sees an unloaded call, so the
# baseline may itself be congested. As BBR's ProbeRTT, after PROBE_EVERY_MS
# without a decrease the limit halves for a round trip: if calls admitted then
# are much faster (PROBE_FASTER), the upstream was congested and the lower
# limit stays; otherwise the limit is restored at once.
PROBE_EVERY_MS = 10_000
PROBE_SHARE = 0.5
PROBE_FASTER = 0.7
# A learned rate is paced a little below what the upstream states: calls reach
# it with some jitter, and pacing at exactly its refill rate keeps a
# continuously refilling budget at zero, where any early arrival is a 429.
LEARNED_PACE_SHARE = 0.99
# Slow start: the limit a pool that knows nothing yet starts from, and how long
# without any report makes what it learned stale.
SLOW_START_FROM = 2
STALE_MS = 600_000


@dataclass(frozen=True, slots=True)
class Hint:
    """The last retry evidence reported: where it came from and what it said."""

    source: str  # "retry-after-ms", "retry-after", "report" (body field) or "reset"
    retry_after_ms: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one release reported, with how long the slot was held."""

    status: int | None = None
    throttled: int = 0
    retry_after_ms: int | None = None
    rate: RateLimitInfo | None = None
    hold_ms: int | None = None
    # Who reported it (the holder's key): a long pause needs two of them.
    reporter: str | None = None

    @property
    def hint(self) -> Hint | None:
        """The retry hint (the body's field wins over the headers), time-less."""
        if self.retry_after_ms is not None:
            return Hint("report", self.retry_after_ms, 0)
        if self.rate is not None and self.rate.retry_after_ms is not None:
            return Hint(self.rate.retry_after_from or "retry-after", self.rate.retry_after_ms, 0)
        return None

    @property
    def was_throttled(self) -> bool:
        return self.status == 429 or self.throttled > 0 or (
            self.status == 503 and self.hint is not None)

    @property
    def succeeded(self) -> bool:
        return self.status is not None and self.status < 400 and self.throttled == 0

    def empty_budget_ms(self) -> int | None:
        """When the reported state says a budget is spent: ms until it refills
        (the latest reset among spent budgets; 0 when no reset is given)."""
        rate = self.rate
        if rate is None:
            return None
        resets = [
            reset or 0
            for remaining, reset in ((rate.request_remaining, rate.request_reset_ms),
                                     (rate.token_remaining, rate.token_reset_ms))
            if remaining == 0
        ]
        return max(resets) if resets else None


@dataclass(frozen=True, slots=True)
class GovernorState:
    limit: float  # the learned concurrency limit (admit while in_use < floor(limit))
    plateau: float | None = None  # the limit at which throttling last began
    last_decrease_ms: int = 0
    hold_ms: float | None = None  # EWMA of how long a slot is held: the round trip
    paused_until_ms: int = 0
    learned_rpm: int | None = None  # the upstream's request quota per `window_ms`
    window_reset_ms: int | None = None  # when the upstream's current window resets
    window_ms: int | None = None  # the window the quota is counted over
    paused_since_ms: int = 0
    probe_gap_ms: int = 0  # spacing of the next probe during a pause (doubles)
    next_probe_ms: int = 0
    ok_hold_ms: float | None = None  # EWMA of successful holds
    base_hold_ms: float | None = None  # unloaded hold time (slowly drifting minimum)
    last_success_ms: int = 0
    hinted_streak: int = 0  # hinted throttles reported since the last success
    last_hint: Hint | None = None
    probe_since_ms: int = 0  # a latency probe (halved limit) under way since then
    probe_hold_ms: float | None = None  # the successful hold time before that probe
    latency_bound: bool = False  # the last probe found calls faster at a lower limit
    last_throttle_ms: int = 0  # when a holder last reported a throttle
    # Who asked for the pause in force, and until when they said the budget
    # stays empty (which may be later than the pause: see _pause).
    pause_reporter: str | None = None
    pause_claim_ms: int = 0
    # In slow start: one more slot per success (doubling each round trip).
    slow_start: bool = False


def initial(limit: int) -> GovernorState:
    return GovernorState(limit=float(limit))


def starting(configured: int, min_limit: int) -> GovernorState:
    """An adaptive pool that knows nothing of its upstream yet: slow start."""
    start = min(configured, max(min_limit, SLOW_START_FROM))
    return GovernorState(limit=float(start), slow_start=start < configured)


def stale(state: GovernorState, now_ms: int) -> bool:
    """No report for STALE_MS after some: what was learned may be wrong now."""
    last = max(state.last_success_ms, state.last_throttle_ms)
    return last > 0 and now_ms - last > STALE_MS


def _restart_limit(state: GovernorState, configured: int, min_limit: int) -> float:
    learned = min(float(configured), state.limit)
    return max(float(min_limit), min(learned, max(float(SLOW_START_FROM), learned / 4)))


def effective_limit(state: GovernorState, configured: int, min_limit: int, adaptive: bool,
                    now_ms: int | None = None) -> int:
    """The slots admitted at once; with `now_ms`, a stale pool's restart limit."""
    if not adaptive:
        return configured
    limit = state.limit
    if now_ms is not None and stale(state, now_ms):
        limit = _restart_limit(state, configured, min_limit)
    return max(min_limit, min(configured, math.floor(limit)))


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
    pools that `learns_rate` (adaptive, or with an rpm) learn the upstream's
    rate and pause on an empty budget."""
    if adaptive and stale(state, now_ms):
        # Evidence after a long silence: start again low, and slowly no more.
        state = replace(state, limit=_restart_limit(state, configured, min_limit),
                        slow_start=True, plateau=None)
    state = _observe_hold(state, outcome, now_ms)
    empty_ms = outcome.empty_budget_ms()
    if learns_rate:
        state = _learn_rate(state, outcome.rate, now_ms)
        state = _weigh_hints(state, outcome, empty_ms, now_ms)
    if not adaptive:
        return state
    if outcome.was_throttled:
        # An upstream that throttles states its limits by 429s: latency is no
        # evidence then, and a latency probe under way is moot.
        state = replace(state, last_throttle_ms=now_ms, latency_bound=False,
                        probe_since_ms=0, probe_hold_ms=None, slow_start=False)
        # A throttle that says the shared budget is spent is the rate's doing
        # (pacing and the pause answer it), not the concurrency's.
        return state if empty_ms is not None else _decrease(state, now_ms, min_limit)
    if outcome.succeeded:
        if state.slow_start:
            grown = min(float(configured), state.limit + 1.0)
            return replace(state, limit=grown, slow_start=grown < configured)
        state = _judge_probe(state, outcome, now_ms)
        if _slowed_down(state):
            # In proportion to the slowdown (as Netflix's gradient limit), so a
            # deep overload is shed in a round trip or two, not ten.
            assert state.ok_hold_ms is not None and state.base_hold_ms is not None
            share = SLOWDOWN_TOLERANCE * state.base_hold_ms / state.ok_hold_ms
            return _decrease(state, now_ms, min_limit, max(PROBE_SHARE, min(BETA, share)))
        if _probe_due(state, now_ms, min_limit):
            return _probe_down(state, now_ms, min_limit)
        if state.probe_since_ms:
            return state  # hold the probe's limit until it is judged
        return _increase(state, now_ms, configured)
    return state  # a 5xx that is not throttling says nothing about capacity


def _probe_due(state: GovernorState, now_ms: int, min_limit: int) -> bool:
    """Probe every PROBE_EVERY_MS without a decrease, and sooner (one round trip
    after the last change) when calls are slow for a reason not yet known."""
    if state.probe_since_ms or state.ok_hold_ms is None or state.limit * PROBE_SHARE < min_limit:
        return False
    if state.last_throttle_ms and now_ms - state.last_throttle_ms < PROBE_EVERY_MS:
        return False  # 429s are telling the limit
    quiet_ms = now_ms - state.last_decrease_ms
    base = state.base_hold_ms
    suspect = (not state.latency_bound and base is not None
               and state.ok_hold_ms > SLOWDOWN_TOLERANCE * base)
    # (A pool that never decreased has nothing to compare with yet but suspicion.)
    periodic = state.last_decrease_ms > 0 and quiet_ms >= PROBE_EVERY_MS
    return periodic or (suspect and quiet_ms >= 2 * state.ok_hold_ms)


def _probe_down(state: GovernorState, now_ms: int, min_limit: int) -> GovernorState:
    return replace(state, plateau=state.limit,
                   limit=max(float(min_limit), state.limit * PROBE_SHARE),
                   last_decrease_ms=now_ms, probe_since_ms=now_ms,
                   probe_hold_ms=state.ok_hold_ms)


def _judge_probe(state: GovernorState, outcome: Outcome, now_ms: int) -> GovernorState:
    """The first success admitted during a latency probe ends it: faster calls
    keep the lower limit (and teach the baseline); otherwise restore it."""
    if state.probe_since_ms == 0 or outcome.hold_ms is None:
        return state
    if now_ms - outcome.hold_ms < state.probe_since_ms:
        # Admitted before the probe, at the higher limit: the reference to beat
        # is their average (a lone slow call is noise, not a reference).
        return replace(state, probe_hold_ms=max(state.probe_hold_ms or 0.0,
                                                state.ok_hold_ms or 0.0))
    before = state.probe_hold_ms
    ended = replace(state, probe_since_ms=0, probe_hold_ms=None)
    if before is not None and outcome.hold_ms <= PROBE_FASTER * before:
        # Measured at the lower limit: the baseline is at most this.
        base = min(state.base_hold_ms or math.inf, float(outcome.hold_ms))
        return replace(ended, latency_bound=True, base_hold_ms=base)
    # No faster at the lower limit: the service is this slow. Restore the limit,
    # and take this as the baseline so that slowness alone is not suspect.
    base = max(state.base_hold_ms or 0.0, float(outcome.hold_ms))
    return replace(ended, latency_bound=False, base_hold_ms=base,
                   limit=max(state.limit, state.plateau or state.limit))


def _ewma(previous: float | None, sample: float) -> float:
    return sample if previous is None else previous + HOLD_EWMA_WEIGHT * (sample - previous)


def _observe_hold(state: GovernorState, outcome: Outcome, now_ms: int) -> GovernorState:
    hold = outcome.hold_ms
    if hold is None or hold < 0:
        return state
    state = replace(state, hold_ms=_ewma(state.hold_ms, hold))
    if not outcome.succeeded:
        return state
    base = state.base_hold_ms
    if base is None:
        base = float(hold)
    elif hold < base:
        # Part of the way down: a low percentile of holds, not one lucky call.
        base += BASELINE_DOWN * (hold - base)
    elif state.last_success_ms:
        since = max(0, now_ms - state.last_success_ms)
        base += min(1.0, since / BASELINE_DRIFT_MS) * (hold - base)
    return replace(state, ok_hold_ms=_ewma(state.ok_hold_ms, hold), base_hold_ms=base)


def _slowed_down(state: GovernorState) -> bool:
    ok, base = state.ok_hold_ms, state.base_hold_ms
    return (state.latency_bound and ok is not None and base is not None and base > 0
            and ok > SLOWDOWN_TOLERANCE * base)


def _decrease(
    state: GovernorState, now_ms: int, min_limit: int, factor: float = BETA
) -> GovernorState:
    if now_ms - state.last_decrease_ms < round_trip_ms(state):
        return state  # the same overload, already answered
    return replace(
        state,
        plateau=state.limit,
        limit=max(float(min_limit), state.limit * factor),
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


def _learn_rate(state: GovernorState, rate: RateLimitInfo | None, now_ms: int) -> GovernorState:
    if rate is None:
        return state
    if rate.request_limit is not None and rate.request_limit > 0:
        window = rate.request_window_ms or DEFAULT_WINDOW_MS
        state = replace(state, learned_rpm=rate.request_limit, window_ms=window)
    if rate.request_reset_ms is not None:
        state = replace(state, window_reset_ms=now_ms + rate.request_reset_ms)
    return state


def _weigh_hints(
    state: GovernorState, outcome: Outcome, empty_ms: int | None, now_ms: int
) -> GovernorState:
    hint = outcome.hint
    if empty_ms is not None:
        # A reset names the budget and is at least as precise as Retry-After.
        state = replace(state, last_hint=Hint("reset", empty_ms, now_ms))
    elif hint is not None:
        state = replace(state, last_hint=replace(hint, at_ms=now_ms))
    if outcome.succeeded:
        # A success that spent the last call (remaining 0) is no reason to
        # pause: the rate's pacing spaces the next one, and a refilling budget
        # would be paused for nothing; a throttle, if it comes, is the evidence.
        state = replace(state, hinted_streak=0, last_success_ms=now_ms)
        admitted_ms = now_ms - (outcome.hold_ms or 0)
        paused = state.paused_until_ms > now_ms
        if paused and admitted_ms >= state.paused_since_ms:
            return _resume(state)  # a call admitted during the pause got through
        return state
    if empty_ms is not None:
        return _pause(state, empty_ms if empty_ms > 0 else (hint.retry_after_ms if hint else 0),
                      now_ms, outcome.reporter)
    if outcome.was_throttled and hint is not None and hint.retry_after_ms > 0:
        state = replace(state, hinted_streak=state.hinted_streak + 1)
        if _budget_looks_empty(state, now_ms):
            return _pause(state, hint.retry_after_ms, now_ms, outcome.reporter)
    return state


def _budget_looks_empty(state: GovernorState, now_ms: int) -> bool:
    """Hinted throttles from several holders and no success for longer than
    successful calls take: more than the concurrency explains."""
    if state.hinted_streak < EMPTY_STREAK or state.ok_hold_ms is None:
        return False
    quiet_ms = now_ms - state.last_success_ms
    return quiet_ms > EMPTY_AFTER_ROUND_TRIPS * max(state.ok_hold_ms, MIN_ROUND_TRIP_MS)


def refill_interval_ms(state: GovernorState) -> float | None:
    """Time for the learned budget to earn one more call."""
    if state.learned_rpm is None:
        return None
    return (state.window_ms or DEFAULT_WINDOW_MS) / state.learned_rpm


def _pause(
    state: GovernorState, for_ms: int, now_ms: int, reporter: str | None
) -> GovernorState:
    """Pause, or extend the pause, on `reporter`'s evidence that the budget is
    empty for `for_ms`. One reporter's word alone pauses for at most
    ONE_REPORTER_PAUSE_MS; where a second reporter's evidence agrees, the
    pause runs as long as both say (the shorter of their two claims), up to
    MAX_PAUSE_MS. The latest reporter's claim is kept, so that a third can
    agree with it in turn."""
    if for_ms <= 0:
        return state
    claim = now_ms + min(for_ms, MAX_PAUSE_MS)
    until = now_ms + min(for_ms, MAX_PAUSE_MS, ONE_REPORTER_PAUSE_MS)
    paused = state.paused_until_ms > now_ms
    if paused and state.pause_reporter != reporter:
        until = max(until, min(claim, state.pause_claim_ms))
    if paused and state.pause_reporter == reporter:
        claim = max(claim, state.pause_claim_ms)
    if paused:  # the latest evidence may extend the pause, never shorten it
        return replace(state, paused_until_ms=max(state.paused_until_ms, until),
                       pause_reporter=reporter, pause_claim_ms=claim)
    gap = refill_interval_ms(state) or (state.ok_hold_ms or round_trip_ms(state))
    gap_ms = max(MIN_PROBE_GAP_MS, math.ceil(gap))
    return replace(state, paused_until_ms=until, paused_since_ms=now_ms, probe_gap_ms=gap_ms,
                   next_probe_ms=now_ms + gap_ms, pause_reporter=reporter,
                   pause_claim_ms=claim)


def _resume(state: GovernorState) -> GovernorState:
    return replace(state, paused_until_ms=0, probe_gap_ms=0, next_probe_ms=0,
                   pause_reporter=None, pause_claim_ms=0)


def pause_remaining_ms(state: GovernorState, now_ms: int) -> int | None:
    """Milliseconds until admissions resume, or None when not paused."""
    return state.paused_until_ms - now_ms if state.paused_until_ms > now_ms else None


def probe_wait_ms(state: GovernorState, now_ms: int) -> int | None:
    """While paused: ms until the next probe may be admitted (0: now); None when
    not paused."""
    if pause_remaining_ms(state, now_ms) is None:
        return None
    return max(0, state.next_probe_ms - now_ms)


def after_probe(state: GovernorState, now_ms: int) -> GovernorState:
    """A probe was admitted during the pause: the next one waits twice as long."""
    gap = max(MIN_PROBE_GAP_MS, state.probe_gap_ms) * 2
    return replace(state, probe_gap_ms=gap, next_probe_ms=now_ms + gap)


def effective_rpm(configured_rpm: int | None, state: GovernorState) -> int | None:
    """The admissions-per-minute cap: the configured one, lowered by what was learned."""
    interval = pace_interval_ms(configured_rpm, state)
    return None if interval is None else max(1, round(60_000 / interval))


def pace_interval_ms(configured_rpm: int | None, state: GovernorState) -> float | None:
    """The spacing of admissions: the slower of the configured and learned rates."""
    learned = refill_interval_ms(state)
    intervals = [i for i in (configured_rpm and 60_000 / configured_rpm,
                             learned and learned / LEARNED_PACE_SHARE) if i]
    return max(intervals) if intervals else None
