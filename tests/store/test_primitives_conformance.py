"""Store rules for owner force release (SPEC §3.5), fence checks (§3.8), lock
delay (§3.9) and key refresh (§5), identical on every backend."""

from __future__ import annotations

import asyncio

import pytest

from fencepost.core.leases import Busy, Granted
from fencepost.errors import Forbidden, LeaseLost, Unauthorized, ValidationError
from fencepost.store.base import ForceReleaser, Freed, lock_freed

from .store_support import ADMIN, P, grant, req, token

# --- owner force release (§3.5) ------------------------------------------------


async def test_the_acquiring_key_is_recorded_on_the_lease(store):
    lease = await grant(store, key_id="key_owner")
    assert lease.key_id == "key_owner"
    assert (await store.get_lock(P, "k")).lease.key_id == "key_owner"


async def test_only_the_owner_key_or_an_admin_may_force_release(store):
    a = token()
    lease = await grant(store, tok=a, key_id="key_owner")
    with pytest.raises(Forbidden):
        await store.force_release(P, "k", ForceReleaser("key_other", is_admin=False))
    assert (await store.get_lock(P, "k")).lease == lease  # refused: nothing changed
    result = await store.force_release(P, "k", ForceReleaser("key_owner", is_admin=False))
    assert result.lease == lease
    with pytest.raises(LeaseLost) as info:
        await store.renew_lock(P, "k", a, 30)
    assert info.value.extra["reason"] == "force_released"


async def test_an_admin_may_force_release_a_lease_of_unknown_owner(store):
    await grant(store)  # taken before keys were recorded: no owner
    with pytest.raises(Forbidden):
        await store.force_release(P, "k", ForceReleaser("key_member", is_admin=False))
    assert (await store.force_release(P, "k", ADMIN)).lease is not None


async def test_a_member_force_releasing_a_free_lock_changes_nothing(store):
    result = await store.force_release(P, "k", ForceReleaser("key_member", is_admin=False))
    assert result.lease is None


# --- fence check (§3.8) ---------------------------------------------------------


async def fence(store, token, key="k"):
    verdict = await store.fence_check(P, key, token)
    return verdict.current, verdict.live_token, verdict.reason


async def test_fence_check_follows_a_lock_through_every_ending(store, clock):
    a, b, c = token(), token(), token()
    first = await grant(store, tok=a)
    assert await fence(store, first.fencing_token) == (True, first.fencing_token, None)
    assert await store.release_lock(P, "k", a)
    assert await fence(store, first.fencing_token) == (False, None, "released")

    second = await grant(store, tok=b, ttl=5)
    clock.advance(5_000)  # dead, not yet reaped: still the row
    assert await fence(store, second.fencing_token) == (False, None, "expired")
    await store.reap()
    assert await fence(store, second.fencing_token) == (False, None, "expired")

    third = await grant(store, tok=c)
    live = third.fencing_token
    assert await fence(store, second.fencing_token) == (False, live, "superseded")
    assert await fence(store, first.fencing_token) == (False, live, "released")
    await store.force_release(P, "k", ADMIN)
    assert await fence(store, live) == (False, None, "force_released")


async def test_fence_check_of_a_token_never_issued_here_is_unknown(store):
    lease = await grant(store, "other")
    assert await fence(store, lease.fencing_token, key="k") == (False, None, "unknown")
    assert await fence(store, 2**53 - 1) == (False, None, "unknown")


async def test_an_expired_lease_replaced_by_an_acquire_is_superseded(store, clock):
    old = await grant(store, ttl=5)
    clock.advance(5_000)
    new = await grant(store)  # replaces the dead row without the reaper
    assert await fence(store, old.fencing_token) == (False, new.fencing_token, "superseded")


# --- lock delay (§3.9) ------------------------------------------------------------


async def refused(store, key="k", tok=None):
    result = await store.acquire_lock(P, key, req(tok), wait_alive_ms=None)
    assert isinstance(result.outcome, Busy), result
    return result.outcome


async def test_an_expired_lease_delays_the_next_grant_from_its_expiry(store, clock):
    await grant(store, ttl=5, lock_delay_seconds=10)
    clock.advance(5_000)  # expired; not yet reaped: the acquire itself sees it
    busy = await refused(store)
    assert busy.delay_until_ms == clock.now + 10_000
    error = busy.to_error()
    assert error.reason == "lock_delay" and error.retry_after_ms == 10_000
    clock.advance(3_000)
    await store.reap()  # the reaper keeps the delay measured from the expiry
    assert (await refused(store)).delay_until_ms == clock.now + 7_000
    clock.advance(6_999)
    await refused(store)
    clock.advance(1)
    assert (await grant(store)).lock_delay_ms == 0


async def test_a_delay_ending_wakes_the_line(store, clock):
    events: list[Freed] = []
    store.add_freed_listener(events.append)
    await grant(store, ttl=5, lock_delay_seconds=2)
    clock.advance(5_000)
    await store.reap()
    await asyncio.sleep(0)
    events.clear()
    clock.advance(2_000)
    await store.reap()
    await asyncio.sleep(0)
    assert lock_freed(P, "k") in events
    await grant(store)


async def test_force_release_starts_the_delay_and_a_holders_release_does_not(store, clock):
    a = token()
    await grant(store, tok=a, ttl=60, lock_delay_seconds=30)
    await store.force_release(P, "k", ADMIN)
    assert (await refused(store)).delay_until_ms == clock.now + 30_000
    clock.advance(30_000)
    b = token()
    await grant(store, tok=b, lock_delay_seconds=30)
    assert await store.release_lock(P, "k", b)
    await grant(store)  # at once: its holder released it


async def test_waiters_keep_their_place_through_the_delay(store, clock):
    await grant(store, ttl=5, lock_delay_seconds=5)
    w1, w2 = req(), req()
    first = await store.acquire_lock(P, "k", w1, wait_alive_ms=60_000)
    second = await store.acquire_lock(P, "k", w2, wait_alive_ms=60_000)
    clock.advance(5_000)
    await store.reap()
    busy = await store.retry_waiter(P, "k", w1, first.ticket, 60_000)
    assert isinstance(busy.outcome, Busy) and busy.outcome.delay_until_ms == clock.now + 5_000
    assert busy.ticket == first.ticket  # still first in line
    clock.advance(5_000)
    await refused(store)  # a fail-fast caller does not jump the line
    assert isinstance((await store.retry_waiter(P, "k", w2, second.ticket, 60_000)).outcome, Busy)
    granted = await store.retry_waiter(P, "k", w1, first.ticket, 60_000)
    assert isinstance(granted.outcome, Granted)
    assert granted.outcome.lease.lock_token == w1.lock_token


async def test_a_keep_lease_delays_from_its_deadline(store, clock):
    from fencepost.core.leases import LEASE_LIFETIME_MS, OnExpiry

    await grant(store, ttl=5, on_expiry=OnExpiry.KEEP, lock_delay_seconds=1)
    clock.advance(LEASE_LIFETIME_MS)
    assert (await refused(store)).delay_until_ms == clock.now + 1_000


# --- key refresh (§5) ----------------------------------------------------------------


async def test_refresh_mints_a_successor_with_the_callers_terms(store, clock):
    from fencepost.core.keys import Role
    from fencepost.store.base import NewKey

    await store.bootstrap(None)  # creates the project

    original, secret = await store.create_key(
        P, NewKey(Role.MEMBER, "worker", 3_600_000, ["10.0.0.0/8"], 100)
    )
    clock.advance(1_000_000)
    successor, new_secret = await store.refresh_key(original.id, None)
    assert new_secret != secret and successor.id != original.id
    assert (successor.project, successor.role, successor.name, successor.allow_ips,
            successor.rpm_quota) == (P, Role.MEMBER, "worker", ["10.0.0.0/8"], 100)
    assert successor.expires_ms == clock.now + 3_600_000  # the caller's own lifetime
    assert (successor.parent_id, successor.root_id) == (original.id, original.id)
    assert (await store.find_key(secret)).revoked_ms is None  # the old one keeps working
    clock.advance(60_000)  # a lineage refreshes once a minute
    shorter, _ = await store.refresh_key(successor.id, 150_000)
    assert shorter.expires_ms == clock.now + 150_000
    assert (shorter.parent_id, shorter.root_id) == (successor.id, original.id)
    # From a short-lived successor the default is its own (short) lifetime, and
    # nothing in the chain may outlive what an admin granted the original (a
    # lineage refreshes once a minute: the clock moves on between).
    clock.advance(60_000)
    assert (await store.refresh_key(shorter.id, None))[0].expires_ms == clock.now + 150_000
    clock.advance(60_000)
    assert (await store.refresh_key(shorter.id, 3_600_000))[0].expires_ms == \
        clock.now + 3_600_000
    with pytest.raises(ValidationError):  # refused for the lifetime, before the minute
        await store.refresh_key(shorter.id, 3_600_001)


async def test_a_lineage_refreshes_at_most_once_a_minute(store, clock):
    from fencepost.core.keys import Role
    from fencepost.errors import QuotaExceeded
    from fencepost.store.base import NewKey

    await store.bootstrap(None)  # creates the project

    original, _ = await store.create_key(P, NewKey(Role.READER, expires_in_ms=3_600_000))
    other, _ = await store.create_key(P, NewKey(Role.READER, expires_in_ms=3_600_000))
    successor, _ = await store.refresh_key(original.id, None)
    clock.advance(20_000)
    with pytest.raises(QuotaExceeded) as refused:
        await store.refresh_key(original.id, None)
    assert refused.value.retry_after_ms == 40_000
    # The successor shares its first key's minute (SPEC §5: a lineage, not a
    # key): successors each refreshing at once would multiply otherwise.
    with pytest.raises(QuotaExceeded) as refused:
        await store.refresh_key(successor.id, None)
    assert refused.value.retry_after_ms == 40_000
    assert len(await store.list_keys(P)) == 4  # bootstrap, original, other, one successor
    await store.refresh_key(other.id, None)  # another lineage has a minute of its own
    clock.advance(40_000)
    grandchild, _ = await store.refresh_key(successor.id, None)  # a minute after the last
    assert grandchild.root_id == original.id
    clock.advance(30_000)
    with pytest.raises(QuotaExceeded) as refused:  # the first key counts its grandchild
        await store.refresh_key(original.id, None)
    assert refused.value.retry_after_ms == 30_000
    clock.advance(30_000)
    await store.refresh_key(original.id, None)


async def test_a_key_without_expiry_refreshes_to_one_without_expiry(store, clock):
    from fencepost.core.keys import Role
    from fencepost.store.base import NewKey

    await store.bootstrap(None)  # creates the project

    original, _ = await store.create_key(P, NewKey(Role.READER))
    successor, _ = await store.refresh_key(original.id, None)
    assert successor.expires_ms is None and successor.role is Role.READER
    clock.advance(60_000)
    assert (await store.refresh_key(original.id, 60_000))[0].expires_ms is not None


async def test_an_expired_or_revoked_key_cannot_refresh(store, clock):
    from fencepost.core.keys import Role
    from fencepost.store.base import NewKey

    await store.bootstrap(None)  # creates the project

    expiring, _ = await store.create_key(P, NewKey(Role.MEMBER, expires_in_ms=10_000))
    clock.advance(10_000)
    with pytest.raises(Unauthorized):
        await store.refresh_key(expiring.id, None)
    revoked, _ = await store.create_key(P, NewKey(Role.MEMBER))
    assert await store.revoke_key(P, revoked.id)
    with pytest.raises(Unauthorized):
        await store.refresh_key(revoked.id, None)


async def test_revoking_a_key_revokes_every_successor_and_only_those(store, clock):
    from fencepost.core.keys import Role
    from fencepost.store.base import NewKey

    await store.bootstrap(None)  # creates the project

    leaked, _ = await store.create_key(P, NewKey(Role.MEMBER, expires_in_ms=3_600_000))
    child, child_secret = await store.refresh_key(leaked.id, None)
    clock.advance(60_000)  # a lineage refreshes once a minute
    grandchild, grandchild_secret = await store.refresh_key(child.id, None)
    clock.advance(60_000)
    sibling, sibling_secret = await store.refresh_key(leaked.id, None)
    other, other_secret = await store.create_key(P, NewKey(Role.MEMBER))
    # Revoking a middle key ends it and what was minted from it, not its parent.
    assert await store.revoke_key(P, child.id)
    assert (await store.find_key(grandchild_secret)).revoked_ms is not None
    assert (await store.find_key(sibling_secret)).revoked_ms is None
    # Revoking the root ends the whole chain; an unrelated key lives on.
    assert await store.revoke_key(P, leaked.id)
    assert (await store.find_key(sibling_secret)).revoked_ms is not None
    assert (await store.find_key(child_secret)).revoked_ms is not None
    assert (await store.find_key(other_secret)).revoked_ms is None
    assert not await store.revoke_key("elsewhere", other.id)
