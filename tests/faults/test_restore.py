"""A store restored from an older copy never issues a fencing token at or below
one already issued (SPEC §7.8): the counter is floored at the clock in
microseconds whenever a store opens, on SQLite and on each PostgreSQL replica."""

from __future__ import annotations

import shutil
import sqlite3
import uuid
from pathlib import Path
from typing import Callable, Iterator

import psycopg
import pytest

from pg_support import ADMIN_URL, database_url, temporary_database
from support import ServerProcess

from .conftest import ROUNDS, grant_some


def test_restoring_an_older_sqlite_copy_never_reissues_a_token(
    servers: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    backup = tmp_path / "backup.db"
    issued: list[int] = []
    server = servers("store")
    issued += [token for _, token in grant_some(server, 3)]
    # An online backup, consistent, taken while the server runs.
    with sqlite3.connect(server.db_path) as live, sqlite3.connect(backup) as copy:
        live.backup(copy)
    for _ in range(ROUNDS):
        issued += [token for _, token in grant_some(server, 5)]
        server.stop()
        for suffix in ("-wal", "-shm"):
            Path(f"{server.db_path}{suffix}").unlink(missing_ok=True)
        shutil.copy(backup, server.db_path)  # restored, as an operator would
        server = servers("store")
        fresh = [token for _, token in grant_some(server, 3)]
        assert min(fresh) > max(issued), (fresh, issued)
        issued += fresh


@pytest.fixture
def snapshot_url() -> Iterator[Callable[[str], str]]:
    """Copies of PostgreSQL databases (CREATE DATABASE ... TEMPLATE), dropped afterwards."""
    made: list[str] = []

    def snapshot(of_url: str) -> str:
        name = f"fencepost_snap_{uuid.uuid4().hex[:16]}"
        source = of_url.rsplit("/", 1)[1]
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
        made.append(name)
        return database_url(name)

    yield snapshot
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        for name in made:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_restoring_an_older_postgresql_copy_never_reissues_a_token(
    servers: Callable[..., ServerProcess], snapshot_url: Callable[[str], str]
) -> None:
    with temporary_database() as url:
        replica = servers("before", store=url)
        issued = [token for _, token in grant_some(replica, 3)]
        replica.stop()  # a template database must have no connections
        older = snapshot_url(url)
        replica = servers("after", store=url)
        issued += [token for _, token in grant_some(replica, 5)]
        replica.stop()
        # Every replica of the restored copy starts above every token issued.
        restored = [servers(f"restored-{i}", store=older) for i in range(2)]
        fresh = [token for replica in restored for _, token in grant_some(replica, 3)]
        assert min(fresh) > max(issued), (fresh, issued)
        assert len(set(fresh)) == len(fresh)
        for replica in restored:
            replica.stop()
