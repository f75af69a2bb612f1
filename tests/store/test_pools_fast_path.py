"""The one-statement paths of pools (store/sql/pools.py: acquire, renew and
release as step operations, decided on the pool as the writer remembers it)
and what sends them back to the general case: a pool at its limit, waiters in
line, a paced or paused pool, a pool reconfigured or taught by another writer,
a remembered pool whose version the row no longer has. Every backend; the last
test counts PostgreSQL's round trips on the wire."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from fencepost.core import governor as gov
from fencepost.core.ratelimit_headers import RateLimitInfo
from fencepost.core.slots import PoolConfig
from fencepost.errors import NotFound
from fencepost.events import Ended, Granted
from fencepost.store.base import Freed, SlotReport, pool_freed
from fencepost.store.sql.pools import (
    _ADMIT_IF_ROOM,
    _ADMIT_IN_ORDER,
    _LOAD_WITH_COUNTS,
    _POOL_AND_SLOT,
    _RENEW_BY_TERM,
)
from fencepost.store.sqlite import SqliteStore

from .conftest import reopen
from .store_support import P, warmed_pool
from .wire_trace import count_round_trips, summary, wire_trace

# The common case's admission: alone (SQLite runs each operation whole), or
# gathered with the batch's other admissions (PostgreSQL, even of one).
_ADMIT = (_ADMIT_IF_ROOM, _ADMIT_IN_ORDER.many)
_RENEW = (_RENEW_BY_TERM.single, _RENEW_BY_TERM.many)


class WriterStatements:
    """The statements the store's writer runs, in order (on its threads, or on
    the event loop for SQLite; the readers run on threads of their own)."""

    def __init__(self, store: Any) -> None:
        self.sent: list[str] = []
        engine = store._writer._engine
        inner = engine.execute

        def execute(conn: Any, sql: Any, params: Any) -> Any:
            if not threading.current_thread().name.startswith("fencepost-reader"):
                self.sent.append(sql)
            return inner(conn, sql, params)

        engine.execute = execute

    def took(self, *statements: str) -> int:
        return sum(self.sent.count(statement) for statement in statements)

    def clear(self) -> None:
        self.sent.clear()


async def _acquire(store: Any, pool: str = "api", **kw: Any) -> Any:
    wait = kw.pop("wait", None)
    return await store.acquire_slot(P, pool, wait_ms=wait or 0, wait_alive_ms=wait, **kw)


async def test_a_known_pool_admits_renews_and_releases_without_reading_it(store, clock):
    freed: list[Freed] = []
    reported: list[Any] = []
    store.add_freed_listener(freed.append)
    store.add_event_listener(reported.append)
    sent = WriterStatements(store)
    config = PoolConfig(limit=3, term_ms=1_000, request_timeout_ms=10_000)
    await store.put_pool(P, "api", config)  # the writer now knows the pool
    sent.clear()
    first = await _acquire(store, key_id="key_a")
    second = await _acquire(store)
    assert (first.in_use, first.effective_limit, second.in_use) == (1, 3, 2)
    assert first.slot.lease_deadline_ms == clock.now + 1_000
    assert first.slot.request_deadline_ms == clock.now + 10_000
    assert sent.took(*_ADMIT) == 2 and sent.took(_LOAD_WITH_COUNTS) == 0
    assert first.config == config and first.wait_ms == 0
    holders = {h.slot_id_prefix: h.key.key_id for h in await store.list_slots(P, "api")}
    assert holders == {first.slot.slot_id[:13]: "key_a", second.slot.slot_id[:13]: None}

    clock.advance(500)
    renewed = await store.renew_slot(P, "api", first.slot.slot_id)
    assert renewed == replace(first.slot, lease_deadline_ms=clock.now + 1_000)
    assert sent.took(*_RENEW) == 1 and sent.took(_POOL_AND_SLOT) == 0

    clock.advance(100)
    assert await store.release_slot(P, "api", first.slot.slot_id, None) is True
    assert await store.release_slot(P, "api", first.slot.slot_id, None) is False  # once
    assert sent.took(_POOL_AND_SLOT) == 1  # the repeat found nothing: the general case
    view = await store.get_pool(P, "api")
    assert view.in_use == 1 and view.stats.released == 1
    await asyncio.sleep(0)
    assert pool_freed(P, "api") in freed
    grants = [e for e in reported if isinstance(e, Granted)]
    ends = [e for e in reported if isinstance(e, Ended)]
    assert [(g.kind, g.name) for g in grants] == [("slot", "api")] * 2
    assert [(e.reason, e.held_ms) for e in ends] == [("released", 600)]


async def test_the_short_path_clamps_the_wait_by_the_remembered_pool(store):
    config = PoolConfig(limit=3, queue_timeout_ms=700, term_ms=6_000)
    await store.put_pool(P, "api", config)
    sent = WriterStatements(store)
    granted = await _acquire(store, wait=90_000)
    fail_fast = await _acquire(store, wait=90_000, no_queue=True)
    assert (granted.wait_ms, granted.config) == (700, config)
    assert (fail_fast.wait_ms, fail_fast.config) == (0, config)
    assert sent.took(*_ADMIT) == 2 and sent.took(_LOAD_WITH_COUNTS) == 0
    await store.put_pool(P, "api", replace(config, queue_timeout_ms=300))
    sent.clear()
    assert (await _acquire(store, wait=90_000)).wait_ms == 300  # and remembered anew
    queued = await _acquire(store, wait=90_000)
    assert queued.ticket is not None and queued.wait_ms == 300
    assert sent.took(_LOAD_WITH_COUNTS) == 1  # the full pool: the general case


async def test_a_pool_at_its_limit_refuses_and_queues_as_before(store):
    await store.put_pool(P, "api", PoolConfig(limit=2, queue_size=5))
    sent = WriterStatements(store)
    held = [await _acquire(store) for _ in range(2)]
    assert [h.in_use for h in held] == [1, 2]
    refused = await _acquire(store)
    assert refused.slot is None and refused.in_use == 2 and refused.retry_after_ms is not None
    queued = await _acquire(store, wait=5_000)
    assert queued.slot is None and queued.ticket is not None
    assert sent.took(*_ADMIT) == 4 and sent.took(_LOAD_WITH_COUNTS) == 2
    assert (await store.get_pool(P, "api")).queued == 1


async def test_a_newcomer_never_overtakes_a_live_waiter(store):
    await store.put_pool(P, "api", PoolConfig(limit=1, queue_size=5))
    held = await _acquire(store)
    waiter = await _acquire(store, wait=5_000)
    assert await store.release_slot(P, "api", held.slot.slot_id, None)
    # a slot is free and the pool is known, but someone is alive in line
    newcomer = await _acquire(store)
    assert newcomer.slot is None and newcomer.in_use == 0
    admitted = await store.retry_slot_waiter(P, "api", waiter.ticket, 5_000)
    assert admitted.slot is not None and admitted.in_use == 1
    assert (await _acquire(store)).slot is None  # the limit holds


async def test_releases_and_acquires_in_one_batch_never_pass_the_limit(store):
    for round_ in range(5):
        pool = f"api{round_}"
        await store.put_pool(P, pool, PoolConfig(limit=3))
        held = [await _acquire(store, pool) for _ in range(3)]
        results = await asyncio.gather(
            *(store.release_slot(P, pool, h.slot.slot_id, None) for h in held),
            *(_acquire(store, pool) for _ in range(8)),
        )
        assert results[:3] == [True] * 3
        granted = [r for r in results[3:] if r.slot is not None]
        # jobs on one pool keep their order: every release comes first
        assert sorted(r.in_use for r in granted) == [1, 2, 3]
        assert all(r.in_use == 3 for r in results[3:] if r.slot is None)
        assert (await store.get_pool(P, pool)).in_use == 3


async def test_a_refusal_in_the_batch_replays_the_others_as_decided(store):
    """An operation that raises sends its batch to the replay, one savepoint
    per operation: the short paths there run whole, and decide the same. The
    operations of one batch are concurrent, so the release may count before
    or after the acquires beside it: either way the limit holds, each grant
    reports the slots live with it, and the pool counts what was released."""
    await store.put_pool(P, "api", PoolConfig(limit=3))
    held = await _acquire(store)
    report = SlotReport(status=200, report_json="{}")
    for _ in range(3):
        results = await asyncio.gather(
            _acquire(store), _acquire(store, "nope"), _acquire(store),
            store.release_slot(P, "api", held.slot.slot_id, report),
            store.renew_slot(P, "nope", "slot_x"), _acquire(store), _acquire(store),
            return_exceptions=True,
        )
        first, missing, second, released, unknown, third, fourth = results
        assert isinstance(missing, NotFound) and isinstance(unknown, NotFound)
        assert released is True
        attempts = (first, second, third, fourth)
        granted = [a for a in attempts if a.slot is not None]
        assert len(granted) == 3  # one slot was held and one released: room for three
        # in turn, 2, 3, then 3 after the release; the release first, 1, 2, 3
        assert sorted(a.in_use for a in granted) in ([2, 3, 3], [1, 2, 3])
        assert all(a.in_use == 3 for a in attempts if a.slot is None)
        view = await store.get_pool(P, "api")
        assert view.in_use == 3
        *others, held = granted
        for attempt in others:
            assert await store.release_slot(P, "api", attempt.slot.slot_id, None)
    assert (await store.get_pool(P, "api")).stats.released == 9


async def test_a_reconfigure_by_another_writer_is_not_missed(store, clock):
    other = reopen(store, clock)  # a replica (PostgreSQL) or a second process (SQLite)
    await other.open()
    try:
        await store.put_pool(P, "api", PoolConfig(limit=3, term_ms=1_000))
        held = await _acquire(store)
        assert held.in_use == 1 and held.effective_limit == 3
        await other.put_pool(P, "api", PoolConfig(limit=1, term_ms=5_000))
        # this writer remembers limit 3; the row says 1
        refused = await _acquire(store)
        assert refused.slot is None and refused.effective_limit == 1
        renewed = await store.renew_slot(P, "api", held.slot.slot_id)
        assert renewed.lease_deadline_ms == clock.now + 5_000  # the new term
        await other.put_pool(P, "api", PoolConfig(limit=2, term_ms=5_000))
        admitted = await _acquire(store)
        assert admitted.in_use == 2 and admitted.effective_limit == 2
        assert admitted.slot.lease_deadline_ms == clock.now + 5_000
        assert (await _acquire(store)).slot is None
        assert await other.delete_pool(P, "api")
        with pytest.raises(NotFound):
            await _acquire(store)
        with pytest.raises(NotFound):
            await store.renew_slot(P, "api", held.slot.slot_id)
    finally:
        await other.close()


async def test_what_another_writer_learned_is_not_missed(store, clock):
    other = reopen(store, clock)
    await other.open()
    try:
        await warmed_pool(store, "ad", 10, clock)
        clock.advance(1_000)
        assert (await _acquire(store, "ad")).in_use == 1
        throttled = await _acquire(other, "ad")
        clock.advance(50)
        report = SlotReport(status=429, report_json="{}")
        assert await other.release_slot(P, "ad", throttled.slot.slot_id, report)
        lowered = int(10 * gov.BETA)
        attempts = [await _acquire(store, "ad") for _ in range(lowered)]
        assert sum(a.slot is not None for a in attempts) == lowered - 1  # one was held
        assert attempts[-1].slot is None and attempts[-1].effective_limit == lowered
    finally:
        await other.close()


async def test_a_remembered_pool_its_row_no_longer_matches_is_read_again(store):
    """As after a batch that rolled back: the writer remembers a state under a
    version that was never committed."""
    await store.put_pool(P, "api", PoolConfig(limit=1))
    assert (await _acquire(store)).in_use == 1
    known = store._known_pools
    real = known.get((P, "api"))
    wider = replace(real, config=replace(real.config, limit=5), version=real.version ^ 1)
    known.put((P, "api"), wider)
    refused = await _acquire(store)
    assert refused.slot is None and refused.effective_limit == 1
    assert known.get((P, "api")) == real  # read again


async def test_a_paced_pool_is_admitted_only_by_the_general_case(store, clock):
    await store.put_pool(P, "rated", PoolConfig(limit=100, rpm=3))
    sent = WriterStatements(store)
    admitted = []
    for _ in range(4):
        admitted.append(await _acquire(store, "rated"))
        clock.advance(5_000)
    assert [a.slot is not None for a in admitted] == [True, True, False, False]
    assert sent.took(*_ADMIT) == 0


async def test_a_paused_pool_lets_only_probes_through(store, clock):
    await store.put_pool(P, "ad", PoolConfig(limit=10, adaptive=True))
    first = await _acquire(store, "ad")
    clock.advance(50)
    spent = RateLimitInfo(request_limit=600, request_remaining=0, request_reset_ms=2_000,
                          retry_after_ms=2_000)
    report = SlotReport(status=429, rate=spent, report_json="{}")
    assert await store.release_slot(P, "ad", first.slot.slot_id, report)
    sent = WriterStatements(store)
    paused = await _acquire(store, "ad")
    assert paused.slot is None and paused.paused_until_ms == clock.now + 2_000
    clock.advance(100)
    assert (await _acquire(store, "ad")).slot is not None  # the probe
    assert (await _acquire(store, "ad")).slot is None
    clock.advance(2_000)  # the pause is over; the pool learned a rate, so it paces
    assert (await _acquire(store, "ad")).slot is not None
    assert sent.took(*_ADMIT) == 0


async def test_renewals_near_the_cap_and_of_attached_slots_take_the_general_case(store, clock):
    await store.put_pool(P, "api", PoolConfig(limit=2, term_ms=1_000, request_timeout_ms=1_500))
    slot = (await _acquire(store)).slot
    sent = WriterStatements(store)
    clock.advance(800)
    capped = await store.renew_slot(P, "api", slot.slot_id)
    assert capped.lease_deadline_ms == capped.request_deadline_ms == slot.request_deadline_ms
    assert sent.took(_POOL_AND_SLOT) == 1
    await store.put_pool(P, "long", PoolConfig(limit=2, term_ms=1_000))
    session = await store.create_session(P, "key_a", 30, None)
    attached = await store.acquire_slot(
        P, "long", wait_alive_ms=None, key_id="key_a", session_id=session.session_id)
    assert attached.slot.session_id == session.session_id
    unchanged = await store.renew_slot(P, "long", attached.slot.slot_id)
    assert unchanged == attached.slot
    assert sent.took(_POOL_AND_SLOT) == 2


async def test_reports_are_counted_and_learned_from_on_the_short_path(store, clock):
    await store.put_pool(P, "ad", PoolConfig(limit=10, adaptive=True))
    slot = (await _acquire(store, "ad")).slot
    clock.advance(40)
    report = SlotReport(status=503, throttled=2, retry_after_ms=700, report_json='{"a": 1}')
    assert await store.release_slot(P, "ad", slot.slot_id, report)
    view = await store.get_pool(P, "ad")
    assert view.stats.released == 1 and view.stats.statuses["5xx"] == 1
    assert view.stats.throttled == 2 and view.stats.last_retry_after_ms == 700
    assert view.governor.hold_ms is not None  # learned from the hold
    remembered = store._known_pools.get((P, "ad"))
    assert remembered.governor == view.governor  # what it wrote, it remembers
    assert (await _acquire(store, "ad")).slot is not None


# --- PostgreSQL: round trips ------------------------------------------------------


async def test_a_batch_of_pool_acquires_or_releases_is_one_statement(store):
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite's statements are calls in this process, not round trips")
    batches: list[int] = []
    store.watch_batches(
        lambda writer, size, seconds, failed, replayed: writer and batches.append(size)
    )
    await store.put_pool(P, "api", PoolConfig(limit=40))
    batches.clear()
    with wire_trace(store) as lines:
        acquired = await asyncio.gather(*(_acquire(store, key_id="key_a") for _ in range(20)))
        assert sorted(a.in_use for a in acquired) == list(range(1, 21))
        released = await asyncio.gather(
            *(store.release_slot(P, "api", a.slot.slot_id, None) for a in acquired)
        )
        assert released == [True] * 20
    statements, round_trips = count_round_trips(lines)
    # each batch: BEGIN (with the pool's lock and the clock), the pipeline
    # with the batch's acquires (or releases) as one statement, COMMIT and
    # the notification it carries
    assert sum(batches) == 40
    assert statements <= 4 * len(batches) < 40, summary(lines)
    assert round_trips <= 3 * len(batches), summary(lines)
    view = await store.get_pool(P, "api")
    assert view.in_use == 0 and view.stats.released == 20


async def test_a_slot_waiters_retry_refreshes_its_place_and_reads_the_pool_at_once(store):
    # Its begin, the refresh of its place and the pool's counts in one
    # round trip (they do not depend on each other; the counts say when the
    # slots held end at the latest, the refusal's Retry-After), and its commit.
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite's statements are calls in this process, not round trips")
    await store.put_pool(P, "api", PoolConfig(limit=1, queue_size=5))
    assert (await _acquire(store)).slot is not None
    waiting = await _acquire(store, wait=60_000)
    assert waiting.ticket is not None
    with wire_trace(store) as lines:
        again = await store.retry_slot_waiter(P, "api", waiting.ticket, 60_000)
    assert again.slot is None and again.ticket == waiting.ticket
    statements, round_trips = count_round_trips(lines)
    assert (statements, round_trips) == (4, 3), summary(lines)


async def test_a_full_pools_waiter_joins_the_line_with_the_counts_it_is_refused_on(store):
    # Its begin (with the pool's lock and the clock) and the common case's
    # guarded insert, then the pool's counts and its place in line in one
    # round trip (the place goes in only where the pool has room in its
    # queue, tested on the rows the counts read), and its commit.
    if isinstance(store, SqliteStore):
        pytest.skip("SQLite's statements are calls in this process, not round trips")
    await store.put_pool(P, "api", PoolConfig(limit=1, queue_size=5))
    assert (await _acquire(store)).slot is not None
    with wire_trace(store) as lines:
        waiting = await _acquire(store, wait=60_000)
    assert waiting.slot is None and waiting.ticket is not None
    statements, round_trips = count_round_trips(lines)
    assert (statements, round_trips) == (5, 4), summary(lines)
    assert (await store.get_pool(P, "api")).queued == 1


async def test_a_refusal_says_when_the_first_held_slot_must_end(store, clock):
    # With no hold time learned, Retry-After is the earliest hard cap among
    # the live slots (renewals cannot pass it), read with the pool's counts.
    await store.put_pool(P, "capped", PoolConfig(limit=2, request_timeout_ms=9_000))
    assert (await _acquire(store, "capped")).slot is not None
    clock.advance(4_000)
    assert (await _acquire(store, "capped")).slot is not None
    refused = await _acquire(store, "capped")
    assert refused.slot is None and refused.retry_after_ms == 5_000


async def test_a_slot_waiter_dropped_from_the_line_rejoins_behind_the_others(store, clock):
    await store.put_pool(P, "api", PoolConfig(limit=1, queue_size=5))
    held = await _acquire(store)
    lapsed = await store.acquire_slot(P, "api", wait_ms=60_000, wait_alive_ms=1_000)
    kept = await store.acquire_slot(P, "api", wait_ms=60_000, wait_alive_ms=60_000)
    assert lapsed.ticket is not None and kept.ticket is not None
    clock.advance(2_000)
    await store.reap()
    assert await store.release_slot(P, "api", held.slot.slot_id, None)
    again = await store.retry_slot_waiter(P, "api", lapsed.ticket, 60_000)
    assert again.slot is None  # behind `kept` now, though it came first
    assert again.ticket is not None and again.ticket > kept.ticket
    admitted = await store.retry_slot_waiter(P, "api", kept.ticket, 60_000)
    assert admitted.slot is not None


def _write_as_an_older_release(store: Any, statement: str) -> None:
    """Run `statement` on the store's database as a replica of a release that
    knows no admission version would: the version column left alone."""
    if isinstance(store, SqliteStore):
        conn = sqlite3.connect(store.path)
        try:
            conn.execute(statement)
            conn.commit()
        finally:
            conn.close()
        return
    with psycopg.connect(store.url, autocommit=True) as pg:
        pg.execute(statement)


def _version(store: Any) -> int:
    query = f"SELECT admission_version FROM pools WHERE project = '{P}' AND name = 'api'"
    if isinstance(store, SqliteStore):
        conn = sqlite3.connect(store.path)
        try:
            return int(conn.execute(query).fetchone()[0])
        finally:
            conn.close()
    with psycopg.connect(store.url, autocommit=True) as pg:
        row = pg.execute(query).fetchone()
        assert row is not None
        return int(row[0])


async def test_a_write_that_knows_no_version_still_ends_the_guess(store):
    """During an upgrade, a replica of the older release changes a pool's
    limit (or what its governor learned) without a version: the database
    gives the row a new one, so this writer reads the pool again instead of
    admitting by the limit it remembers."""
    await store.put_pool(P, "api", PoolConfig(limit=3))
    assert (await _acquire(store)).in_use == 1  # the writer remembers limit 3
    before = _version(store)
    _write_as_an_older_release(
        store, f"UPDATE pools SET released = released + 1 WHERE project = '{P}' AND name = 'api'")
    assert _version(store) == before  # statistics say nothing about admission
    _write_as_an_older_release(
        store, f"UPDATE pools SET slot_limit = 1 WHERE project = '{P}' AND name = 'api'")
    assert _version(store) != before
    refused = await _acquire(store)
    assert refused.slot is None and refused.effective_limit == 1


async def test_an_acquire_of_a_missing_pool_is_refused_without_replaying_its_batch(store):
    """NotFound is the missing pool's answer, not an error that rolls back
    the batch and replays everyone else's operations one by one."""
    await store.put_pool(P, "api", PoolConfig(limit=10))
    sent = WriterStatements(store)
    outcomes = await asyncio.gather(
        *(_acquire(store, "api") for _ in range(5)),
        _acquire(store, "no-such-pool"),
        _acquire(store, "no-such-pool", wait=5_000),  # its place in line goes with the reads
        _acquire(store, "no-such-pool", session_id="sess_none", key_id="key_a"),
        return_exceptions=True,
    )
    granted, missing = outcomes[:5], outcomes[5:]
    assert all(not isinstance(o, BaseException) and o.slot is not None for o in granted)
    assert all(isinstance(o, NotFound) for o in missing), missing
    assert not any("SAVEPOINT" in statement for statement in sent.sent), sent.sent
