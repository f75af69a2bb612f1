"""Stores: where all state lives. `open_store(url)` picks the backend by URL scheme."""

from __future__ import annotations

from fencepost.store.base import Store


def sqlite_path(url: str) -> str:
    """`sqlite:///relative.db` -> `relative.db`; `sqlite:////abs/x.db` -> `/abs/x.db`."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ValueError(
            f"{url!r} is not a SQLite store URL (sqlite:///relative.db or sqlite:////absolute.db)"
        )
    return url[len(prefix):]


def make_store(url: str) -> Store:
    if url.startswith("sqlite:"):
        from fencepost.store.sqlite import SqliteStore

        return SqliteStore(sqlite_path(url))
    if url.startswith(("postgresql:", "postgres:")):
        from fencepost.store.postgresql import PostgresStore

        return PostgresStore(url)
    raise ValueError(
        f"Unknown store URL {url!r}: use sqlite:///path.db or postgresql://user@host/db"
    )
