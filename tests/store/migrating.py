"""Stores migrated only part of the way, seeded as an older schema had them,
for tests of what a migration does to data already there."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from yoyo import get_backend, read_migrations
from yoyo.migrations import MigrationList

from fencepost.store.base import Store
from fencepost.store.migrate import migrations_dir
from fencepost.store.postgresql import PostgresStore
from fencepost.store.sqlite import SqliteStore
from pg_support import temporary_database


def migrate_until(url: str, backend: str, last: str) -> Any:
    """Apply the migrations up to and including `last`; return the open yoyo backend."""
    migrator = get_backend(url)
    wanted = []
    for migration in read_migrations(migrations_dir(backend)):
        wanted.append(migration)
        if migration.id == last:
            break
    assert wanted[-1].id == last, f"no migration {last} for {backend}"
    with migrator.lock():
        migrator.apply_migrations(migrator.to_apply(MigrationList(wanted)))
    return migrator


def old_store(
    backend: str, tmp_path: Path, clock: Callable[[], int], last: str,
    seed: Callable[[Any], None],
) -> Iterator[Store]:
    """A store (not yet opened) of `backend`, migrated up to `last` and seeded
    by `seed(migrator)` (which commits and closes the connection); opening it
    applies the rest."""
    if backend == "sqlite":
        path = tmp_path / "old.db"
        seed(migrate_until(f"sqlite:///{path}", "sqlite", last))
        yield SqliteStore(str(path), clock_ms=clock)
        return
    with temporary_database() as url:
        yoyo_url = urlunsplit(("postgresql+psycopg", *urlsplit(url)[1:]))
        seed(migrate_until(yoyo_url, "postgresql", last))
        yield PostgresStore(url, clock_ms=clock)
