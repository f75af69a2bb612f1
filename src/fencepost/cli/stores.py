"""Whether a store URL names a store that already exists, for `fencepost project
create`: a key written to a store that no server runs on would never be accepted,
so a store that is not there yet (a mistyped path or database) is refused unless
the caller says `--create`."""

from __future__ import annotations

import os

from fencepost.errors import StoreUnavailable
from fencepost.store import sqlite_path

# The embedded store in the current folder (SPEC §6), for every command that
# opens a store.
DEFAULT_STORE = "sqlite:///fencepost.db"
# A table every version of fencepost's schema has.
_SCHEMA_TABLE = "api_keys"


def store_exists(url: str) -> bool:
    """True when `url` names a store with fencepost's schema in it: an existing
    SQLite file, or a PostgreSQL database that a server (or `--create`) has set
    up. Raises StoreUnavailable when a PostgreSQL server cannot be asked."""
    if url.startswith("sqlite:"):
        return os.path.exists(sqlite_path(url))
    return _postgres_has_schema(url)


def _postgres_has_schema(url: str) -> bool:
    import psycopg

    from fencepost.store.pg_url import conninfo
    from fencepost.store.postgresql import CONNECT_TIMEOUT_S

    try:
        with psycopg.connect(conninfo(url), connect_timeout=CONNECT_TIMEOUT_S) as conn:
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (_SCHEMA_TABLE,)).fetchone()
    except psycopg.Error as exc:
        raise StoreUnavailable(f"Cannot open the PostgreSQL store: {exc}.") from exc
    return bool(row and row[0])
