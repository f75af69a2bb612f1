"""Real PostgreSQL for tests: a throwaway database per test, dropped afterwards.

Set FENCEPOST_TEST_PG (default postgresql://postgres@127.0.0.1:5432/postgres)
to point elsewhere. Without a server the PostgreSQL tests are skipped on a
developer's machine, but under CI=true a missing server is a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from typing import Any, Iterator
from urllib.parse import urlsplit, urlunsplit

from support import missing

ADMIN_URL = os.environ.get("FENCEPOST_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
# The databases this test run made: tests/conftest.py checks at the end of the
# session that none is left (other test runs on the machine have their own).
_MADE: list[str] = []


def _admin_connection():  # type: ignore[no-untyped-def]
    import psycopg

    try:
        return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        missing(f"PostgreSQL at {ADMIN_URL} ({exc})")


def database_url(name: str) -> str:
    parts = urlsplit(ADMIN_URL)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@contextlib.contextmanager
def temporary_database() -> Iterator[str]:
    name = _create()
    try:
        yield database_url(name)
    finally:
        drop_databases([name])


# This test process's migrated database, copied by `migrated_database`
# (made on first use, dropped with the rest at the end of the session).
_TEMPLATE: list[str] = []


@contextlib.contextmanager
def migrated_database() -> Iterator[str]:
    """A throwaway database that already has the current schema: a copy of one
    migrated once per test process (migrating takes most of a second; a copy,
    a tenth). For tests of the store's behaviour; tests of migrating itself
    use `temporary_database`."""
    if not _TEMPLATE:
        from fencepost.store.migrate import apply_migrations

        name = _create()
        migrations_url = urlunsplit(("postgresql+psycopg", *urlsplit(database_url(name))[1:]))
        apply_migrations(migrations_url, "postgresql")
        _TEMPLATE.append(name)
    name = _create(template=_TEMPLATE[0])
    try:
        yield database_url(name)
    finally:
        drop_databases([name])


def _create(template: str | None = None) -> str:
    """CREATE a database of a new name (a copy of `template`, if given),
    remembered for the end-of-session check; returns its name. PostgreSQL
    refuses to copy a template while a session is still on it, and the
    migrating connection's session ends a moment after it was closed: so a
    copy is tried again until it goes through."""
    import psycopg

    name = f"fencepost_test_{uuid.uuid4().hex[:16]}"
    statement = f'CREATE DATABASE "{name}"'
    if template is not None:
        statement += f' TEMPLATE "{template}"'
    deadline = time.monotonic() + 30  # a guard, not a bound on speed
    while True:
        try:
            with _admin_connection() as admin:
                admin.execute(statement)
            break
        except psycopg.errors.ObjectInUse:
            if template is None or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    _MADE.append(name)
    return name


def leftover_databases() -> list[str]:
    """The databases made by `temporary_database` and `migrated_database` in
    this run that still exist."""
    if not _MADE:
        return []
    with _admin_connection() as admin:
        rows = admin.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", (_MADE,)
        ).fetchall()
    return sorted(str(row[0]) for row in rows)


def drop_template() -> None:
    """Drop `migrated_database`'s template, at the end of the session."""
    drop_databases(_TEMPLATE)
    _TEMPLATE.clear()


def drop_databases(names: list[str]) -> None:
    for name in names:
        with _admin_connection() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def sessions_gone(url: str, store: Any) -> None:
    """Wait until the closed PostgresStore `store` has no session left in the database at
    `url`: PostgreSQL ends a session a moment after its client closed it."""
    import psycopg

    name = store._engine.application_name
    deadline = time.monotonic() + 60  # a guard, not a bound on speed: a loaded server is slow
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
            if row is not None and row[0] == 0:
                return
            await asyncio.sleep(0.02)
    raise AssertionError(f"the sessions of {name} are still there")


@contextlib.contextmanager
def server_on(store_kind: str, folder: Any, extra_args: list[str] | None = None
              ) -> Iterator[Any]:
    """A started `fencepost serve` on a fresh store of `store_kind` ("sqlite": a file
    in `folder`; "postgresql": a migrated throwaway database), with `extra_args`,
    stopped afterwards: for tests that run one case on both stores over HTTP."""
    from support import ServerProcess

    with contextlib.ExitStack() as stack:
        store = stack.enter_context(migrated_database()) if store_kind == "postgresql" else None
        started = ServerProcess(folder / store_kind, store=store,
                                extra_args=list(extra_args or [])).start()
        stack.callback(started.stop)
        yield started
