"""Migration 0015 on a store with ended leases: why a lease ended is still
known by its fencing token (fence checks) and by its lock token (late
renewals), and the fence check's lookup goes by the index that leads with the
token, so that recording an end writes near the index's newest edge instead
of at a random place in it."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencepost.errors import LeaseLost
from fencepost.store.postgresql import PostgresStore
from fencepost.store.sql.ended import BY_FENCING_TOKEN
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


async def test_a_fence_check_looks_the_token_up_by_the_index_that_leads_with_it(
    tmp_path: Path, clock: FakeClock
):
    store = SqliteStore(str(tmp_path / "new.db"), clock_ms=clock)
    await store.open()
    await store.close()
    with sqlite3.connect(tmp_path / "new.db") as conn:
        plan = conn.execute("EXPLAIN QUERY PLAN " + BY_FENCING_TOKEN, (1, P, "k")).fetchall()
        indexes = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'ended_leases'")}
    details = " ".join(str(row[-1]) for row in plan)
    assert "ended_leases_by_fencing (fencing_token=? AND project=? AND key=?)" in details
    assert "ended_leases_by_token" not in indexes  # the random-order index is gone


async def test_on_postgresql_too_the_lookup_goes_by_the_token(clock: FakeClock):
    with temporary_database() as url:
        store = PostgresStore(url, clock_ms=clock)
        await store.open()
        await store.close()
        with psycopg.connect(url) as conn:
            conn.execute("SET enable_seqscan = off")  # an empty table: rule out the scan
            plan = conn.execute(
                "EXPLAIN " + BY_FENCING_TOKEN.replace("?", "%s"), (1, P, "k")).fetchall()
    details = " ".join(row[0] for row in plan)
    assert "ended_leases_by_fencing" in details, details
