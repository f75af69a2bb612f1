"""The waiters of a replica (server process) that died leave every line at the
next reap (SPEC §7.4), while a live replica's waiters keep their place (§3.1,
§4.2). The clock never moves in these tests: each waiter's alive_until_ms stays
in the future, so only the replica's death can take it out of line."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from fencepost.core.leases import AcquireRequest, Busy, Granted
from fencepost.core.slots import PoolConfig
from fencepost.store.base import Freed, lock_freed, pool_freed
from fencepost.store.batch import NO_KEYS
from fencepost.store.postgresql import PostgresStore
from fencepost.store.sql_store import SqlStore
from pg_support import sessions_gone

from .conftest import FakeClock, reopen
from .store_support import P, hear

ALIVE_MS = 60_000  # far beyond anything these tests wait for


def req() -> AcquireRequest:
    return AcquireRequest(str(uuid.uuid4()), 30)


async def fill_lines(store: SqlStore) -> str:
    """Hold lock `k` and the one slot of pool `api`; park one waiter in each
    line. Returns the holder's lock token."""
    holder = req()
    assert isinstance((await store.acquire_lock(P, "k", holder, wait_alive_ms=None)).outcome,
                      Granted)
    assert (await store.acquire_lock(P, "k", req(), wait_alive_ms=ALIVE_MS)).ticket is not None
    await store.put_pool(P, "api", PoolConfig(limit=1))
    assert (await store.acquire_slot(P, "api", wait_alive_ms=None)).slot is not None
    queued = await store.acquire_slot(P, "api", wait_ms=ALIVE_MS, wait_alive_ms=ALIVE_MS)
    assert queued.ticket is not None
    return holder.lock_token


async def line_lengths(store: SqlStore) -> tuple[int, int]:
    pool = await store.get_pool(P, "api")
    assert pool is not None
    return (await store.get_lock(P, "k")).waiters, pool.queued


async def opened(store: SqlStore, clock: FakeClock) -> SqlStore:
    other = reopen(store, clock)
    await other.open()
    return other


async def test_a_previous_lifes_waiters_leave_at_the_next_lifes_first_reap(store, clock):
    holder = await fill_lines(store)
    await store.close()  # the process ends: its waiters can never be answered
    if store.url_scheme == "postgresql":
        await sessions_gone(store.url, store)
    after = await opened(store, clock)
    heard: list[Freed] = []
    after.add_freed_listener(heard.append)
    try:
        await after.reap()
        assert await line_lengths(after) == (0, 0)
        await asyncio.sleep(0)
        assert lock_freed(P, "k") in heard and pool_freed(P, "api") in heard
        assert await after.release_lock(P, "k", holder)
        fail_fast = await after.acquire_lock(P, "k", req(), wait_alive_ms=None)
        assert isinstance(fail_fast.outcome, Granted)
        await after.reap()  # idempotent
    finally:
        await after.close()


async def test_opening_the_store_beside_a_running_server_removes_no_waiter(store, clock):
    """What `fencepost project create` does: open, write, close; it never reaps."""
    await fill_lines(store)
    cli = await opened(store, clock)
    await cli.create_project("acme")
    await cli.close()
    await store.reap()
    assert await line_lengths(store) == (1, 1)


async def test_a_serving_replica_keeps_its_own_waiters(store):
    holder = await fill_lines(store)
    for _ in range(3):
        await store.reap()
    assert await line_lengths(store) == (1, 1)
    await store.release_lock(P, "k", holder)
    fail_fast = await store.acquire_lock(P, "k", req(), wait_alive_ms=None)
    assert isinstance(fail_fast.outcome, Busy)  # the waiter is still ahead


def postgresql_only(store: SqlStore) -> None:
    if store.url_scheme != "postgresql":
        pytest.skip("replicas are judged by database sessions only on PostgreSQL")


async def test_a_live_replicas_waiters_survive_the_other_replicas_reaps(store, clock):
    b = await opened(store, clock)
    try:
        await fill_lines(b)
        await asyncio.gather(store.reap(), store.reap(), b.reap())
        assert await line_lengths(store) == (1, 1)
    finally:
        await b.close()


async def test_two_replicas_reaping_at_once_remove_a_dead_ones_waiters_once(store, clock):
    b, c = await opened(store, clock), await opened(store, clock)
    try:
        heard: list[Freed] = []
        store.add_freed_listener(heard.append)
        await hear(c, heard, "before")  # `store` hears what `c` frees
        await fill_lines(b)
        await b.close()  # as a kill does: the kernel closes its connections
        if store.url_scheme == "postgresql":
            await sessions_gone(b.url, b)
        await asyncio.gather(store.reap(), c.reap(), store.reap())
        assert await line_lengths(store) == (0, 0)
        # Heard here at once, or from `c` before what it frees next.
        await hear(c, heard, "after")
        assert lock_freed(P, "k") in heard and pool_freed(P, "api") in heard
    finally:
        await c.close()


async def test_a_replica_that_cannot_see_its_own_session_judges_nobody_dead(store, clock):
    """Behind something that renames or shares sessions (a pooler), the
    database's sessions say nothing about replicas: only alive_until_ms counts."""
    postgresql_only(store)
    b = await opened(store, clock)
    await fill_lines(b)
    await b.close()
    await sessions_gone(b.url, b)
    # One writer connection, so that renaming it renames the reaper's session.
    reaper = PostgresStore(store.url, clock_ms=clock, writers=1)
    await reaper.open()
    try:
        renamed = "SET application_name = 'renamed'"
        # the writer runs the reaper
        await reaper._writer.run(lambda tx: tx.execute(renamed), NO_KEYS)
        await reaper.reap()
        assert await line_lengths(store) == (1, 1)
        restored = f"SET application_name = '{reaper._engine.application_name}'"
        await reaper._writer.run(lambda tx: tx.execute(restored), NO_KEYS)
        await reaper.reap()
        assert await line_lengths(store) == (0, 0)
    finally:
        await reaper.close()
