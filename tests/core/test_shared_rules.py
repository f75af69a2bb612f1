"""Shared locks and lock sets as pure rules (SPEC §3.6, §3.7): which lease
keeps whom out, one line across modes, and all-or-nothing sets."""

from __future__ import annotations

import itertools

from fencepost.core import leases as rules
from fencepost.core.leases import (
    AcquireRequest,
    Busy,
    Granted,
    LockState,
    Mode,
    OnExpiry,
    SetGranted,
)

T0 = 1_800_000_000_000
A = "00000000-0000-4000-8000-00000000000a"
B = "00000000-0000-4000-8000-00000000000b"
C = "00000000-0000-4000-8000-00000000000c"


def tokens(start: int = 1):
    counter = itertools.count(start)
    return lambda: next(counter)


def lease(token: str, mode: Mode, ttl: int = 30, fence: int = 1, keep: bool = False):
    request = AcquireRequest(
        token, ttl, mode=mode, on_expiry=OnExpiry.KEEP if keep else OnExpiry.RELEASE
    )
    return rules.new_lease("k", request, T0, fence)


def acquire(token: str, mode: Mode, held=(), now: int = T0, ahead: int = 0, exclusive: int = 0):
    return rules.decide_acquire(
        "k", held, AcquireRequest(token, 30, mode=mode), now,
        waiters_ahead=ahead, exclusive_ahead=exclusive, next_fencing_token=tokens(10),
    )


class TestModes:
    def test_shared_leases_live_together_each_with_its_own_token(self):
        first = lease(A, Mode.SHARED)
        outcome = acquire(B, Mode.SHARED, (first,))
        assert isinstance(outcome, Granted) and outcome.created
        assert outcome.lease.mode is Mode.SHARED
        assert outcome.lease.fencing_token == 10 != first.fencing_token

    def test_exclusive_waits_for_every_shared_lease(self):
        outcome = acquire(C, Mode.EXCLUSIVE, (lease(A, Mode.SHARED), lease(B, Mode.SHARED, 60)))
        assert isinstance(outcome, Busy)
        # The refusal names the lease whose end frees the lock last.
        assert outcome.holder is not None and outcome.holder.lock_token == B

    def test_shared_waits_for_an_exclusive_lease(self):
        assert isinstance(acquire(B, Mode.SHARED, (lease(A, Mode.EXCLUSIVE),)), Busy)

    def test_a_keep_lease_is_named_before_one_that_expires_later(self):
        held = (lease(A, Mode.SHARED, keep=True, ttl=5), lease(B, Mode.SHARED, ttl=600))
        outcome = acquire(C, Mode.EXCLUSIVE, held)
        assert isinstance(outcome, Busy) and outcome.holder is not None
        assert outcome.holder.lock_token == A
        assert outcome.to_error().extra.get("retry_after_ms") is None

    def test_dead_shared_leases_do_not_block(self):
        outcome = acquire(C, Mode.EXCLUSIVE, (lease(A, Mode.SHARED, ttl=5),), now=T0 + 5_000)
        assert isinstance(outcome, Granted) and outcome.created

    def test_a_retried_acquire_gets_its_lease_whatever_mode_it_asks(self):
        mine = lease(A, Mode.SHARED)
        outcome = acquire(A, Mode.EXCLUSIVE, (mine, lease(B, Mode.SHARED)))
        assert isinstance(outcome, Granted) and not outcome.created and outcome.lease == mine


class TestOneLine:
    def test_shared_behind_an_exclusive_waiter_waits_writers_never_starve(self):
        outcome = acquire(B, Mode.SHARED, (lease(A, Mode.SHARED),), ahead=1, exclusive=1)
        assert isinstance(outcome, Busy) and outcome.holder is None

    def test_shared_behind_only_shared_waiters_joins_them(self):
        outcome = acquire(B, Mode.SHARED, (lease(A, Mode.SHARED),), ahead=3, exclusive=0)
        assert isinstance(outcome, Granted) and outcome.created

    def test_exclusive_waits_for_any_waiter_ahead(self):
        assert isinstance(acquire(B, Mode.EXCLUSIVE, (), ahead=1, exclusive=0), Busy)


class TestSets:
    def states(self, **held):
        return {key: LockState(leases=held.get(key, ())) for key in ("x", "y", "z")}

    def test_all_free_grants_every_key_in_order_with_rising_tokens(self):
        request = AcquireRequest(A, 30)
        outcome = rules.decide_set(["z", "x", "y"], self.states(), request, T0, tokens(5))
        assert isinstance(outcome, SetGranted) and outcome.created
        assert [lease.key for lease in outcome.leases] == ["z", "x", "y"]
        assert [lease.fencing_token for lease in outcome.leases] == [5, 6, 7]
        assert {lease.lock_token for lease in outcome.leases} == {A}

    def test_one_busy_key_refuses_the_set_naming_the_first_busy_key(self):
        fence = tokens(5)
        states = self.states(y=(lease(B, Mode.EXCLUSIVE),), z=(lease(C, Mode.EXCLUSIVE),))
        outcome = rules.decide_set(["x", "z", "y"], states, AcquireRequest(A, 30), T0, fence)
        assert isinstance(outcome, Busy) and outcome.key == "z"
        assert outcome.to_error().extra["key"] == "z"
        assert fence() == 5  # a refused set draws no token

    def test_a_retry_keeps_the_leases_already_held(self):
        first = rules.decide_set(["x", "y"], self.states(), AcquireRequest(A, 30), T0, tokens())
        assert isinstance(first, SetGranted)
        states = self.states(x=(first.leases[0],), y=(first.leases[1],))
        again = rules.decide_set(["x", "y"], states, AcquireRequest(A, 60), T0 + 1, tokens(50))
        assert isinstance(again, SetGranted) and not again.created
        assert again.leases == first.leases

    def test_a_shared_set_joins_shared_holders(self):
        states = self.states(x=(lease(B, Mode.SHARED),))
        request = AcquireRequest(A, 30, mode=Mode.SHARED)
        outcome = rules.decide_set(["x", "y"], states, request, T0, tokens())
        assert isinstance(outcome, SetGranted)
        assert all(lease.mode is Mode.SHARED for lease in outcome.leases)


class TestForceRelease:
    def test_a_member_may_end_the_shared_leases_only_when_it_took_every_one(self):
        mine = rules.new_lease("k", AcquireRequest(A, 30, key_id="me", mode=Mode.SHARED), T0, 1)
        theirs = rules.new_lease(
            "k", AcquireRequest(B, 30, key_id="them", mode=Mode.SHARED), T0, 2
        )
        assert rules.may_force_release_all([mine], "me", is_admin=False)
        assert not rules.may_force_release_all([mine, theirs], "me", is_admin=False)
        assert rules.may_force_release_all([mine, theirs], "me", is_admin=True)


class TestFenceOfSharedLeases:
    def test_each_shared_lease_is_current_by_its_own_token(self):
        held = (lease(A, Mode.SHARED, fence=7), lease(B, Mode.SHARED, fence=9))
        for token in (7, 9):
            verdict = rules.judge_fence(held, token, T0 + 1, None)
            assert (verdict.current, verdict.live_token) == (True, token)

    def test_a_dead_shared_token_names_the_newest_live_one(self):
        held = (lease(A, Mode.SHARED, ttl=5, fence=7), lease(B, Mode.SHARED, ttl=60, fence=9))
        verdict = rules.judge_fence(held, 7, T0 + 5_000, None)
        assert (verdict.current, verdict.live_token, verdict.reason) == (False, 9, "expired")
