"""Store rules for owner force release (SPEC §3.5), fence checks (§3.8), lock
delay (§3.9) and key refresh (§5), identical on every backend."""

from __future__ import annotations

import uuid

import pytest

from fencepost.core.leases import AcquireRequest, Granted
from fencepost.errors import Forbidden, LeaseLost
from fencepost.store.base import ForceReleaser

P = "default"
ADMIN = ForceReleaser("key_admin", is_admin=True)


def token() -> str:
    return str(uuid.uuid4())


def req(tok: str | None = None, ttl: int = 30, **kw) -> AcquireRequest:
    return AcquireRequest(tok or token(), ttl, **kw)


async def grant(store, key="k", tok=None, ttl=30, **kw):
    result = await store.acquire_lock(P, key, req(tok, ttl, **kw), wait_alive_ms=None)
    assert isinstance(result.outcome, Granted), result
    return result.outcome.lease


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
