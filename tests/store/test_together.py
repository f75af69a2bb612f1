"""Like first statements sent as one (store/together.py): acquires of free locks,
renewals and releases that share a batch go out as one statement on PostgreSQL, and
decide exactly what each would alone. The rules hold on every backend; the
statement counts are PostgreSQL's (SQLite runs each operation whole)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from fencepost.core.leases import AcquireRequest, Busy, Granted, Mode
from fencepost.errors import LeaseLost
from fencepost.store.batch import NO_KEYS, Tx
from fencepost.store.sql import locks
from fencepost.store.sqlite import SqliteStore
from fencepost.store.together import Together
from pg_support import migrated_database

from .conftest import reopen
from .store_support import P, grant, token
from .wire_trace import count_round_trips, summary, wire_trace


def _acquire(store: Any, key: str, tok: str) -> Any:
    return store.acquire_lock(P, key, AcquireRequest(tok, 30), wait_alive_ms=None)


def _watch(store: Any) -> tuple[list[int], list[bool]]:
    sizes: list[int] = []
    replays: list[bool] = []

    def observe(writer: bool, size: int, seconds: float, failed: bool, replayed: bool) -> None:
        if writer:
            sizes.append(size)
            replays.append(replayed)

    store.watch_batches(observe)
    return sizes, replays


async def test_a_batch_of_fresh_acquires_and_releases_sends_few_statements(store):
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite's statements are calls in this process, not round trips")
    keys = [f"fresh-{i}" for i in range(30)]
    tokens = [token() for _ in keys]
    sizes, _ = _watch(store)
    with wire_trace(store) as lines:
        results = await asyncio.gather(
            *(_acquire(store, k, t) for k, t in zip(keys, tokens, strict=True)))
    acquired, _ = count_round_trips(lines)
    # One gathered insert per batch, besides each batch's begin and commit.
    assert acquired <= 4 * len(sizes) < len(keys), summary(lines)
    granted = [r.outcome for r in results]
    assert all(isinstance(g, Granted) and g.created for g in granted)
    fencing = [g.lease.fencing_token for g in granted]
    assert len(set(fencing)) == len(fencing)
    for key, tok, g in zip(keys, tokens, granted, strict=True):
        view = await store.get_lock(P, key)
        assert view.lease is not None and view.lease.lock_token == tok
        assert view.lease.fencing_token == g.lease.fencing_token

    sizes.clear()
    with wire_trace(store) as lines:
        released = await asyncio.gather(
            *(store.release_lock(P, k, t) for k, t in zip(keys, tokens, strict=True)))
    assert released == [True] * len(keys)
    statements, _ = count_round_trips(lines)
    # The releases, the reasons they gathered, begin and commit.
    assert statements <= 8 * len(sizes) < len(keys), summary(lines)
    for key in keys:
        assert (await store.get_lock(P, key)).lease is None


def _shared(store: Any, key: str, tok: str | None = None) -> Any:
    return store.acquire_lock(P, key, AcquireRequest(tok or token(), 30, mode=Mode.SHARED),
                              wait_alive_ms=None)


async def test_a_batch_of_shared_acquires_is_decided_by_the_rows_beside_it(store, clock):
    # Gathered on PostgreSQL (one statement for the batch's shared acquires
    # of distinct keys): each joins the live shared leases of its lock, and
    # only an exclusive or a dead lease sends it to the general case.
    readers = {f"read-{i}": await grant(store, f"read-{i}", mode=Mode.SHARED) for i in range(8)}
    writers = [f"write-{i}" for i in range(4)]
    for key in writers:
        await grant(store, key)
    lapsed = await grant(store, "lapsed", ttl=5, mode=Mode.SHARED)
    clock.advance(6_000)  # dead, not yet reaped
    fresh = [f"new-{i}" for i in range(8)]
    results = await asyncio.gather(*(_shared(store, k) for k in [*readers, *writers, "lapsed",
                                                                 *fresh]))
    outcomes = dict(zip([*readers, *writers, "lapsed", *fresh],
                        (r.outcome for r in results), strict=True))
    for key, first in readers.items():
        joined = outcomes[key]
        assert isinstance(joined, Granted) and joined.created
        assert joined.lease.fencing_token > first.fencing_token
        assert (await store.get_lock(P, key)).holders == 2
    assert all(isinstance(outcomes[key], Busy) for key in writers)
    after_lapse = outcomes["lapsed"]  # granted by the general case, which ends the dead one
    assert isinstance(after_lapse, Granted)
    assert after_lapse.lease.fencing_token > lapsed.fencing_token
    assert (await store.get_lock(P, "lapsed")).holders == 1
    assert all(isinstance(outcomes[key], Granted) for key in fresh)
    tokens = [o.lease.fencing_token for o in outcomes.values() if isinstance(o, Granted)]
    assert len(set(tokens)) == len(tokens)


async def test_a_batch_of_shared_acquires_sends_few_statements(store):
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite's statements are calls in this process, not round trips")
    held = [f"shared-held-{i}" for i in range(15)]
    for key in held:
        await grant(store, key, mode=Mode.SHARED)
    keys = [*held, *(f"shared-new-{i}" for i in range(15))]
    sizes, _ = _watch(store)
    with wire_trace(store) as lines:
        results = await asyncio.gather(*(_shared(store, key) for key in keys))
    assert all(isinstance(r.outcome, Granted) for r in results)
    statements, _ = count_round_trips(lines)
    # One gathered insert per batch, besides each batch's begin and commit.
    assert statements <= 4 * len(sizes) < len(keys), summary(lines)


async def test_a_batch_of_renewals_sends_few_statements(store, clock):
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite's statements are calls in this process, not round trips")
    keys = [f"renewed-{i}" for i in range(30)]
    leases = await asyncio.gather(*(grant(store, key, ttl=30) for key in keys))
    clock.advance(10_000)
    sizes, _ = _watch(store)
    with wire_trace(store) as lines:
        renewed = await asyncio.gather(
            *(store.renew_lock(P, lease.key, lease.lock_token, 60) for lease in leases))
    statements, _ = count_round_trips(lines)
    # One gathered update per batch, besides each batch's begin and commit.
    assert statements <= 4 * len(sizes) < len(keys), summary(lines)
    for before, after in zip(leases, renewed, strict=True):
        assert after.fencing_token == before.fencing_token
        assert after.expires_ms == clock.now + 60_000
        assert (await store.get_lock(P, before.key)).lease == after


async def test_gathered_renewals_of_stale_memories_are_decided_by_the_rows(store, clock):
    """Renewals whose remembered lease is out of date (renewed on another
    replica, released there, or someone else's token) miss the gathered
    update and are decided by the rows, beside renewals that it decides."""
    leases = await asyncio.gather(*(grant(store, f"stale-{i}", ttl=30) for i in range(12)))
    other = reopen(store, clock)
    await other.open()
    try:
        clock.advance(1_000)
        for lease in leases[:4]:  # moved elsewhere: this store remembers the old expiry
            await other.renew_lock(P, lease.key, lease.lock_token, 120)
        for lease in leases[4:6]:  # ended elsewhere
            assert await other.release_lock(P, lease.key, lease.lock_token)
    finally:
        await other.close()
    clock.advance(1_000)
    results = await asyncio.gather(
        *(store.renew_lock(P, lease.key, lease.lock_token, 45) for lease in leases),
        *(store.renew_lock(P, lease.key, token(), 45) for lease in leases[6:8]),
        return_exceptions=True,
    )
    for lease, result in zip(leases, results, strict=False):
        if lease in leases[4:6]:
            assert isinstance(result, LeaseLost), result
            assert (await store.get_lock(P, lease.key)).lease is None
            continue
        assert not isinstance(result, BaseException), result
        assert result.expires_ms == clock.now + 45_000
        assert result.fencing_token == lease.fencing_token
        assert (await store.get_lock(P, lease.key)).lease == result
    assert all(isinstance(r, LeaseLost) for r in results[len(leases):])


async def test_two_acquires_of_one_lock_in_a_batch_keep_their_order(store):
    first, second = token(), token()
    results = await asyncio.gather(
        *(grant(store, f"other-{i}") for i in range(10)),
        _acquire(store, "contested", first),
        *(grant(store, f"more-{i}") for i in range(10)),
        _acquire(store, "contested", second),
    )
    won, lost = results[10].outcome, results[21].outcome
    assert isinstance(won, Granted) and won.lease.lock_token == first
    assert isinstance(lost, Busy)
    view = await store.get_lock(P, "contested")
    assert view.lease is not None and view.lease.lock_token == first


async def test_a_release_and_the_next_acquire_in_one_batch(store):
    holder, successor = token(), token()
    held = await grant(store, "handed", holder)
    released, *_, taken = await asyncio.gather(
        store.release_lock(P, "handed", holder),
        *(grant(store, f"beside-{i}") for i in range(10)),
        _acquire(store, "handed", successor),
    )
    assert released is True
    assert isinstance(taken.outcome, Granted)
    assert taken.outcome.lease.fencing_token > held.fencing_token
    view = await store.get_lock(P, "handed")
    assert view.lease is not None and view.lease.lock_token == successor


async def test_gathered_acquires_of_held_locks_are_refused_and_change_nothing(store):
    holders = {f"held-{i}": await grant(store, f"held-{i}") for i in range(5)}
    free = [f"free-{i}" for i in range(5)]
    results = await asyncio.gather(
        *(_acquire(store, key, token()) for key in holders),
        *(_acquire(store, key, token()) for key in free),
    )
    assert all(isinstance(r.outcome, Busy) for r in results[:5])
    assert all(isinstance(r.outcome, Granted) for r in results[5:])
    for key, lease in holders.items():
        assert (await store.get_lock(P, key)).lease == lease
    released = await asyncio.gather(
        *(store.release_lock(P, key, token()) for key in holders),  # not their tokens
        *(store.release_lock(P, key, lease.lock_token) for key, lease in holders.items()),
    )
    assert released == [False] * 5 + [True] * 5


async def test_an_operation_run_in_its_turn_sees_the_gathered_writes_before_it(
    store, tmp_path, clock
):
    """A plain operation behind gathered acquires in one batch reads their
    grants: the gathered statement went out before it ran. (A writer of one
    connection, so that the plain operation cannot run in a batch of its own
    beside theirs.)"""
    if not isinstance(store, SqliteStore):
        from fencepost.store.postgresql import PostgresStore

        with migrated_database() as url:
            one = PostgresStore(url, clock_ms=clock, writers=1)
            await one.open()
            try:
                await _plain_after_gathered(one)
            finally:
                await one.close()
        return
    await _plain_after_gathered(store)


async def _plain_after_gathered(store: Any) -> None:
    keys = [f"seen-{i}" for i in range(6)]

    def holders(tx: Tx) -> list[str]:
        rows = tx.execute(
            "SELECT key FROM locks WHERE project = ? AND key LIKE ? ORDER BY key", (P, "seen-%")
        ).fetchall()
        return [row[0] for row in rows]

    *granted, seen = await asyncio.gather(
        *(grant(store, key) for key in keys), store._writer.run(holders, NO_KEYS)
    )
    assert len(granted) == len(keys)
    assert seen == sorted(keys)


async def test_a_gathered_statement_that_fails_replays_the_batch(store, monkeypatch):
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite runs each operation whole: nothing is gathered")
    tokens = [token() for _ in range(12)]
    await asyncio.gather(*(grant(store, f"fail-{i}", t) for i, t in enumerate(tokens)))
    broken = Together(locks._RELEASE.single, "SELECT no_such_column FROM locks")
    monkeypatch.setattr(locks, "_RELEASE", broken)
    _, replays = _watch(store)
    released = await asyncio.gather(
        *(store.release_lock(P, f"fail-{i}", t) for i, t in enumerate(tokens)))
    assert released == [True] * len(tokens)
    assert any(replays)  # the gathered statement failed, and each ran alone
    for i in range(len(tokens)):
        assert (await store.get_lock(P, f"fail-{i}")).lease is None


def _relation_rows(plan: dict[str, Any], relation: str) -> int:
    """How many rows the plan's scans of `relation` read (kept or filtered out)."""
    rows = 0
    if plan.get("Relation Name") == relation:
        read = int(plan.get("Actual Rows", 0)) + int(plan.get("Rows Removed by Filter", 0))
        rows += read * int(plan.get("Actual Loops", 1))
    for child in plan.get("Plans", []):
        rows += _relation_rows(child, relation)
    return rows


def test_gathered_acquires_look_up_their_own_keys_beside_thousands_of_waiters():
    """A batch's gathered acquire tests each key's line by its index, whatever
    join the planner would choose, never by reading every parked waiter of
    the store: as a join, planned for the hundred rows the planner guesses
    an unnest gives, it sometimes hashed all 10,000 waiters of workload (e)
    for each batch of acquires. Joins other than a hash are turned off here,
    so that the statement cannot pass by the planner's luck."""
    import psycopg

    from fencepost.store.postgresql import _placeholders

    with migrated_database() as url, psycopg.connect(url) as conn:
        now = 1_800_000_000_000
        conn.execute(
            "INSERT INTO lock_waiters (ticket, project, key, lock_token, alive_until_ms) "
            "SELECT nextval('lock_tickets'), %s, 'parked-' || (i %% 100), 'w-' || i, %s "
            "FROM generate_series(1, 10000) AS i", (P, now + 3_600_000))
        conn.commit()
        conn.execute("ANALYZE")
        conn.execute("SET enable_nestloop = off")
        conn.execute("SET enable_mergejoin = off")
        values = []
        for _ in range(20):
            key = f"fresh-{token()}"
            lease = {"project": P, "key": key, "lock_token": token(), "acquired_ms": now,
                     "expires_ms": now + 30_000, "deadline_ms": now + 90 * 86_400_000,
                     "dies_ms": now + 30_000, "operation": None, "metadata": None,
                     "on_expiry": "release", "key_id": None, "lock_delay_ms": 0,
                     "mode": "exclusive", "session_id": None}
            test = {"w_project": P, "w_key": key, "w_now": now, "d_project": P, "d_key": key,
                    "d_now": now, "l_project": P, "l_key": key}
            values.append(tuple({**lease, **test}[name] for name, _ in locks._FREE_INSERT_PARAMS))
        columns = tuple(list(column) for column in zip(*values, strict=True))
        statement = locks._free_insert("nextval('fencing_tokens')").many
        ((plan,),) = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + _placeholders(statement), columns).fetchall()
        granted = conn.execute("SELECT count(*) FROM locks").fetchone()
        conn.rollback()
    assert granted == (20,)  # the statement did grant them all
    assert _relation_rows(plan[0]["Plan"], "lock_waiters") < 1000, plan


async def test_a_join_draws_its_ticket_in_the_statement_that_places_it(store, clock):
    # Each undecided operation's statements are round trips on PostgreSQL,
    # waited for one after another: the ticket comes from the sequence inside
    # the waiter's insert, not from a statement of its own. The line still
    # orders joins by arrival, one ticket per set across its lines.
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite's statements are calls in this process, not round trips")
    await grant(store, "joined-a")
    await grant(store, "joined-b")
    with wire_trace(store) as lines:
        first = await store.acquire_lock(
            P, "joined-a", AcquireRequest(token(), 30, wait_ms=60_000), wait_alive_ms=10_000)
        both = await store.acquire_lock_set(
            P, ["joined-a", "joined-b"], AcquireRequest(token(), 30, wait_ms=60_000),
            wait_alive_ms=10_000)
    assert not [line for line in lines if "nextval" in line and "INSERT" not in line], \
        summary(lines)
    # Each: its begin, the guarded insert that would grant a free lock (a
    # set has none), the reads it is decided on with its places in line in
    # one round trip, and its commit.
    _, round_trips = count_round_trips(lines)
    assert round_trips == 4 + 3, summary(lines)
    assert first.ticket is not None and both.ticket is not None
    assert first.ticket < both.ticket
    assert (await store.get_lock(P, "joined-a")).waiters == 2
    assert (await store.get_lock(P, "joined-b")).waiters == 1


async def test_a_waiters_retry_reads_the_lock_and_its_line_in_one_statement(store, clock):
    # What an undecided acquire is decided on (the leases, the waiters ahead,
    # the lock delay) is one statement, and a retry sends it with the refresh
    # of its place: on PostgreSQL each statement outside a pipeline is a
    # round trip of its own, waited for one after another. A retry is then
    # its begin, the refresh and the read in one round trip, and its commit.
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite's statements are calls in this process, not round trips")
    await grant(store, "retried")
    wanted = AcquireRequest(token(), 30, wait_ms=60_000)
    joined = await store.acquire_lock(P, "retried", wanted, wait_alive_ms=10_000)
    assert joined.ticket is not None
    with wire_trace(store) as lines:
        again = await store.retry_waiter(P, "retried", wanted, joined.ticket, 10_000)
    assert isinstance(again.outcome, Busy) and again.ticket == joined.ticket
    statements, round_trips = count_round_trips(lines)
    assert (statements, round_trips) == (4, 3), summary(lines)


def test_gathered_arrays_go_to_postgresql_in_binary() -> None:
    """Every gathered statement's arrays are sent in psycopg's binary form (a
    text array is checked element by element for quoting, at 2.5 times the
    CPU), every other parameter as before: the statement still runs, and a
    gathered statement of every kind has no array left in the text form."""
    import psycopg

    from fencepost.store import postgresql
    from fencepost.store.sql import pools

    converted = postgresql._placeholders(
        "SELECT * FROM unnest(?::text[], ?::bigint[]) AS x(a, b) "
        "WHERE b > ? AND a IS DISTINCT FROM ?::text")
    assert converted == ("SELECT * FROM unnest(%b::text[], %b::bigint[]) AS x(a, b) "
                         "WHERE b > %s AND a IS DISTINCT FROM %s::text")
    gathered = [v.many for module in (locks, pools) for v in vars(module).values()
                if isinstance(v, Together)]
    gathered.append(locks._free_insert("nextval('fencing_tokens')").many)
    assert len(gathered) >= 5
    for statement in gathered:
        sent = postgresql._placeholders(statement)
        assert "%b::" in sent and re.search(r"%s::\w+\[\]", sent) is None, sent
    with migrated_database() as url, psycopg.connect(url) as conn:
        rows = conn.execute(converted, (["a", None, "c"], [1, 2**53 - 1, None], 0, "c"))
        assert rows.fetchall() == [("a", 1), (None, 2**53 - 1)]
