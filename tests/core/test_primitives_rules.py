"""Pure rules for owner force release (§3.5), fence checks (§3.8) and lock
delay (§3.9), with an injected clock: no sleeps, no I/O."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from fencepost.core import leases as rules
from fencepost.core.leases import AcquireRequest, Busy, EndReason, Granted, Lease, OnExpiry

T0 = 1_800_000_000_000
A = "00000000-0000-4000-8000-00000000000a"
B = "00000000-0000-4000-8000-00000000000b"


def tokens(start: int = 1):
    counter = itertools.count(start)
    return lambda: next(counter)


def grant(token: str = A, ttl: int = 30, now: int = T0, fence: int = 7, **kw):
    outcome = rules.decide_acquire(
        "k", (), AcquireRequest(token, ttl, **kw), now,
        waiters_ahead=0, next_fencing_token=tokens(fence),
    )
    assert isinstance(outcome, Granted) and outcome.created
    return outcome.lease


class TestForceReleaseOwnership:
    def test_the_acquiring_key_is_on_the_lease(self):
        assert grant(key_id="key_a").key_id == "key_a"

    def test_owner_and_admin_may_others_may_not(self):
        lease = grant(key_id="key_a")
        assert rules.may_force_release(lease, "key_a", is_admin=False)
        assert rules.may_force_release(lease, "key_b", is_admin=True)
        assert not rules.may_force_release(lease, "key_b", is_admin=False)

    def test_a_lease_without_a_recorded_key_is_the_admins_alone(self):
        lease = grant()
        assert lease.key_id is None
        assert not rules.may_force_release(lease, "key_a", is_admin=False)
        assert rules.may_force_release(lease, "key_a", is_admin=True)


class TestFence:
    def test_the_live_token_is_current(self):
        lease = grant(fence=7)
        verdict = rules.judge_fence((lease,), 7, T0 + 1, None)
        assert (verdict.current, verdict.live_token, verdict.reason) == (True, 7, None)

    def test_a_dead_lease_still_on_record_is_expired(self):
        lease = grant(fence=7, ttl=5)
        verdict = rules.judge_fence((lease,), 7, T0 + 5_000, None)
        assert (verdict.current, verdict.live_token, verdict.reason) == (False, None, "expired")

    def test_recorded_endings_name_the_reason(self):
        live = grant(token=B, fence=9)
        for ended, want in [
            (EndReason.RELEASED, "released"),
            (EndReason.FORCE_RELEASED, "force_released"),
            (EndReason.EXPIRED, "superseded"),  # someone else holds it now
        ]:
            verdict = rules.judge_fence((live,), 7, T0, ended)
            assert (verdict.current, verdict.live_token, verdict.reason) == (False, 9, want)
        assert rules.judge_fence((), 7, T0, EndReason.EXPIRED).reason == "expired"

    def test_a_token_never_seen_on_this_lock_is_unknown(self):
        live = grant(fence=9)
        assert rules.judge_fence((live,), 8, T0, None).reason == "unknown"
        assert rules.judge_fence((live,), 10, T0, None).reason == "unknown"
        assert rules.judge_fence((), 10, T0, None).live_token is None

    def test_an_overdue_keep_lease_is_still_current(self):
        lease = grant(fence=7, ttl=5, on_expiry=OnExpiry.KEEP)
        assert rules.judge_fence((lease,), 7, T0 + 60_000, None).current
        dead = replace(lease, deadline_ms=T0 + 60_000)
        assert rules.judge_fence((dead,), 7, T0 + 60_000, None).reason == "expired"


class TestLockDelay:
    def test_expiry_delays_from_the_end_of_life(self):
        lease = grant(ttl=5, lock_delay_seconds=10)
        assert lease.lock_delay_ms == 10_000
        outcome = rules.decide_acquire(
            "k", (lease,), AcquireRequest(B, 30), T0 + 9_000, waiters_ahead=0,
            next_fencing_token=tokens(8),
        )
        assert isinstance(outcome, Busy) and outcome.delay_until_ms == T0 + 15_000
        error = outcome.to_error()
        assert error.reason == "lock_delay" and error.retry_after_ms == 6_000
        assert outcome.ends_in_ms == 6_000
        later = rules.decide_acquire(
            "k", (lease,), AcquireRequest(B, 30), T0 + 15_000, waiters_ahead=0,
            next_fencing_token=tokens(8),
        )
        assert isinstance(later, Granted) and later.lease.fencing_token == 8

    def test_which_endings_start_a_delay(self):
        lease = grant(ttl=5, lock_delay_seconds=3)
        assert rules.delay_until_ms(lease, EndReason.EXPIRED, T0 + 9_000) == T0 + 8_000
        assert rules.delay_until_ms(lease, EndReason.FORCE_RELEASED, T0 + 1) == T0 + 3_001
        assert rules.delay_until_ms(lease, EndReason.RELEASED, T0 + 1) is None
        assert rules.delay_until_ms(grant(), EndReason.EXPIRED, T0) is None

    def test_a_recorded_delay_refuses_even_the_head_of_the_line(self):
        outcome = rules.decide_acquire(
            "k", (), AcquireRequest(B, 30), T0, waiters_ahead=0,
            next_fencing_token=tokens(), delayed_until_ms=T0 + 1,
        )
        assert isinstance(outcome, Busy) and outcome.delay_until_ms == T0 + 1
        outcome = rules.decide_acquire(
            "k", (), AcquireRequest(B, 30), T0 + 1, waiters_ahead=0,
            next_fencing_token=tokens(), delayed_until_ms=T0 + 1,
        )
        assert isinstance(outcome, Granted)


class DelayMachine(RuleBasedStateMachine):
    """Random schedules of acquires, expiries, force releases and releases over
    the pure rules, with the store's bookkeeping modelled: a lock in its delay
    is granted to nobody, and tokens only rise."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.current: Lease | None = None
        self.delayed_until: int | None = None
        self.fence = tokens(1)
        self.last_token = 0
        # Independent of the rules: when the lock's latest involuntary end allows a grant.
        self.free_from = T0

    def _end(self, reason: EndReason) -> None:
        assert self.current is not None
        until = rules.delay_until_ms(self.current, reason, self.now)
        if until is not None and until > self.now:
            self.delayed_until = max(self.delayed_until or 0, until)
        if reason is EndReason.EXPIRED:
            self.free_from = max(self.free_from,
                                 rules.end_of_life_ms(self.current) + self.current.lock_delay_ms)
        elif reason is EndReason.FORCE_RELEASED:
            self.free_from = max(self.free_from, self.now + self.current.lock_delay_ms)
        self.current = None

    @rule(ms=st.integers(0, 20_000))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule()
    def reap(self) -> None:
        if self.current is not None and not rules.is_live(self.current, self.now):
            self._end(EndReason.EXPIRED)
        if self.delayed_until is not None and self.delayed_until <= self.now:
            self.delayed_until = None

    @rule(ttl=st.integers(5, 20), delay=st.integers(0, 60),
          keep=st.booleans())
    def acquire(self, ttl: int, delay: int, keep: bool) -> None:
        request = AcquireRequest(
            str(self.now), ttl, lock_delay_seconds=delay,
            on_expiry=OnExpiry.KEEP if keep else OnExpiry.RELEASE,
        )
        outcome = rules.decide_acquire(
            "k", () if self.current is None else (self.current,), request, self.now,
            waiters_ahead=0,
            next_fencing_token=self.fence, delayed_until_ms=self.delayed_until,
        )
        if isinstance(outcome, Granted) and outcome.created:
            assert self.now >= self.free_from, "granted during a lock delay"
            assert outcome.lease.fencing_token > self.last_token
            self.last_token = outcome.lease.fencing_token
            if self.current is not None:  # a dead lease replaced: it expired
                self.free_from = max(
                    self.free_from,
                    rules.end_of_life_ms(self.current) + self.current.lock_delay_ms,
                )
            self.current = outcome.lease
        elif isinstance(outcome, Busy) and outcome.delay_until_ms is not None:
            assert self.now < outcome.delay_until_ms

    @rule()
    def force_release(self) -> None:
        if self.current is not None:
            live = rules.is_live(self.current, self.now)
            self._end(EndReason.FORCE_RELEASED if live else EndReason.EXPIRED)

    @rule()
    def release(self) -> None:
        if self.current is not None:
            live = rules.holds(self.current, self.current.lock_token, self.now)
            self._end(EndReason.RELEASED if live else EndReason.EXPIRED)


TestDelayMachine = DelayMachine.TestCase
TestDelayMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
