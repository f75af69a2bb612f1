"""A reaper pass ends at most `reap_bound` of each kind, and `reap` runs passes
until one ends fewer: a mass expiry becomes many short batches on the writer
instead of one long one that every other request waits behind."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from fencepost.core.leases import AcquireRequest, Granted
from fencepost.core.slots import PoolConfig
from fencepost.errors import LeaseExpired, LeaseLost
from fencepost.store.base import Freed, lock_freed, pool_freed

P = "default"
BOUND = 5


def _request(ttl: int = 5, wait_ms: int = 0) -> AcquireRequest:
    return AcquireRequest(str(uuid.uuid4()), ttl, wait_ms=wait_ms)


async def _hold(store, key: str, ttl: int = 5) -> str:
    request = _request(ttl)
    result = await store.acquire_lock(P, key, request, wait_alive_ms=None)
    assert isinstance(result.outcome, Granted)
    return request.lock_token


async def test_a_mass_expiry_ends_in_passes_of_at_most_the_bound(store, clock):
    store.reap_bound = BOUND
    freed: list[Freed] = []
    store.add_freed_listener(freed.append)
    tokens = await asyncio.gather(*(_hold(store, f"k{i}") for i in range(3 * BOUND)))
    clock.advance(5_000)
    assert [await store.reap_pass() for _ in range(4)] == [
        (BOUND, True), (BOUND, True), (BOUND, True), (0, False)
    ]
    await asyncio.sleep(0)
    assert {lock_freed(P, f"k{i}") for i in range(3 * BOUND)} <= set(freed)
    for i, lock_token in enumerate(tokens):
        assert (await store.get_lock(P, f"k{i}")).lease is None
        with pytest.raises((LeaseExpired, LeaseLost)) as info:  # the end is on record
            await store.renew_lock(P, f"k{i}", lock_token, 30)
        assert info.value.extra["reason"] == "expired"


async def test_reap_runs_passes_until_nothing_is_left(store, clock):
    store.reap_bound = BOUND
    await store.put_pool(P, "api", PoolConfig(limit=2 * BOUND, term_ms=1_000))
    for _ in range(2 * BOUND):
        assert (await store.acquire_slot(P, "api", wait_alive_ms=None)).slot is not None
    await asyncio.gather(*(_hold(store, f"k{i}") for i in range(3 * BOUND)))
    clock.advance(5_000)
    assert await store.reap() == 3 * BOUND + 2 * BOUND
    assert await store.reap() == 0
    view = await store.get_pool(P, "api")
    assert view.in_use == 0 and view.stats.reclaimed == 2 * BOUND


async def test_dead_waiters_leave_at_most_the_bound_per_pass(store, clock):
    store.reap_bound = BOUND
    freed: list[Freed] = []
    store.add_freed_listener(freed.append)
    await _hold(store, "k", ttl=600)
    await store.put_pool(P, "api", PoolConfig(limit=1, queue_size=100))
    assert (await store.acquire_slot(P, "api", wait_alive_ms=None)).slot is not None
    for _ in range(3 * BOUND):
        waiting = await store.acquire_lock(P, "k", _request(wait_ms=60_000), wait_alive_ms=1_000)
        assert waiting.ticket is not None
        queued = await store.acquire_slot(P, "api", wait_ms=1_000, wait_alive_ms=1_000)
        assert queued.ticket is not None
    clock.advance(1_000)  # no retry refreshed them: dead
    # Each pass drops BOUND of each line's dead waiters and says more may be
    # left; without the bound the first would drop all and the second say none.
    assert [await store.reap_pass() for _ in range(4)] == [
        (0, True), (0, True), (0, True), (0, False)
    ]
    await asyncio.sleep(0)
    assert lock_freed(P, "k") in freed and pool_freed(P, "api") in freed
