"""The clients' fence check (§3.8), lock delay (§3.9), owner force release
(§3.5) and key refresh (§5) against a real server."""

from __future__ import annotations

import pytest

import fencepost
import fencepost.client
from fencepost.errors import Forbidden, LockHeld
from support import ServerProcess, unique_name


def test_fence_check_sync(server: ServerProcess, member_key: str, reader_key: str) -> None:
    key = unique_name("cfence")
    with fencepost.Client(server.base_url, member_key) as member, \
            fencepost.Client(server.base_url, reader_key) as reader:
        lease = member.acquire_lock(key, ttl=30)
        now = reader.fence_check(key, lease.fencing_token)
        assert isinstance(now, fencepost.client.FenceCheck)
        assert (now.current, now.live_token, now.reason) == (True, lease.fencing_token, None)
        assert member.release_lock(key, lease.lock_token)
        stale = reader.fence_check(key, lease.fencing_token)
        assert (stale.current, stale.live_token, stale.reason) == (False, None, "released")
        with pytest.raises(ValueError):
            reader.fence_check(key, -1)


async def test_fence_check_async(server: ServerProcess, member_key: str) -> None:
    key = unique_name("cfence")
    async with fencepost.AsyncClient(server.base_url, member_key) as member:
        lease = await member.acquire_lock(key, ttl=30)
        assert (await member.fence_check(key, lease.fencing_token)).current is True
        assert (await member.fence_check(key, lease.fencing_token + 1)).reason == "unknown"


def test_the_owner_key_force_releases_its_lease(server: ServerProcess, member_key: str) -> None:
    key = unique_name("cowner")
    other = str(server.create_key("member", name="client-not-owner")["key"])
    with fencepost.Client(server.base_url, member_key) as member, \
            fencepost.Client(server.base_url, other) as stranger:
        lease = member.acquire_lock(key, ttl=30, operation="job")
        with pytest.raises(Forbidden):
            stranger.force_release(key)
        forced = member.force_release(key)
        assert forced.released and forced.fencing_token == lease.fencing_token


def test_lock_with_a_lock_delay(server: ServerProcess, member_key: str) -> None:
    key = unique_name("cdelay")
    with fencepost.Client(server.base_url, member_key) as member:
        with member.lock(key, ttl=30, lock_delay=30, raise_on_loss=False) as hold:
            forced = member.force_release(key)
            assert forced.released and forced.fencing_token == hold.fencing_token
        # The lease ended by force release: the lock is in its delay.
        with pytest.raises(LockHeld) as held:
            member.acquire_lock(key, ttl=30)
        assert held.value.reason == "lock_delay"
        assert held.value.retry_after is not None and 0 < held.value.retry_after <= 30


async def test_acquire_lock_with_a_lock_delay_async(server: ServerProcess,
                                                    member_key: str) -> None:
    key = unique_name("cdelay")
    async with fencepost.AsyncClient(server.base_url, member_key) as member:
        lease = await member.acquire_lock(key, ttl=30, lock_delay=5)
        await member.force_release(key)
        with pytest.raises(LockHeld) as held:
            await member.acquire_lock(key, ttl=30)
        assert held.value.reason == "lock_delay"
        assert lease.fencing_token > 0
