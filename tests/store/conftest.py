"""Backends for the Store conformance suite. Every test in this folder runs once
per backend, each on a fresh database (on PostgreSQL, a copy of one
migrated once per test process: the store still migrates it on open, which
finds nothing left to do)."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import pytest

from fencepost.store.sql_store import SqlStore
from fencepost.store.sqlite import SqliteStore
from pg_support import migrated_database


class FakeClock:
    """The store's clock, moved by the test instead of by waiting."""

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def reopen(store: SqlStore, clock: FakeClock) -> SqlStore:
    """A second store object on the same database, as after a restart."""
    from fencepost.store.postgresql import PostgresStore

    if isinstance(store, SqliteStore):
        return SqliteStore(store.path, clock_ms=clock)
    assert isinstance(store, PostgresStore)
    return PostgresStore(store.url, clock_ms=clock)


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[SqlStore]:
    if request.param == "sqlite":
        backend: SqlStore = SqliteStore(str(tmp_path / "conformance.db"), clock_ms=clock)
        await backend.open()
        yield backend
        await backend.close()
        return
    from fencepost.store.postgresql import PostgresStore

    with migrated_database() as url:
        backend = PostgresStore(url, clock_ms=clock)
        await backend.open()
        yield backend
        await backend.close()
