"""Migrations 0015 and 0018 on a store with ended leases: why a lease ended is
still known by its fencing token (fence checks) and by its lock token (late
renewals), and the lookups go by the table's key (the fencing token, so that
recording an end writes at the table's newest edge) and by the lease's digest."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencepost.errors import LeaseLost
from fencepost.store.postgresql import PostgresStore
from fencepost.store.sql.ended import BY_FENCING_TOKEN, BY_LEASE
from fencepost.store.sqlite import SqliteStore
from pg_support import temporary_database

from . import migrating
from .conftest import FakeClock

P = "default"
ENDED_TOKEN = str(uuid.uuid4())
BEFORE = {"sqlite": "0013_pool_version", "postgresql": "0014_ticket_sequence"}


def seed(migrator: Any, now_ms: int) -> None:
    """Two ended leases of one lock, as the old schema recorded them."""
    cursor = migrator.connection.cursor()
    for lock_token, reason, fencing in ((ENDED_TOKEN, "force_released", 77),
                                        (str(uuid.uuid4()), "expired", 76)):
        cursor.execute(
            "INSERT INTO ended_leases (project, key, lock_token, reason, ended_ms, fencing_token) "
            f"VALUES ('{P}', 'gone', '{lock_token}', '{reason}', {now_ms}, {fencing})"
        )
    migrator.connection.commit()
    migrator.connection.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def old_store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock):  # type: ignore[no-untyped-def]
    yield from migrating.old_store(
        request.param, tmp_path, clock, BEFORE[request.param],
        lambda migrator: seed(migrator, clock.now))


async def test_why_a_lease_ended_survives_the_migration(old_store):
    await old_store.open()
    try:
        force_released = await old_store.fence_check(P, "gone", 77)
        expired = await old_store.fence_check(P, "gone", 76)
        unknown = await old_store.fence_check(P, "gone", 78)
        assert (force_released.current, force_released.reason) == (False, "force_released")
        assert expired.reason == "expired" and unknown.reason == "unknown"
        elsewhere = await old_store.fence_check(P, "other", 77)
        assert elsewhere.reason == "unknown"  # a token is looked up within its own lock
        with pytest.raises(LeaseLost) as lost:
            await old_store.renew_lock(P, "gone", ENDED_TOKEN, 30)
        assert lost.value.reason == "force_released"
    finally:
        await old_store.close()


async def test_the_lookups_go_by_the_token_and_by_the_lease_digest(
    tmp_path: Path, clock: FakeClock
):
    store = SqliteStore(str(tmp_path / "new.db"), clock_ms=clock)
    await store.open()
    await store.close()
    with sqlite3.connect(tmp_path / "new.db") as conn:
        by_token = conn.execute("EXPLAIN QUERY PLAN " + BY_FENCING_TOKEN, (1,)).fetchall()
        by_lease = conn.execute("EXPLAIN QUERY PLAN " + BY_LEASE, (1,)).fetchall()
        tables = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "INTEGER PRIMARY KEY (rowid=?)" in " ".join(str(row[-1]) for row in by_token)
    lease_plan = " ".join(str(row[-1]) for row in by_lease)
    assert "ended_by_lease (lease_digest=?)" in lease_plan, lease_plan
    assert "TEMP B-TREE" not in lease_plan  # the index gives the order by token too
    assert "ended_leases" not in tables


async def test_on_postgresql_too_the_lookups_go_by_the_token_and_the_digest(clock: FakeClock):
    with temporary_database() as url:
        store = PostgresStore(url, clock_ms=clock)
        await store.open()
        await store.close()
        with psycopg.connect(url) as conn:
            conn.execute("SET enable_seqscan = off")  # an empty table: rule out the scan
            plans = [" ".join(row[0] for row in conn.execute(
                "EXPLAIN " + sql.replace("?", "%s"), (1,)).fetchall())
                for sql in (BY_FENCING_TOKEN, BY_LEASE)]
    assert "ended_pkey" in plans[0], plans[0]
    assert "ended_by_lease" in plans[1], plans[1]
