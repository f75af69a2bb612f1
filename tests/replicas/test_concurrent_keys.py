"""No global serialisation point on PostgreSQL: while one lock's transaction is
held open (a fault-injection hook, honoured only with FENCEPOST_TEST_HOOKS=1),
other locks keep being granted, by another replica and by the holding
replica's other connections; the held lock's competitor waits for the commit
and then sees the lock taken. Two store objects on one database are two
replicas (each has its own sessions and replica id)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from fencepost.core.leases import AcquireRequest, Busy, Granted
from fencepost.store.batch import Key
from fencepost.store.postgresql import PostgresStore
from pg_support import temporary_database

P = "default"


def token() -> str:
    return str(uuid.uuid4())


async def grant(store: PostgresStore, key: str) -> int:
    result = await store.acquire_lock(P, key, AcquireRequest(token(), 30), wait_alive_ms=None)
    assert isinstance(result.outcome, Granted), result
    return result.outcome.lease.fencing_token


@contextlib.asynccontextmanager
async def two_replicas() -> AsyncIterator[tuple[str, PostgresStore, PostgresStore]]:
    """Two store objects on one fresh database: two replicas, each with its
    own sessions and replica id."""
    with temporary_database() as url:
        a, b = PostgresStore(url), PostgresStore(url)
        await a.open()
        await b.open()
        try:
            yield url, a, b
        finally:
            await a.close()
            await b.close()


def advisory_waits(url: str) -> int:
    """How many sessions wait for a key (an advisory lock) right now."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()
    assert row is not None
    return int(row[0])


def hold_open(
    store: PostgresStore, key: str, at_commit: bool = False
) -> tuple[threading.Event, threading.Event]:
    """Make `store`'s batches that hold lock `key` stop (before their
    operations run, or before their commit) until the second event is set;
    the first is set when one has stopped."""
    held, let_go = threading.Event(), threading.Event()

    def hold(keys: list[Key]) -> None:
        if Key("lock", P, key) in keys:
            held.set()
            let_go.wait(60)

    store._writer.hold_for_tests(hold, at_commit=at_commit)
    return held, let_go


def test_the_hold_hook_is_refused_without_test_hooks(monkeypatch) -> None:
    monkeypatch.delenv("FENCEPOST_TEST_HOOKS", raising=False)
    store = PostgresStore("postgresql://nowhere.invalid/none")
    with pytest.raises(RuntimeError, match="FENCEPOST_TEST_HOOKS"):
        store._writer.hold_for_tests(lambda keys: None)


async def test_a_held_lock_stalls_only_itself_across_replicas(monkeypatch) -> None:
    monkeypatch.setenv("FENCEPOST_TEST_HOOKS", "1")
    async with two_replicas() as (url, a, b):
        try:
            held, let_go = hold_open(a, "slow")
            slow = asyncio.ensure_future(
                a.acquire_lock(P, "slow", AcquireRequest(token(), 30), wait_alive_ms=None)
            )
            assert await asyncio.to_thread(held.wait, 60)
            # Replica a's transaction holds "slow" open; b competes for it.
            competitor = asyncio.ensure_future(
                b.acquire_lock(P, "slow", AcquireRequest(token(), 30), wait_alive_ms=None)
            )
            for _ in range(600):  # until b's batch waits in the database for the key
                if await asyncio.to_thread(advisory_waits, url) >= 1:
                    break
                await asyncio.sleep(0.05)
            assert await asyncio.to_thread(advisory_waits, url) == 1
            # Meanwhile other locks keep being granted, by both replicas.
            others = await asyncio.gather(
                *(grant(b, f"b-{i}") for i in range(60)),
                *(grant(a, f"a-{i}") for i in range(30)),
            )
            assert not slow.done() and not competitor.done()
            assert await asyncio.to_thread(advisory_waits, url) == 1
            let_go.set()
            first = (await slow).outcome
            assert isinstance(first, Granted)
            refused = (await competitor).outcome
            assert isinstance(refused, Busy) and refused.holder == first.lease
            tokens = [*others, first.lease.fencing_token]
            assert len(set(tokens)) == len(tokens)
            # Tokens per lock still rise, whichever replica grants next.
            assert await b.release_lock(P, "slow", first.lease.lock_token)
            assert await grant(b, "slow") > first.lease.fencing_token
        finally:
            let_go.set()


async def test_joins_of_different_lines_do_not_wait_for_each_other(monkeypatch) -> None:
    """A waiter's join of one line, held open before its commit, holds up no
    join of another line (tickets come from no shared row), while the same
    line's next join waits for it and queues behind it."""
    monkeypatch.setenv("FENCEPOST_TEST_HOOKS", "1")
    async with two_replicas() as (url, a, b):
        try:
            lines = ["x", *(f"y-{i}" for i in range(20))]
            for key in lines:
                await grant(a, key)  # every line's lock is held: acquires join
            held, let_go = hold_open(a, "x", at_commit=True)

            def join(store: PostgresStore, key: str) -> asyncio.Future[Any]:
                return asyncio.ensure_future(store.acquire_lock(
                    P, key, AcquireRequest(token(), 30, wait_ms=60_000), wait_alive_ms=10_000))

            first = join(a, "x")
            assert await asyncio.to_thread(held.wait, 60)
            # a's join of x has drawn its ticket and waits to commit; the joins
            # of twenty other lines, on the other replica, go through meanwhile.
            others = await asyncio.gather(*(join(b, key) for key in lines[1:]))
            assert all(isinstance(o.outcome, Busy) and o.ticket is not None for o in others)
            second = join(b, "x")
            for _ in range(600):  # until b's join of x waits in the database for the key
                if await asyncio.to_thread(advisory_waits, url) >= 1:
                    break
                await asyncio.sleep(0.05)
            assert not first.done() and not second.done()
            let_go.set()
            ahead, behind = (await first), (await second)
            assert ahead.ticket is not None and behind.ticket is not None
            assert ahead.ticket < behind.ticket  # arrival order in x's line
            tickets = [ahead.ticket, behind.ticket, *(o.ticket for o in others)]
            assert len(set(tickets)) == len(tickets)
        finally:
            let_go.set()


async def test_the_sweep_waits_its_turn_on_a_busy_line_and_keeps_the_place(monkeypatch) -> None:
    """The sweep's refresh of a line's places waits for a transaction busy on
    that line (another replica's, held open), then keeps them. It used to
    skip busy lines: under a steady stream of operations on a line its places
    ran out, and the reaper dropped waiters that were still parked."""
    monkeypatch.setenv("FENCEPOST_TEST_HOOKS", "1")
    async with two_replicas() as (url, a, b):
        try:
            await grant(a, "x")
            parked = await b.acquire_lock(
                P, "x", AcquireRequest(token(), 30, wait_ms=60_000), wait_alive_ms=2_000)
            assert isinstance(parked.outcome, Busy) and parked.ticket is not None
            held, let_go = hold_open(a, "x")
            busy = asyncio.ensure_future(
                a.acquire_lock(P, "x", AcquireRequest(token(), 30), wait_alive_ms=None))
            assert await asyncio.to_thread(held.wait, 60)
            kept = asyncio.ensure_future(
                b.keep_waiting({("lock", P, "x"): [parked.ticket]}, 20_000))
            for _ in range(600):  # until b's refresh waits in the database for the key
                if await asyncio.to_thread(advisory_waits, url) >= 1:
                    break
                await asyncio.sleep(0.05)
            assert await asyncio.to_thread(advisory_waits, url) == 1
            assert not kept.done()
            let_go.set()
            assert isinstance((await busy).outcome, Busy)
            assert await kept == {}

            def left_ms() -> int:
                with psycopg.connect(url, autocommit=True) as conn:
                    row = conn.execute(
                        "SELECT alive_until_ms - (extract(epoch FROM clock_timestamp()) * 1000)"
                        "::bigint FROM lock_waiters WHERE ticket = %s", (parked.ticket,)
                    ).fetchone()
                assert row is not None
                return int(row[0])

            assert await asyncio.to_thread(left_ms) > 10_000  # refreshed, not skipped
        finally:
            let_go.set()
