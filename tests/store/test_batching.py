"""What batching and the shortened hot paths must not change: fencing tokens
across batches, replays, failed commits and replicas; reasons gathered within
a batch; remembered leases that another replica changed. Every backend."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fencepost.core.leases import AcquireRequest, Granted
from fencepost.core.slots import PoolConfig
from fencepost.errors import LeaseExpired, LeaseLost, StoreUnavailable
from fencepost.store.base import Freed, lock_freed
from fencepost.store.batch import NO_KEYS, Tx
from fencepost.store.sql import ended
from fencepost.store.sqlite import SqliteStore

from .conftest import reopen
from .store_support import ADMIN, P, grant, hear, token
from .wire_trace import count_round_trips, summary, wire_trace


async def test_fencing_tokens_never_repeat_across_batches(store):
    seen: list[int] = []
    for round_ in range(4):
        leases = await asyncio.gather(*(grant(store, f"r{round_}-{i}") for i in range(100)))
        tokens = [lease.fencing_token for lease in leases]
        assert len(set(tokens)) == len(tokens)
        assert not seen or min(tokens) > max(seen)  # every round after the last
        seen += tokens
    assert len(set(seen)) == len(seen)


async def test_busy_and_repeated_acquires_leave_the_counter_alone(store):
    holder = token()
    first = await grant(store, "held", holder)
    # refusals and repeats in the same batches as fresh grants
    results = await asyncio.gather(
        *(store.acquire_lock(P, "held", AcquireRequest(token(), 30), wait_alive_ms=None)
          for _ in range(20)),
        *(store.acquire_lock(P, "held", AcquireRequest(holder, 30), wait_alive_ms=None)
          for _ in range(5)),
        *(grant(store, f"fresh-{i}") for i in range(20)),
    )
    fresh = sorted(lease.fencing_token for lease in results[25:])
    assert fresh[0] > first.fencing_token and len(set(fresh)) == 20
    repeats = [r.outcome for r in results[20:25]]
    assert all(isinstance(o, Granted) and o.lease == first for o in repeats)
    assert (await store.get_lock(P, "held")).lease == first


async def test_a_replayed_batch_still_issues_fresh_tokens(store):
    before = await grant(store, "before")
    replayed: list[bool] = []
    store.watch_batches(lambda writes, size, seconds, failed, again: replayed.append(again))

    def fails(tx: Tx) -> None:
        raise RuntimeError("an operation that raises")

    # The raising operation makes the batch replay with a savepoint per
    # operation (a refusal no longer does: it is answered as a value).
    results = await asyncio.gather(
        *(grant(store, f"k{i}") for i in range(30)),
        store._writer.run(fails, NO_KEYS),
        *(grant(store, f"j{i}") for i in range(30)),
        return_exceptions=True,
    )
    assert isinstance(results[30], RuntimeError) and any(replayed)
    tokens = [lease.fencing_token for lease in results[:30] + results[31:]]
    assert len(set(tokens)) == 60 and min(tokens) > before.fencing_token
    after = await grant(store, "after")
    assert after.fencing_token > max(tokens)


async def test_a_failed_commit_acknowledges_nothing_and_tokens_still_rise(store, clock):
    acknowledged = await grant(store, "a")
    engine = store._writer._engine
    real_commit = engine.commit
    failures = 0

    def failing_commit(conn, events):
        nonlocal failures
        failures += 1
        raise engine.errors[0]("disk on fire")

    engine.commit = failing_commit
    try:
        results = await asyncio.gather(*(grant(store, f"lost{i}") for i in range(10)),
                                       return_exceptions=True)
    finally:
        engine.commit = real_commit
    assert failures >= 1 and all(isinstance(r, StoreUnavailable) for r in results)
    assert (await store.get_lock(P, "lost0")).lease is None
    later = await grant(store, "b")
    assert later.fencing_token > acknowledged.fencing_token
    await store.close()
    reopened = reopen(store, clock)
    await reopened.open()
    try:
        assert (await grant(reopened, "c")).fencing_token > later.fencing_token
    finally:
        await reopened.close()
        await store.open()


async def test_two_writers_on_one_database_share_the_counter(store, clock):
    other = reopen(store, clock)  # a replica (PostgreSQL) or a second process (SQLite)
    await other.open()
    try:
        leases = await asyncio.gather(
            *(grant(store if i % 2 else other, f"k{i}") for i in range(60))
        )
        tokens = [lease.fencing_token for lease in leases]
        assert len(set(tokens)) == 60
        mine = await grant(store, "last")
        theirs = await grant(other, "later")
        assert max(tokens) < mine.fencing_token < theirs.fencing_token
    finally:
        await other.close()


async def test_release_then_renew_in_one_batch_names_the_release(store):
    a = token()
    await grant(store, "k", a)
    released, renewed = await asyncio.gather(
        store.release_lock(P, "k", a), store.renew_lock(P, "k", a, 30),
        return_exceptions=True,
    )
    assert released is True
    assert isinstance(renewed, LeaseLost) and renewed.extra["reason"] == "released"


async def test_releasing_a_dead_lease_reaps_it(store, clock):
    events: list[Freed] = []
    store.add_freed_listener(events.append)
    a = token()
    await grant(store, "k", a, ttl=5)
    clock.advance(5_000)
    assert await store.release_lock(P, "k", a) is False
    await asyncio.sleep(0)
    assert lock_freed(P, "k") in events
    assert await store.reap() == 0
    with pytest.raises(LeaseLost) as info:
        await store.renew_lock(P, "k", a, 30)
    assert info.value.extra["reason"] == "expired"


async def test_renewals_follow_changes_made_by_another_writer(store, clock):
    other = reopen(store, clock)
    await other.open()
    try:
        a = token()
        lease = await grant(store, "k", a, ttl=10)
        clock.advance(2_000)
        theirs = await other.renew_lock(P, "k", a, 60)
        clock.advance(2_000)
        # this writer remembers the lease as it granted it; the row says otherwise
        mine = await store.renew_lock(P, "k", a, 20)
        assert mine.expires_ms == clock.now + 20_000 != theirs.expires_ms
        assert mine.fencing_token == lease.fencing_token
        assert (await other.get_lock(P, "k")).lease == mine
        assert await other.release_lock(P, "k", a) is True
        with pytest.raises(LeaseLost) as info:
            await store.renew_lock(P, "k", a, 20)
        assert info.value.extra["reason"] == "released"
        b = token()
        await grant(other, "k", b)
        await store.force_release(P, "k", ADMIN)
        with pytest.raises(LeaseLost) as info:
            await other.renew_lock(P, "k", b, 20)
        assert info.value.extra["reason"] == "force_released"
    finally:
        await other.close()


async def test_a_remembered_lease_past_its_margin_is_read_again(store, clock):
    other = reopen(store, clock)
    await other.open()
    try:
        a = token()
        await grant(store, "k", a, ttl=5)
        clock.advance(3_000)
        await other.renew_lock(P, "k", a, 60)
        clock.advance(3_000)  # past the remembered expiry, not the real one
        renewed = await store.renew_lock(P, "k", a, 30)
        assert renewed.expires_ms == clock.now + 30_000
    finally:
        await other.close()


async def test_a_lease_shortened_elsewhere_is_not_renewed_from_memory(store, clock):
    other = reopen(store, clock)
    await other.open()
    try:
        a = token()
        await grant(store, "k", a, ttl=60)
        await other.renew_lock(P, "k", a, 5)
        clock.advance(4_500)  # within the renewal margin of the real expiry
        with pytest.raises(LeaseExpired):
            await store.renew_lock(P, "k", a, 30)
    finally:
        await other.close()


async def test_waiting_line_is_read_with_the_lease(store, clock):
    holder = token()
    await grant(store, "k", holder)
    waiting = await store.acquire_lock(P, "k", AcquireRequest(token(), 30), wait_alive_ms=1_000)
    assert waiting.ticket is not None
    await store.release_lock(P, "k", holder)
    view = await store.get_lock(P, "k")
    assert view.lease is None and view.waiters == 1
    assert [v.waiters for v in await store.list_locks(P, "", None, 10)] == []
    clock.advance(1_000)  # the waiter stopped refreshing: the lock is free for anyone
    assert (await store.get_lock(P, "k")).waiters == 0
    await grant(store, "k")


async def test_an_expired_slot_released_late_counts_as_reclaimed(store, clock):
    await store.put_pool(P, "api", PoolConfig(limit=2, term_ms=1_000))
    slot = (await store.acquire_slot(P, "api", wait_alive_ms=None)).slot
    clock.advance(1_000)
    assert await store.release_slot(P, "api", slot.slot_id, None) is False
    view = await store.get_pool(P, "api")
    assert view.stats.reclaimed == 1 and view.stats.released == 0 and view.in_use == 0
    assert await store.reap() == 0


async def test_other_replicas_hear_of_freed_locks_with_awkward_names(store, clock):
    other = reopen(store, clock)
    heard: list[Freed] = []
    other.add_freed_listener(heard.append)
    await other.open()
    try:
        await hear(store, heard, "before")  # `other` listens
        key = "it's \"quoted\" \\ {braces}, [x]"
        a = token()
        await grant(store, key, a)
        await _park(store, key)  # someone waits: the release is for every process
        await store.release_lock(P, key, a)
        await hear(store, heard, "after")  # freed after `key`, so heard after it
        assert lock_freed(P, key) in heard
    finally:
        await other.close()


async def _park(store: Any, key: str) -> None:
    """A waiter's place in the lock's line (its waiting request is elsewhere)."""
    waiting = await store.acquire_lock(P, key, AcquireRequest(token(), 30),
                                       wait_alive_ms=_PLACE_MS)
    assert waiting.ticket is not None


async def _park_set(store: Any, keys: list[str]) -> None:
    waiting = await store.acquire_lock_set(P, keys, AcquireRequest(token(), 30),
                                           wait_alive_ms=_PLACE_MS)
    assert waiting.ticket is not None


_PLACE_MS = 60_000  # far beyond anything these tests wait for


@pytest.mark.parametrize("line", ["nobody", "a waiter", "a lock set", "a waiter who left"])
async def test_a_release_is_heard_elsewhere_exactly_when_someone_is_in_line(
    store, clock, line: str
) -> None:
    """A holder's release wakes the other processes serving the store only
    when the lock's line has someone in it: with nobody there, nobody
    elsewhere can be waiting. This process's own listeners hear it always."""
    other = reopen(store, clock)
    heard: list[Freed] = []
    other.add_freed_listener(heard.append)
    here: list[Freed] = []
    store.add_freed_listener(here.append)
    await other.open()
    try:
        await hear(store, heard, "before")
        key, holder = f"released-{line.replace(' ', '-')}", token()
        await grant(store, key, holder)
        if line == "a waiter":
            await _park(store, key)
        elif line == "a lock set":
            await grant(store, "other-key")
            await _park_set(store, ["other-key", key])
        elif line == "a waiter who left":
            waiter = await store.acquire_lock(P, key, AcquireRequest(token(), 30),
                                              wait_alive_ms=_PLACE_MS)
            assert waiter.ticket is not None
            await store.leave_line(P, key, waiter.ticket)
        await hear(store, heard, "set up")  # what the setting up freed is heard by now
        heard.clear()
        here.clear()
        await store.release_lock(P, key, holder)
        await hear(store, heard, "after")  # freed after `key`, so heard after it
        assert lock_freed(P, key) in here
        assert (lock_freed(P, key) in heard) == (line in ("a waiter", "a lock set")), heard
    finally:
        await other.close()


async def test_closing_ends_the_listener_at_once_after_it_heard_others(store, clock):
    """On PostgreSQL a store's listener waits for notifications without a
    timeout: closing the store must end it through its own wake-up, not leave
    it waiting (a listener that missed its wake-up would still be alive after
    close's five-second join)."""
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite's workers hear each other over datagrams, not a listener")
    other = reopen(store, clock)
    heard: list[Freed] = []
    other.add_freed_listener(heard.append)
    await other.open()
    listener = other._listener
    try:
        await hear(store, heard, "before-close")
        assert listener.listening
    finally:
        await other.close()
    assert not listener.listening
    await other.close()  # closing twice is harmless


async def test_one_holder_when_acquires_releases_and_renewals_share_batches(store):
    """Operations on one key in one batch: however the store orders them (one
    by one, or on PostgreSQL every first statement before the rest), at most
    one contender wins a released lock, with a newer fencing token, and the
    lock ends up with the winner."""
    for round_ in range(20):
        key, holder = f"shared-{round_}", token()
        first = await grant(store, key, holder)
        contenders = [token() for _ in range(8)]
        half = len(contenders) // 2
        results = await asyncio.gather(
            *(store.acquire_lock(P, key, AcquireRequest(t, 30), wait_alive_ms=None)
              for t in contenders[:half]),
            store.release_lock(P, key, holder),
            store.renew_lock(P, key, holder, 30),
            *(store.acquire_lock(P, key, AcquireRequest(t, 30), wait_alive_ms=None)
              for t in contenders[half:]),
            return_exceptions=True,
        )
        released, renewed = results[half], results[half + 1]
        acquired = results[:half] + results[half + 2:]
        assert released is True, results
        assert isinstance(renewed, LeaseLost) or renewed.fencing_token == first.fencing_token
        winners = [r.outcome.lease for r in acquired if isinstance(r.outcome, Granted)]
        assert len(winners) <= 1, winners
        view = await store.get_lock(P, key)
        if winners:
            assert winners[0].fencing_token > first.fencing_token
            assert view.lease == winners[0]
        else:
            assert view.lease is None


async def test_a_batch_of_releases_writes_its_reasons_with_the_commit(store):
    """On PostgreSQL the reasons a batch's releases gathered go out with the
    batch's commit, in one round trip: a batch makes three (begin, its
    operations' pipeline, the reasons and the commit) however many leases it
    ended. Every backend: the reasons are on record afterwards."""
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite's statements are calls in this process, not round trips")
    tokens = [token() for _ in range(25)]
    await asyncio.gather(*(grant(store, f"rel-{i}", tok) for i, tok in enumerate(tokens)))
    batches: list[int] = []
    store.watch_batches(
        lambda writer, size, seconds, failed, replayed: writer and batches.append(size))
    with wire_trace(store) as lines:
        released = await asyncio.gather(
            *(store.release_lock(P, f"rel-{i}", tok) for i, tok in enumerate(tokens))
        )
    assert released == [True] * 25 and sum(batches) == 25
    statements, round_trips = count_round_trips(lines)
    # Each batch sent its begin, its releases (gathered: test_together.py) and
    # the reasons with its commit.
    assert statements >= 3 * len(batches), summary(lines)
    assert round_trips <= 3 * len(batches), summary(lines)
    for i, tok in enumerate(tokens):
        with pytest.raises(LeaseLost) as lost:
            await store.renew_lock(P, f"rel-{i}", tok, 30)
        assert lost.value.reason == "released"


async def test_a_batch_of_releases_has_its_statements_parsed_once(store, monkeypatch):
    """psycopg parses a statement of more than 50 parameters anew each time it
    runs (about 100 µs for ten rows of reasons) and caches the parsing of the
    others: the reasons of many releases go out in statements it caches."""
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite's sqlite3 module parses its own statements")
    from psycopg import _queries

    parsed_anew: list[bytes] = []
    parse = _queries._query2pg_nocache

    def spy(query: Any, encoding: str) -> Any:
        parsed_anew.append(bytes(query[:60]))
        return parse(query, encoding)

    monkeypatch.setattr(_queries, "_query2pg_nocache", spy)
    tokens = [token() for _ in range(40)]
    await asyncio.gather(*(grant(store, f"many-{i}", tok) for i, tok in enumerate(tokens)))
    batches: list[int] = []
    store.watch_batches(
        lambda writer, size, seconds, failed, replayed: writer and batches.append(size))
    released = await asyncio.gather(
        *(store.release_lock(P, f"many-{i}", tok) for i, tok in enumerate(tokens))
    )
    assert released == [True] * 40
    assert max(batches) > 10  # some batch ended more leases than one statement takes
    assert parsed_anew == []


async def test_a_gathered_write_that_fails_replays_the_batch(store, monkeypatch):
    """A gathered write that fails (here once, as a bad statement would) takes
    the commit sent behind it down too: nothing of the batch is committed, the
    batch is replayed with a savepoint per operation, and every caller gets
    its answer. On PostgreSQL the write, the notification and the commit are
    in one pipeline, where the database skips what follows a failure."""
    tokens = [token() for _ in range(12)]
    await asyncio.gather(*(grant(store, f"fail-{i}", tok) for i, tok in enumerate(tokens)))
    gathered = ended._GATHERED
    failures: list[str] = []
    write = gathered.finish

    def fail_once(tx: Any, pending: Any) -> None:
        if not failures:
            failures.append("failed")
            tx.execute("SELECT 1 / 0")  # refused by the database, not fatal
        write(tx, pending)

    monkeypatch.setattr(gathered, "finish", fail_once)
    released = await asyncio.gather(
        *(store.release_lock(P, f"fail-{i}", tok) for i, tok in enumerate(tokens))
    )
    assert failures == ["failed"] and released == [True] * 12
    for i, tok in enumerate(tokens):
        assert (await store.get_lock(P, f"fail-{i}")).lease is None
        with pytest.raises(LeaseLost) as lost:
            await store.renew_lock(P, f"fail-{i}", tok, 30)
        assert lost.value.reason == "released"
    # and the writer goes on
    assert (await grant(store, "after")).fencing_token > 0


async def test_a_batch_observer_that_raises_does_not_stop_the_writer(store):
    """The observer is the metrics' hook; should it ever raise, the writer
    thread goes on and every caller still gets its answer (before, the thread
    ended and every later request waited forever)."""
    def broken(*_: Any) -> None:
        raise TypeError("an observer with the wrong signature")

    store.watch_batches(broken)
    first = await grant(store, "observed-1")
    second = await grant(store, "observed-2")
    assert second.fencing_token > first.fencing_token
