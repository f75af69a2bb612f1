"""Lease rules as pure functions with an injected clock: no sleeps, no I/O."""

from __future__ import annotations

import itertools

import pytest

from fencepost.core import leases as rules
from fencepost.core.leases import (
    LEASE_LIFETIME_MS,
    AcquireRequest,
    Busy,
    EndReason,
    Granted,
    OnExpiry,
)
from fencepost.errors import LeaseExpired, LeaseLost

T0 = 1_800_000_000_000  # an arbitrary instant, in epoch ms
A = "00000000-0000-4000-8000-00000000000a"
B = "00000000-0000-4000-8000-00000000000b"


def tokens(start: int = 1):
    counter = itertools.count(start)
    return lambda: next(counter)


def grant(token: str = A, ttl: int = 30, now: int = T0, on_expiry=OnExpiry.RELEASE, fence=None):
    outcome = rules.decide_acquire(
        "k", (), AcquireRequest(token, ttl, on_expiry=on_expiry), now,
        waiters_ahead=0, next_fencing_token=fence or tokens(),
    )
    assert isinstance(outcome, Granted) and outcome.created
    return outcome.lease


class TestAcquire:
    def test_new_grant_sets_expiry_and_ninety_day_deadline(self):
        lease = grant(ttl=30)
        assert lease.acquired_ms == T0
        assert lease.expires_ms == T0 + 30_000
        assert lease.deadline_ms == T0 + 90 * 86_400_000 == T0 + LEASE_LIFETIME_MS
        assert lease.fencing_token == 1

    def test_ttl_of_ninety_days_ends_exactly_at_the_deadline(self):
        lease = grant(ttl=rules.TTL_MAX_SECONDS)
        assert lease.expires_ms == lease.deadline_ms

    def test_same_token_gets_the_same_lease_without_a_new_fencing_token(self):
        lease = grant()
        fence = tokens(100)
        again = rules.decide_acquire(
            "k", (lease,), AcquireRequest(A, 60), T0 + 5_000, waiters_ahead=0,
            next_fencing_token=fence,
        )
        assert isinstance(again, Granted) and not again.created
        assert again.lease == lease
        assert fence() == 100  # the counter was not touched

    def test_other_token_is_refused_while_live(self):
        lease = grant()
        busy = rules.decide_acquire(
            "k", (lease,), AcquireRequest(B, 30), T0 + 29_999, waiters_ahead=0,
            next_fencing_token=tokens(),
        )
        assert isinstance(busy, Busy) and busy.holder == lease
        error = busy.to_error()
        assert error.extra["expires_in_ms"] == 1
        assert error.retry_after_ms == 1 and error.response_headers()["Retry-After"] == "1"

    def test_release_lease_is_free_at_expires_at(self):
        lease = grant(ttl=30)
        outcome = rules.decide_acquire(
            "k", (lease,), AcquireRequest(B, 30), T0 + 30_000, waiters_ahead=0,
            next_fencing_token=tokens(2),
        )
        assert isinstance(outcome, Granted) and outcome.created
        assert outcome.lease.fencing_token == 2

    def test_free_lock_goes_to_the_line_first(self):
        busy = rules.decide_acquire(
            "k", (), AcquireRequest(B, 30), T0, waiters_ahead=2, next_fencing_token=tokens()
        )
        assert isinstance(busy, Busy) and busy.holder is None
        assert busy.to_error().extra["waiters"] == 2

    def test_fencing_tokens_only_rise_as_the_lock_changes_hands(self):
        fence = tokens()
        seen = []
        current = None
        now = T0
        for i in range(20):
            token = f"00000000-0000-4000-8000-{i:012d}"
            outcome = rules.decide_acquire(
                "k", () if current is None else (current,), AcquireRequest(token, 5), now,
                waiters_ahead=0,
                next_fencing_token=fence,
            )
            assert isinstance(outcome, Granted)
            current = outcome.lease
            seen.append(current.fencing_token)
            now += 5_000  # each lease dies exactly as the next caller arrives
        assert seen == sorted(set(seen)) and len(seen) == 20


class TestKeep:
    def test_keep_lease_is_held_but_overdue_after_expiry(self):
        lease = grant(on_expiry=OnExpiry.KEEP, ttl=10)
        later = T0 + 60_000
        assert rules.is_live(lease, later)
        assert rules.is_overdue(lease, later)
        busy = rules.decide_acquire(
            "k", (lease,), AcquireRequest(B, 30), later, waiters_ahead=0,
            next_fencing_token=tokens(),
        )
        assert isinstance(busy, Busy)
        error = busy.to_error()
        assert error.extra["expires_in_ms"] == -50_000
        assert error.retry_after_ms is None and "Retry-After" not in error.response_headers()

    def test_keep_lease_ends_at_its_deadline(self):
        lease = grant(on_expiry=OnExpiry.KEEP)
        assert rules.is_live(lease, lease.deadline_ms - 1)
        assert not rules.is_live(lease, lease.deadline_ms)

    def test_overdue_keep_lease_may_be_renewed(self):
        lease = grant(on_expiry=OnExpiry.KEEP, ttl=10)
        renewed = rules.decide_renew(lease, A, 30, T0 + 60_000, None)
        assert renewed.expires_ms == T0 + 90_000
        assert renewed.fencing_token == lease.fencing_token


class TestRenew:
    def test_renew_sets_expiry_outright(self):
        lease = grant(ttl=600)
        shorter = rules.decide_renew(lease, A, 5, T0 + 10_000, None)
        assert shorter.expires_ms == T0 + 15_000  # shorter TTL shortens the lease
        assert shorter.fencing_token == lease.fencing_token

    def test_renew_never_passes_the_deadline(self):
        lease = grant(ttl=30)
        renewed = rules.decide_renew(lease, A, rules.TTL_MAX_SECONDS, T0 + 20_000, None)
        assert renewed.expires_ms == lease.deadline_ms

    @pytest.mark.parametrize("before_expiry_ms", [1_000, 999, 1])
    def test_renew_within_the_last_second_is_refused(self, before_expiry_ms):
        lease = grant(ttl=30)
        with pytest.raises(LeaseExpired):
            rules.decide_renew(lease, A, 30, lease.expires_ms - before_expiry_ms, None)

    def test_renew_just_over_a_second_before_expiry_passes(self):
        lease = grant(ttl=30)
        renewed = rules.decide_renew(lease, A, 30, lease.expires_ms - 1_001, None)
        assert renewed.expires_ms == lease.expires_ms - 1_001 + 30_000

    def test_renew_after_expiry_is_lost_with_reason_expired(self):
        lease = grant(ttl=30)
        with pytest.raises(LeaseLost) as info:
            rules.decide_renew(lease, A, 30, lease.expires_ms, None)
        assert info.value.extra["reason"] == "expired"

    @pytest.mark.parametrize(
        "ended,held_by_other,reason",
        [
            (EndReason.RELEASED, False, "released"),
            (EndReason.FORCE_RELEASED, True, "force_released"),
            (EndReason.EXPIRED, True, "superseded"),
            (EndReason.EXPIRED, False, "expired"),
            (None, True, None),
            (None, False, None),
        ],
    )
    def test_lost_reasons(self, ended, held_by_other, reason):
        current = grant(token=B) if held_by_other else None
        with pytest.raises(LeaseLost) as info:
            rules.decide_renew(current, A, 30, T0 + 1_000, ended)
        assert info.value.extra["reason"] == reason


class TestRelease:
    def test_only_the_live_holder_releases(self):
        lease = grant(ttl=30)
        assert rules.holds(lease, A, T0 + 1)
        assert not rules.holds(lease, B, T0 + 1)
        assert not rules.holds(lease, A, lease.expires_ms)
        assert not rules.holds(None, A, T0)


def test_end_of_life_depends_on_mode():
    assert rules.end_of_life_ms(grant(ttl=30)) == T0 + 30_000
    keep = grant(ttl=30, on_expiry=OnExpiry.KEEP)
    assert rules.end_of_life_ms(keep) == keep.deadline_ms
