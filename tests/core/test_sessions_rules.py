"""Session rules (SPEC §3.10) and what they change in the lease rules, with
time as a parameter."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from fencepost.core import leases as lease_rules
from fencepost.core import sessions as rules
from fencepost.core.leases import AcquireRequest, EndReason, OnExpiry
from fencepost.core.sessions import SESSION_ID_PATTERN, SessionEnd
from fencepost.core.slots import PoolConfig, Slot, renew
from fencepost.errors import Capped, LeaseExpired, LeaseLost, SessionExpired, SessionLost

NOW = 1_800_000_000_000


def session(ttl_s: int = 30) -> rules.Session:
    return rules.new_session(rules.new_session_id(), "batch", ttl_s, "key_a", NOW)


def test_ids_are_long_random_and_match_their_pattern():
    ids = {rules.new_session_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(SESSION_ID_PATTERN, i) and len(i) == 36 for i in ids)


def test_a_new_session_expires_one_ttl_from_now():
    s = session(30)
    assert (s.created_ms, s.expires_ms, s.ttl_ms, s.ended) == (NOW, NOW + 30_000, 30_000, None)


def test_renewal_sets_the_expiry_outright():
    s = session(30)
    assert rules.decide_renew(s, 5, NOW + 10_000).expires_ms == NOW + 15_000
    assert rules.decide_renew(s, 3600, NOW + 10_000).expires_ms == NOW + 3_610_000


def test_renewal_inside_the_last_second_is_session_expired():
    s = session(30)
    assert rules.decide_renew(s, 30, NOW + 28_999).expires_ms == NOW + 58_999
    with pytest.raises(SessionExpired) as late:
        rules.decide_renew(s, 30, NOW + 29_000)
    assert late.value.extra["expires_in_ms"] == 1_000


@pytest.mark.parametrize("at,ended,reason", [
    (NOW + 30_000, None, "session_expired"),
    (NOW + 1, SessionEnd.ENDED, "session_ended"),
    (NOW + 1, SessionEnd.EXPIRED, "session_expired"),
])
def test_an_ended_session_is_lost_with_its_reason(at, ended, reason):
    s = replace(session(30), ended=ended)
    assert rules.end_of(s, at) is SessionEnd(reason)
    with pytest.raises(SessionLost) as lost:
        rules.decide_renew(s, 30, at)
    assert lost.value.reason == reason
    with pytest.raises(SessionLost):
        rules.require_live(s, at)


def test_attached_expiry_never_passes_the_own_deadline():
    assert rules.attached_expiry_ms(NOW + 5, NOW + 10) == NOW + 5
    assert rules.attached_expiry_ms(NOW + 50, NOW + 10) == NOW + 10


# --- what sessions change in the lease rules ------------------------------------------


def attached(expires_ms: int = NOW + 30_000) -> lease_rules.Lease:
    request = AcquireRequest("tok", 3600, session_id="ses_x", session_expires_ms=expires_ms)
    return lease_rules.new_lease("k", request, NOW, 7)


def test_an_attached_lease_takes_the_sessions_expiry_not_its_ttl():
    lease = attached()
    assert (lease.expires_ms, lease.session_id) == (NOW + 30_000, "ses_x")
    assert lease.on_expiry is OnExpiry.RELEASE


def test_renewing_an_attached_lease_changes_nothing_but_still_needs_it_live():
    lease = attached()
    assert lease_rules.decide_renew(lease, "tok", 5, NOW + 10_000, None) == lease
    with pytest.raises(LeaseExpired):
        lease_rules.decide_renew(lease, "tok", 5, NOW + 29_500, None)
    with pytest.raises(LeaseLost) as lost:
        lease_rules.decide_renew(lease, "tok", 5, NOW + 30_000, None)
    assert lost.value.reason == "session_expired"


def test_a_dead_attached_lease_ended_by_its_session_unless_its_deadline_came():
    assert lease_rules.dead_reason(attached()) is EndReason.SESSION_EXPIRED
    capped = attached(expires_ms=NOW + 10 * lease_rules.LEASE_LIFETIME_MS)
    assert capped.expires_ms == capped.deadline_ms
    assert lease_rules.dead_reason(capped) is EndReason.EXPIRED
    own = lease_rules.new_lease("k", AcquireRequest("t", 30), NOW, 8)
    assert lease_rules.dead_reason(own) is EndReason.EXPIRED


@pytest.mark.parametrize("reason", [EndReason.SESSION_EXPIRED, EndReason.SESSION_ENDED])
def test_a_sessions_end_is_reported_even_after_someone_else_took_the_lock(reason):
    other = lease_rules.new_lease("k", AcquireRequest("other", 30), NOW, 9)
    assert lease_rules.lost_reason(other, "tok", NOW + 1, reason) is reason
    verdict = lease_rules.judge_fence([other], 7, NOW + 1, reason)
    assert (verdict.current, verdict.reason) == (False, reason.value)


def test_a_sessions_expiry_starts_the_lock_delay_and_its_end_does_not():
    lease = replace(attached(), lock_delay_ms=5_000)
    assert lease_rules.delay_until_ms(lease, EndReason.SESSION_EXPIRED, NOW + 40_000) \
        == NOW + 35_000
    assert lease_rules.delay_until_ms(lease, EndReason.SESSION_ENDED, NOW + 1) is None


def test_an_attached_slot_follows_its_session_and_keeps_its_cap():
    config = PoolConfig(limit=1, term_ms=10_000)
    slot = Slot("slot_x", "p", NOW, NOW + 30_000, NOW + 60_000, session_id="ses_x")
    assert renew(slot, config, NOW + 1) == slot
    with pytest.raises(Capped):
        renew(replace(slot, lease_deadline_ms=NOW + 60_000), config, NOW + 1)
