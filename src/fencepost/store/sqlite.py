"""The embedded SQLite store: one file, one server process, WAL and group commit."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any, Callable, ContextManager

from fencepost.clock import wall_clock_ms
from fencepost.errors import StoreUnavailable
from fencepost.store.batch import Cursor
from fencepost.store.migrate import apply_migrations
from fencepost.store.sql_store import DEFAULT_READERS, SqlStore


class SqliteEngine:
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    # Statements are in-process calls: no round trip to save by stepping a
    # batch's operations together, so each runs whole, in turn.
    pipelines = False

    def __init__(self, path: str, clock_ms: Callable[[], int]) -> None:
        self.path = path
        self.clock_ms = clock_ms

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: the WAL is fsynced at every commit, so an acknowledged write
        # survives a crash of the process and of the machine. Group commit pays
        # for one fsync per batch, not per request.
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=10000")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def begin(self, conn: sqlite3.Connection, exclusive: bool) -> Callable[[], int]:
        # IMMEDIATE takes the write lock now, so a `fencepost project create`
        # in another process waits instead of failing mid-batch. Readers take a
        # WAL snapshot and never block the writer.
        conn.execute("BEGIN IMMEDIATE" if exclusive else "BEGIN")
        return self.clock_ms

    def execute(self, conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> Cursor:
        return conn.execute(sql, params)

    def commit(self, conn: sqlite3.Connection, events: list[Any]) -> None:
        # One process: events are published locally after the commit.
        conn.execute("COMMIT")

    def fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.OperationalError)

    def broken(self, conn: sqlite3.Connection) -> bool:
        return False

    def pipeline(self, conn: sqlite3.Connection) -> ContextManager[None]:
        raise NotImplementedError  # `pipelines` is False: never asked


class SqliteStore(SqlStore):
    url_scheme = "sqlite"

    def __init__(
        self, path: str, clock_ms: Callable[[], int] = wall_clock_ms, readers: int = DEFAULT_READERS
    ) -> None:
        self.path = path
        self._clock_ms = clock_ms
        super().__init__(SqliteEngine(path, clock_ms), readers)

    async def open(self) -> None:
        if not Path(self.path).parent.is_dir():  # a mistyped path must not start an empty store
            raise StoreUnavailable(f"Cannot open the SQLite store at {self.path}: "
                                   f"the folder {Path(self.path).parent} does not exist.")
        try:
            await asyncio.to_thread(apply_migrations, f"sqlite:///{self.path}", "sqlite")
            await self._start()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"Cannot open the SQLite store at {self.path}: {exc}.") from exc
        # Embedded means one server process: waiters left by a crashed process
        # can never be answered, so they leave the line now.
        await self._writer.run(_clear_waiters)

    async def now_ms(self) -> int:
        return self._clock_ms()


def _clear_waiters(tx: Any) -> None:
    tx.execute("DELETE FROM lock_waiters")
    tx.execute("DELETE FROM slot_waiters")
