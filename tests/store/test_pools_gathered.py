"""Pool acquires and releases of one batch as one statement each (store/sql/pools.py,
together.py's `shares_keys`): on PostgreSQL the common-case acquires of a batch,
whatever pools they name, go out in one statement that admits each pool's in
batch order up to its room, and the releases without a report in one that
deletes every slot and counts each pool's live ones. What they decide must be
what each operation in its turn decides; the rules hold on every backend (on
SQLite each operation runs whole, which these tests check just as well)."""

from __future__ import annotations

import asyncio
from typing import Any

from fencepost.core.slots import PoolConfig
from fencepost.errors import NotFound
from fencepost.store.sql import pools as pool_statements
from fencepost.store.sql.pools import _LOAD_WITH_COUNTS, _POOL_AND_SLOT

from .conftest import reopen
from .store_support import P
from .test_pools_fast_path import WriterStatements


async def _acquire(store: Any, pool: str, project: str = P) -> Any:
    return await store.acquire_slot(project, pool, wait_ms=0, wait_alive_ms=None)


async def test_a_batch_admits_in_order_up_to_the_room_left(store):
    await store.put_pool(P, "api", PoolConfig(limit=5))
    held = [await _acquire(store, "api") for _ in range(2)]
    assert all(h.slot is not None for h in held)
    results = await asyncio.gather(*(_acquire(store, "api") for _ in range(8)))
    assert [r.slot is not None for r in results] == [True] * 3 + [False] * 5
    assert [r.in_use for r in results] == [3, 4, 5] + [5] * 5
    assert (await store.get_pool(P, "api")).in_use == 5


async def test_each_pool_of_a_batch_has_its_own_room(store):
    await store.put_pool(P, "small", PoolConfig(limit=2))
    await store.put_pool(P, "large", PoolConfig(limit=3))
    await _acquire(store, "small")  # the writer knows both pools, one slot held
    await _acquire(store, "large")
    results = await asyncio.gather(*(
        _acquire(store, pool) for _ in range(4) for pool in ("small", "large")))
    small, large = results[0::2], results[1::2]
    assert [r.slot is not None for r in small] == [True, False, False, False]
    assert [r.slot is not None for r in large] == [True, True, False, False]
    assert [r.in_use for r in large[:2]] == [2, 3]
    assert (await store.get_pool(P, "small")).in_use == 2
    assert (await store.get_pool(P, "large")).in_use == 3


async def test_a_pool_of_the_same_name_in_another_project_is_another_pool(store):
    await store.create_project("other")
    for project in (P, "other"):
        await store.put_pool(project, "api", PoolConfig(limit=1))
        known = await _acquire(store, "api", project)  # the writer knows the pool
        assert await store.release_slot(project, "api", known.slot.slot_id, None)
    sent = WriterStatements(store)
    results = await asyncio.gather(*(
        _acquire(store, "api", project) for _ in range(2) for project in (P, "other")))
    assert [r.slot is not None for r in results] == [True, True, False, False]
    # Each was decided by the common case: the full pool's refusals only read.
    assert sent.took(_LOAD_WITH_COUNTS) == 2
    assert (await store.get_pool(P, "api")).in_use == 1
    assert (await store.get_pool("other", "api")).in_use == 1


async def test_a_stale_memory_of_the_pool_admits_by_the_row(store, clock):
    await store.put_pool(P, "api", PoolConfig(limit=4))
    await _acquire(store, "api")  # remembered at limit 4
    other = reopen(store, clock)
    await other.open()
    try:
        await other.put_pool(P, "api", PoolConfig(limit=2))  # a new version
    finally:
        await other.close()
    results = await asyncio.gather(*(_acquire(store, "api") for _ in range(4)))
    assert sum(r.slot is not None for r in results) == 1
    assert (await store.get_pool(P, "api")).in_use == 2


async def test_a_batch_of_releases_counts_each_live_slot_once(store, clock):
    await store.put_pool(P, "api", PoolConfig(limit=10, term_ms=1_000))
    dying = [await _acquire(store, "api") for _ in range(2)]
    clock.advance(600)
    live = [await _acquire(store, "api") for _ in range(3)]
    clock.advance(500)  # the first two are past their lease deadline, not yet reaped
    twice = live[0].slot.slot_id
    results = await asyncio.gather(
        *(store.release_slot(P, "api", a.slot.slot_id, None) for a in dying + live),
        store.release_slot(P, "api", twice, None),
    )
    assert results[:2] == [False, False]  # no longer held
    assert sorted(results[2:]) == [False, True, True, True]  # the repeat finds it gone
    view = await store.get_pool(P, "api")
    assert view.in_use == 0
    assert view.stats.released == 3 and view.stats.reclaimed == 2


async def test_a_release_in_another_pool_or_project_is_refused_and_changes_nothing(store):
    await store.create_project("other")
    other = "other"
    await store.put_pool(P, "api", PoolConfig(limit=3))
    await store.put_pool(P, "db", PoolConfig(limit=3))
    await store.put_pool(other, "api", PoolConfig(limit=3))
    slot = (await _acquire(store, "api")).slot
    results = await asyncio.gather(
        store.release_slot(P, "db", slot.slot_id, None),
        store.release_slot(other, "api", slot.slot_id, None),
        return_exceptions=True,
    )
    assert all(isinstance(r, (NotFound, bool)) and r is not True for r in results)
    assert (await store.get_pool(P, "api")).in_use == 1
    assert await store.release_slot(P, "api", slot.slot_id, None) is True
    assert (await store.get_pool(P, "api")).stats.released == 1


def test_the_gathered_statements_share_keys():
    # Only statements written to decide operations on one key in order may
    # gather operations that share it (together.py).
    assert pool_statements._ADMIT_IN_ORDER.shares_keys
    assert pool_statements._RELEASE_UNREPORTED.shares_keys


async def test_a_batch_of_renewals_extends_each_live_slot_by_its_term(store, clock):
    await store.put_pool(P, "api", PoolConfig(limit=10, term_ms=2_000, request_timeout_ms=60_000))
    await store.create_project("other")
    dead = await _acquire(store, "api")
    clock.advance(1_500)
    held = [await _acquire(store, "api") for _ in range(4)]
    clock.advance(1_000)  # `dead` is past its lease deadline, not yet reaped
    sent = WriterStatements(store)
    twice = held[0].slot.slot_id
    results = await asyncio.gather(
        *(store.renew_slot(P, "api", h.slot.slot_id) for h in held),
        store.renew_slot(P, "api", twice),
        store.renew_slot("other", "api", held[1].slot.slot_id),
        store.renew_slot(P, "api", dead.slot.slot_id),
        return_exceptions=True,
    )
    *renewed, again, foreign, late = results
    assert [r.lease_deadline_ms for r in renewed] == [clock.now + 2_000] * 4
    assert again.lease_deadline_ms == clock.now + 2_000  # renewed twice: the same deadline
    assert isinstance(foreign, NotFound) and isinstance(late, NotFound)
    # Only the slot named twice, the foreign one and the dead one were read
    # by the general case.
    assert sent.took(_POOL_AND_SLOT) <= 3
    slots = await store.list_slots(P, "api")
    assert len(slots) == 4
    assert all(s.lease_deadline_ms == clock.now + 2_000 for s in slots)
