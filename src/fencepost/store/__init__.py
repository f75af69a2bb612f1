"""Stores: where all state lives. `open_store(url)` picks the backend by URL scheme."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fencepost.store.base import Store

if TYPE_CHECKING:  # imported where used: a server loads only its own backend
    from fencepost.store.postgresql import PostgresStore
    from fencepost.store.sqlite import SqliteStore


def sqlite_path(url: str) -> str:
    """`sqlite:///relative.db` -> `relative.db`; `sqlite:////abs/x.db` -> `/abs/x.db`."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ValueError(
            f"{url!r} is not a SQLite store URL (sqlite:///relative.db or sqlite:////absolute.db)"
        )
    return url[len(prefix):]


def redacted(url: str) -> str:
    """The store URL with any password replaced, for logs and messages."""
    from fencepost.store.pg_url import redacted as without_password

    return without_password(url)


def make_store(
    url: str, readers: int | None = None, clock_anchor: tuple[int, int] | None = None,
    timeout_s: float | None = None, require_sync: bool = False,
    ended_retention_ms: int | None = None,
) -> Store:
    """The store for `url`; `readers` is how many read-only connections it keeps
    besides its one writer (default: sql_store.DEFAULT_READERS). SQLite's
    clock starts from `clock_anchor` when given (see SteadyClock); a
    PostgreSQL store's clock is always the database's. A PostgreSQL store
    answers 503 after `timeout_s` without an answer from the database, and
    with `require_sync` changes nothing unless a synchronous standby confirms
    the commit (SPEC §6). Both remember ended leases for `ended_retention_ms`
    (default: sql_store.DEFAULT_ENDED_RETENTION_MS). ValueError for a URL
    that names no store, or for `require_sync` on SQLite."""
    from fencepost.store.sql_store import DEFAULT_READERS

    count = DEFAULT_READERS if readers is None else readers
    if url.startswith("sqlite:"):
        from fencepost.clock import SteadyClock
        from fencepost.store.sqlite import SqliteStore

        if require_sync:
            raise ValueError(
                "--require-sync-replication needs a PostgreSQL store: an SQLite file has no "
                "standby"
            )
        store: SqliteStore | PostgresStore = SqliteStore(
            sqlite_path(url), SteadyClock(clock_anchor), readers=count)
    elif url.startswith(("postgresql:", "postgres:")):
        from fencepost.store.pg_url import parameters
        from fencepost.store.postgresql import DEFAULT_STORE_TIMEOUT_S, PostgresStore

        parameters(url)  # a URL libpq cannot read fails here, before anything starts
        store = PostgresStore(
            url, readers=count, require_sync=require_sync,
            timeout_s=DEFAULT_STORE_TIMEOUT_S if timeout_s is None else timeout_s,
        )
    else:
        raise ValueError(
            f"Unknown store URL {url!r}: use sqlite:///path.db or postgresql://user@host/db"
        )
    if ended_retention_ms is not None:
        store.ended_retention_ms = ended_retention_ms
    return store
