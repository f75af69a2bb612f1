"""What the store does about faults, on every backend: the fencing counter is
floored at the clock when a store opens (SPEC §7.8), a failed write turns
readiness off until a write probe commits, driver errors that mean "the store
is unusable" fail the batch as 503, and the SQLite file guard notices a file
deleted, replaced or truncated under it."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path

import psycopg
import pytest

from fencepost.clock import SteadyClock
from fencepost.errors import StoreUnavailable
from fencepost.store.file_guard import FileGuard
from fencepost.store.postgresql import PostgresEngine, PostgresStore
from fencepost.store.sql_store import WRITE_PROBE_EVERY_MS
from fencepost.store.sqlite import SqliteEngine, SqliteStore

from .conftest import FakeClock, reopen
from .store_support import P, grant


def set_counter(store, value: int) -> None:
    """Put the fencing counter back, as restoring an older copy does."""
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as conn:
            conn.execute("UPDATE counters SET value = ? WHERE name = 'fencing'", (value,))
        return
    assert isinstance(store, PostgresStore)
    with psycopg.connect(store.url, autocommit=True) as conn:  # tokens come from a sequence
        conn.execute("SELECT setval('fencing_tokens', %s, false)", (max(value, 1),))


async def test_tokens_start_at_the_clock_in_microseconds(store, clock):
    lease = await grant(store, "a")
    assert lease.fencing_token > clock.now * 1000
    assert lease.fencing_token < 2**53


async def test_a_store_restored_from_an_older_copy_never_reissues_a_token(store, clock):
    issued = [(await grant(store, f"k{i}")).fencing_token for i in range(5)]
    await store.close()
    set_counter(store, 0)  # the copy was taken before any of them
    clock.advance(1)  # a restore takes time: at least a millisecond
    restored = reopen(store, clock)
    await restored.open()
    try:
        after = await grant(restored, "later")
        assert after.fencing_token > max(issued)
    finally:
        await restored.close()
        await store.open()  # the fixture closes it again


async def test_a_failed_write_turns_readiness_off_until_a_probe_commits(store, clock):
    await store.check_ready()
    await store.reap()  # the first write probe
    engine = store._writer._engine
    real_commit = engine.commit

    def failing_commit(conn, events):
        raise engine.errors[0]("disk full")

    engine.commit = failing_commit
    try:
        with pytest.raises(StoreUnavailable):
            await grant(store, "lost")
    finally:
        engine.commit = real_commit
    with pytest.raises(StoreUnavailable, match="disk full"):
        await store.check_ready()
    await store.reap()  # too soon for another probe: a reap that writes nothing proves nothing
    with pytest.raises(StoreUnavailable, match="disk full"):
        await store.check_ready()
    clock.advance(WRITE_PROBE_EVERY_MS)
    await store.reap()
    await store.check_ready()


def test_sqlite_errors_that_mean_the_file_is_unusable_are_fatal(tmp_path: Path) -> None:
    engine = SqliteEngine(str(tmp_path / "x.db"), FakeClock())
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(sqlite3.DatabaseError) as not_a_database:
        sqlite3.connect(garbage).execute("SELECT * FROM sqlite_master")
    assert engine.fatal(not_a_database.value)
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (x PRIMARY KEY)")
    conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.IntegrityError) as duplicate:
        conn.execute("INSERT INTO t VALUES (1)")
    assert not engine.fatal(duplicate.value)  # one operation's refusal, not the store's


def test_postgresql_errors_that_mean_the_database_refuses_are_fatal() -> None:
    engine = PostgresEngine("postgresql://nobody@127.0.0.1:1/none", None, "fencepost/test")
    assert engine.fatal(psycopg.errors.ReadOnlySqlTransaction("read-only"))
    assert engine.fatal(psycopg.errors.DiskFull("no space"))
    assert engine.fatal(psycopg.errors.AdminShutdown("bye"))
    assert engine.fatal(psycopg.errors.DataCorrupted("bad page"))
    assert not engine.fatal(psycopg.errors.UniqueViolation("duplicate"))


@pytest.mark.parametrize("fault", ["deleted", "replaced", "truncated", "wal-deleted"])
def test_the_file_guard_notices_a_lost_file(
    tmp_path: Path, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "store.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (randomblob(100000))")
    conn.execute("PRAGMA wal_checkpoint")
    guard = FileGuard(str(db))
    assert guard.check() is None
    if fault == "deleted":
        db.unlink()
    elif fault == "replaced":
        other = tmp_path / "other.db"
        sqlite3.connect(other).execute("CREATE TABLE u (y)")
        other.replace(db)
    elif fault == "truncated":
        os.truncate(db, 4096)
    else:
        Path(f"{db}-wal").unlink()
    reason = guard.check()
    assert reason is not None and str(db) in reason
    assert guard.check() == reason  # it stays lost
    # Said once, through the application log (JSON lines on the server's stderr).
    said = [r for r in caplog.records if "store lost" in r.getMessage()]
    assert len(said) == 1 and said[0].name.startswith("fencepost."), caplog.records
    conn.close()


def test_the_file_guard_lets_the_file_grow(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    guard = FileGuard(str(db))
    conn.execute("CREATE TABLE t (x)")
    for _ in range(3):
        assert guard.check() is None
        conn.execute("INSERT INTO t VALUES (randomblob(100000))")
        conn.execute("PRAGMA wal_checkpoint")
    assert guard.check() is None
    conn.close()


def test_the_steady_clock_ignores_wall_clock_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SteadyClock()
    before = clock()
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + 3_600_000_000_000)
    after = clock()
    assert 0 <= after - before < 3_600_000
    assert clock.drift_ms() >= 3_600_000 - 1000


async def test_sqlite_store_refuses_everything_once_its_file_is_lost(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "store.db"))
    await store.open()
    try:
        await grant(store, "before")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{store.path}{suffix}").unlink()
        with pytest.raises(StoreUnavailable, match="deleted"):
            await grant(store, "into-the-void")
        with pytest.raises(StoreUnavailable):
            await store.get_lock(P, "before")
        with pytest.raises(StoreUnavailable):
            await store.check_ready()
        assert store.lost() is not None
    finally:
        await store.close()
    await asyncio.sleep(0)


async def test_after_the_database_ends_every_session_one_write_fails_not_one_per_connection(
    store, clock,
):
    """A failover (here: every session of the database ended at once) leaves
    each of the writer's connections stale. The first batch that meets one
    fails loudly (503, nothing acknowledged); the writer then replaces every
    connection opened before it, so the writes after it succeed, whichever
    connection serves them."""
    if isinstance(store, SqliteStore):
        pytest.skip("one SQLite connection, never reopened (a deleted file must stay lost)")
    await grant(store, "before")
    name = store.url.rsplit("/", 1)[1]
    with psycopg.connect(store.url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
    refused = 0
    for round_ in range(8):  # one after another: each writer connection serves some
        try:
            await grant(store, f"after-{round_}")
        except StoreUnavailable:
            refused += 1
    assert refused <= 1
