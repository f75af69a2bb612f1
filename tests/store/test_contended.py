"""A hot lock's fail-fast acquires (store/sql/locks.py): once the writer has
found a lock held by someone else, its next fail-fast acquires first read what
a refusal is decided on (instead of a guarded insert), so that on PostgreSQL
they are refused from the batch's one pipeline. Whatever is decided that way must be
what the general case would decide: the same refusal, a grant where the lock
is free after all, the caller's own lease on a retry, and fairness to the
line. The rules hold on every backend; the round-trip count is PostgreSQL's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fencepost.core.leases import AcquireRequest, Busy, Granted
from fencepost.store.sqlite import SqliteStore

from .conftest import reopen
from .store_support import ADMIN, P, grant, token
from .wire_trace import count_round_trips, summary, wire_trace


def _acquire(store: Any, key: str, tok: str | None = None, **kw: Any) -> Any:
    return store.acquire_lock(P, key, AcquireRequest(tok or token(), 30, **kw),
                              wait_alive_ms=None)


async def _contend(store: Any, key: str, **kw: Any) -> Any:
    """Hold `key` and have one acquire refused (the writer learns it is busy);
    the holder's lease."""
    lease = await grant(store, key, operation="deploy", **kw)
    refused = await _acquire(store, key)
    assert isinstance(refused.outcome, Busy)
    return lease


def _batches(store: Any) -> list[int]:
    sizes: list[int] = []

    def observe(writer: bool, size: int, seconds: float, failed: bool, replayed: bool) -> None:
        if writer:
            sizes.append(size)

    store.watch_batches(observe)
    return sizes


async def test_a_hot_locks_fail_fast_acquires_are_refused_without_more_round_trips(store):
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite's statements are calls in this process, not round trips")
    await _contend(store, "hot")
    sizes = _batches(store)
    with wire_trace(store) as lines:
        results = await asyncio.gather(*(_acquire(store, "hot") for _ in range(20)))
    assert all(isinstance(r.outcome, Busy) for r in results)
    _, round_trips = count_round_trips(lines)
    # Each batch: its begin, its pipeline, its commit; none per refusal.
    assert round_trips <= 3 * len(sizes) < 20, summary(lines)


async def test_the_refusal_is_the_one_the_general_case_gives(store, clock):
    holder = await grant(store, "hot", operation="deploy")
    first = (await _acquire(store, "hot")).outcome  # the general case
    clock.advance(1000)
    second = (await _acquire(store, "hot")).outcome  # decided from the pipeline
    assert isinstance(first, Busy) and isinstance(second, Busy)
    assert first.holder == second.holder == holder
    assert first.key is None and second.key is None  # the path names the key
    assert second.to_error().extra["expires_in_ms"] == first.to_error().extra[
        "expires_in_ms"] - 1000
    # And the refusal left nothing behind: the holder still holds, nobody waits.
    view = await store.get_lock(P, "hot")
    assert view.lease == holder and view.waiters == 0


async def test_a_release_ahead_in_the_batch_lets_the_next_acquire_in(store):
    held = await _contend(store, "handed")
    successor = token()
    released, *_, taken, refused = await asyncio.gather(
        store.release_lock(P, "handed", held.lock_token),
        *(grant(store, f"beside-{i}") for i in range(10)),
        _acquire(store, "handed", successor),
        _acquire(store, "handed"),
    )
    assert released is True
    assert isinstance(taken.outcome, Granted)
    assert taken.outcome.lease.fencing_token > held.fencing_token
    assert isinstance(refused.outcome, Busy)
    assert refused.outcome.holder == taken.outcome.lease
    assert (await store.get_lock(P, "handed")).lease == taken.outcome.lease


async def test_an_acquire_ahead_of_the_release_in_the_batch_answers_what_is_stored(store):
    """Operations of one batch are concurrent: the acquire may be decided
    before the release (refused) or after it (granted); either way the answer
    is what the store then holds."""
    held = await _contend(store, "handed")
    tried, released = await asyncio.gather(
        _acquire(store, "handed"), store.release_lock(P, "handed", held.lock_token))
    assert released is True
    lease = (await store.get_lock(P, "handed")).lease
    if isinstance(tried.outcome, Busy):
        assert tried.outcome.holder == held and lease is None
    else:
        assert isinstance(tried.outcome, Granted) and lease == tried.outcome.lease


async def test_a_lock_freed_elsewhere_is_granted_despite_the_memory(store, clock):
    held = await _contend(store, "moved")
    other = reopen(store, clock)
    await other.open()
    try:
        assert await other.release_lock(P, "moved", held.lock_token) is True
    finally:
        await other.close()
    taken = await _acquire(store, "moved")
    assert isinstance(taken.outcome, Granted) and taken.outcome.created
    assert taken.outcome.lease.fencing_token > held.fencing_token


async def test_the_holders_retry_on_a_hot_lock_gets_its_own_lease(store):
    held = await _contend(store, "mine")
    again = await _acquire(store, "mine", held.lock_token)
    assert isinstance(again.outcome, Granted) and not again.outcome.created
    assert again.outcome.lease == held


async def test_a_dead_holder_is_replaced_not_refused(store, clock):
    held = await _contend(store, "dead")
    clock.advance(31_000)  # past its expiry; the reaper has not run
    taken = await _acquire(store, "dead")
    assert isinstance(taken.outcome, Granted) and taken.outcome.created
    assert taken.outcome.lease.fencing_token > held.fencing_token


async def test_a_free_lock_with_a_line_still_refuses_newcomers(store, clock):
    await _contend(store, "queued")
    waiter = await store.acquire_lock(
        P, "queued", AcquireRequest(token(), 30, wait_ms=60_000), wait_alive_ms=60_000)
    assert waiter.ticket is not None
    await store.force_release(P, "queued", ADMIN)
    refused = await _acquire(store, "queued")
    assert isinstance(refused.outcome, Busy)
    assert refused.outcome.holder is None and refused.outcome.waiters == 1


async def test_a_lock_delay_refuses_from_the_pipeline_too(store, clock):
    await _contend(store, "delayed", lock_delay_seconds=10)
    await store.force_release(P, "delayed", ADMIN)
    refused = await _acquire(store, "delayed")
    assert isinstance(refused.outcome, Busy)
    assert refused.outcome.delay_until_ms == clock.now + 10_000
    assert refused.outcome.to_error().extra["reason"] == "lock_delay"
    clock.advance(10_001)
    assert isinstance((await _acquire(store, "delayed")).outcome, Granted)


async def test_a_dead_leases_release_starts_its_delay_before_an_acquire_beside_it(store, clock):
    """The holder of a lease that expired (not yet reaped) releases it while
    someone acquires in the same batch: the lease ended by expiry, so its lock
    delay holds the newcomer off (SPEC §3.9), whichever comes first."""
    held = await grant(store, "late", lock_delay_seconds=10)
    clock.advance(30_000)  # its expiry instant: dead from here on
    released, *_, tried = await asyncio.gather(
        store.release_lock(P, "late", held.lock_token),
        *(grant(store, f"beside-{i}") for i in range(10)),
        _acquire(store, "late"),
    )
    assert released is False  # it had expired: not held any more
    assert isinstance(tried.outcome, Busy), tried
    assert tried.outcome.delay_until_ms == held.expires_ms + 10_000
    assert (await store.get_lock(P, "late")).lease is None
