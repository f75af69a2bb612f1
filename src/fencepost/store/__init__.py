"""Stores: where all state lives. `open_store(url)` picks the backend by URL scheme."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from fencepost.store.base import Store


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
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def make_store(
    url: str, readers: int | None = None, clock_anchor: tuple[int, int] | None = None
) -> Store:
    """The store for `url`; `readers` is how many read-only connections it keeps
    besides its one writer (default: sql_store.DEFAULT_READERS). SQLite's
    clock starts from `clock_anchor` when given (see SteadyClock); a
    PostgreSQL store's clock is always the database's."""
    from fencepost.store.sql_store import DEFAULT_READERS

    count = DEFAULT_READERS if readers is None else readers
    if url.startswith("sqlite:"):
        from fencepost.clock import SteadyClock
        from fencepost.store.sqlite import SqliteStore

        return SqliteStore(sqlite_path(url), SteadyClock(clock_anchor), readers=count)
    if url.startswith(("postgresql:", "postgres:")):
        from fencepost.store.postgresql import PostgresStore

        return PostgresStore(url, readers=count)
    raise ValueError(
        f"Unknown store URL {url!r}: use sqlite:///path.db or postgresql://user@host/db"
    )
