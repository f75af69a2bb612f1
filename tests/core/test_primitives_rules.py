"""Pure rules for owner force release (§3.5), fence checks (§3.8) and lock
delay (§3.9), with an injected clock: no sleeps, no I/O."""

from __future__ import annotations

import itertools
from dataclasses import replace

from fencepost.core import leases as rules
from fencepost.core.leases import AcquireRequest, EndReason, Granted, OnExpiry

T0 = 1_800_000_000_000
A = "00000000-0000-4000-8000-00000000000a"
B = "00000000-0000-4000-8000-00000000000b"


def tokens(start: int = 1):
    counter = itertools.count(start)
    return lambda: next(counter)


def grant(token: str = A, ttl: int = 30, now: int = T0, fence: int = 7, **kw):
    outcome = rules.decide_acquire(
        "k", None, AcquireRequest(token, ttl, **kw), now,
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
        verdict = rules.judge_fence(lease, 7, T0 + 1, None)
        assert (verdict.current, verdict.live_token, verdict.reason) == (True, 7, None)

    def test_a_dead_lease_still_on_record_is_expired(self):
        lease = grant(fence=7, ttl=5)
        verdict = rules.judge_fence(lease, 7, T0 + 5_000, None)
        assert (verdict.current, verdict.live_token, verdict.reason) == (False, None, "expired")

    def test_recorded_endings_name_the_reason(self):
        live = grant(token=B, fence=9)
        for ended, want in [
            (EndReason.RELEASED, "released"),
            (EndReason.FORCE_RELEASED, "force_released"),
            (EndReason.EXPIRED, "superseded"),  # someone else holds it now
        ]:
            verdict = rules.judge_fence(live, 7, T0, ended)
            assert (verdict.current, verdict.live_token, verdict.reason) == (False, 9, want)
        assert rules.judge_fence(None, 7, T0, EndReason.EXPIRED).reason == "expired"

    def test_a_token_never_seen_on_this_lock_is_unknown(self):
        live = grant(fence=9)
        assert rules.judge_fence(live, 8, T0, None).reason == "unknown"
        assert rules.judge_fence(live, 10, T0, None).reason == "unknown"
        assert rules.judge_fence(None, 10, T0, None).live_token is None

    def test_an_overdue_keep_lease_is_still_current(self):
        lease = grant(fence=7, ttl=5, on_expiry=OnExpiry.KEEP)
        assert rules.judge_fence(lease, 7, T0 + 60_000, None).current
        dead = replace(lease, deadline_ms=T0 + 60_000)
        assert rules.judge_fence(dead, 7, T0 + 60_000, None).reason == "expired"
