"""The embedded SQLite store: one file, WAL and group commit, served by one
machine's server processes (the workers of `fencepost serve --workers N`;
see local_peers.py for how they tell each other about freed locks)."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any, Callable, ContextManager

from fencepost.clock import SteadyClock
from fencepost.errors import StoreUnavailable
from fencepost.store.base import Freed
from fencepost.store.batch import Cursor
from fencepost.store.checkpoints import Checkpointer
from fencepost.store.file_guard import FileGuard, SharedMemoryGuard
from fencepost.store.local_peers import LocalPeers
from fencepost.store.migrate import apply_migrations
from fencepost.store.sql_store import DEFAULT_READERS, SqlStore
from fencepost.store.writer_turn import WriterTurn

_log = logging.getLogger(__name__)

# Result codes (the low byte of an extended code) that say the file cannot be
# used as it is: corrupt or not a database, I/O error, full disk, read-only,
# cannot open, lock protocol broken, permission, file too large. A batch that
# meets one fails whole with 503 store_unavailable, never a 500.
_UNUSABLE = {3, 8, 10, 11, 13, 14, 15, 22, 26}
# The WAL's data (and its size) to the disk; plain fsync where the system
# has no fdatasync.
_datasync = getattr(os, "fdatasync", os.fsync)
# A wall clock this far from the server's is a step, not rounding: logged.
WALL_STEP_NOTICE_MS = 1_000


class SqliteEngine:
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    # Statements are in-process calls: no round trip to save by stepping a
    # batch's operations together, so each runs whole, in turn.
    pipelines = False
    # Batches run on the event loop's thread and commit without waiting for
    # the disk; `sync` (on the writer's flusher thread) makes them durable
    # before anyone is answered.
    inline = True
    on_loop = False  # inline instead: its statements are calls, not round trips
    locks_keys = False  # BEGIN IMMEDIATE holds the whole file
    # Batches are serialised whole (BEGIN IMMEDIATE): the counter row is enough.
    token_sequence: str | None = None
    ticket_sequence: str | None = None
    stale_together = False

    def __init__(
        self, path: str, clock_ms: Callable[[], int], peers: LocalPeers | None = None
    ) -> None:
        self.path = path
        self.clock_ms = clock_ms
        self.guard = FileGuard(path)
        self.shared_memory = SharedMemoryGuard(path)
        self.peers = peers or LocalPeers()  # unbound: a lone engine tells nobody
        self.turn = WriterTurn(path)
        self._wal: int | None = None  # a descriptor of the WAL, for `sync`
        self.checkpoints = Checkpointer(path, self.connect)
        self._writer_conn: sqlite3.Connection | None = None  # in a write transaction

    def sync(self) -> None:
        try:
            if self._wal is None:
                self._wal = os.open(self.path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
                # A new WAL's name must be durable too (SQLite syncs the
                # folder at a new journal's first sync).
                folder = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
            _datasync(self._wal)
        except OSError as exc:
            # After a failed fsync the kernel may have dropped the pages it
            # could not write: nothing in the file can be trusted any more.
            self.guard.fail(f"syncing {self.path}-wal failed: {exc}")
        # Checked after the sync, so that a file lost at any moment before
        # it is caught: the callers get 503, never a 2xx for a write into a
        # file that is gone.
        self.guard.check()
        self._refuse_if_lost()
        self.checkpoints.nudge()

    def release_files(self) -> None:
        if self._wal is not None:
            os.close(self._wal)
            self._wal = None
        self.shared_memory.close()

    def close(self, conn: sqlite3.Connection) -> None:
        conn.close()

    def connect(self, writes: bool = True) -> sqlite3.Connection:
        # A reader's connection is the same: its transactions are read-only.
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL: a commit writes the WAL without waiting for the disk, and
        # `sync` then fsyncs the WAL before any caller of the batch is
        # answered, so an acknowledged write survives a crash of the process
        # and of the machine, as with FULL, but the write lock is not held
        # across the disk flush. (NORMAL still syncs around checkpoints.)
        conn.execute("PRAGMA synchronous=NORMAL")
        # Checkpoints run on a thread of their own (see checkpoints.py), not
        # inside a commit on the event loop.
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("PRAGMA busy_timeout=10000")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def begin(
        self, conn: sqlite3.Connection, exclusive: bool, keys: list[int], changes: bool = True
    ) -> Callable[[], int]:
        # IMMEDIATE takes the write lock now, so a `fencepost project create`
        # in another process waits instead of failing mid-batch. Readers take a
        # WAL snapshot and never block the writer. The write lock covers every
        # key (one writer at a time), so `keys` need no lock of their own.
        self._refuse_if_lost()
        if self.shared_memory.unwritable():
            raise StoreUnavailable(
                f"{self.path}-shm may not be written (immutable or append-only): the store "
                f"refuses every request until it may, rather than crash on it."
            )
        if exclusive:
            # Among this file's server processes (see writer_turn.py); the
            # inline writer took it before it began, without waiting.
            self.turn.take()
            self._writer_conn = conn
        conn.execute("BEGIN IMMEDIATE" if exclusive else "BEGIN")
        return self.clock_ms

    def claim(self, conn: sqlite3.Connection, keys: list[int]) -> list[bool]:
        return [True] * len(keys)  # the batch holds the whole database already

    def execute(self, conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> Cursor:
        if sql == "ROLLBACK":  # a batch given up or replayed (batch.py): the turn passes on
            try:
                return conn.execute(sql, params)
            finally:
                self._end_turn(conn)
        return conn.execute(sql, params)

    def _end_turn(self, conn: sqlite3.Connection) -> None:
        # Only the writer's own transaction gives the turn: a reader's commit
        # must not give it away in the middle of the writer's batch.
        if conn is self._writer_conn:
            self._writer_conn = None
            self.turn.give()

    def try_turn(self) -> bool:
        return self.turn.try_take()

    def wait_turn(self) -> None:
        self.turn.take()

    def give_turn(self) -> None:
        self._writer_conn = None
        self.turn.give()

    def commit(self, conn: sqlite3.Connection, events: list[Any]) -> None:
        # Events are published in this process after the commit; wake-ups
        # also go to the other processes serving the file, read inside the
        # transaction so that one that registered before it is told.
        freed = [event for event in events if isinstance(event, Freed) and event.remote]
        others = self.peers.others(conn.execute) if freed else []
        try:
            conn.execute("COMMIT")
        finally:
            self._end_turn(conn)
        # The files are checked after the sync that follows (see `sync`).
        self.peers.send(others, freed)

    def _refuse_if_lost(self) -> None:
        lost = self.guard.lost
        if lost is not None:
            raise StoreUnavailable(f"The store file is lost ({lost}); restart the server.")

    def fatal(self, exc: BaseException) -> bool:
        if isinstance(exc, sqlite3.OperationalError):
            return True
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(exc, sqlite3.DatabaseError) and code is not None and (
            code & 0xFF in _UNUSABLE
        )

    def broken(self, conn: sqlite3.Connection) -> bool:
        return False

    def stale(self, conn: sqlite3.Connection) -> bool:
        return False  # one file, never another database behind the same name

    def pipeline(self, conn: sqlite3.Connection) -> ContextManager[None]:
        raise NotImplementedError  # `pipelines` is False: never asked


class SqliteStore(SqlStore):
    url_scheme = "sqlite"

    def __init__(
        self,
        path: str,
        clock_ms: Callable[[], int] | None = None,
        readers: int = DEFAULT_READERS,
    ) -> None:
        self.path = path
        # One clock for every expiry decision and stamped instant, immune to
        # wall-clock steps while the server runs (see SteadyClock); the
        # workers of one server share it (twins of their supervisor's).
        self._clock_ms = clock_ms or SteadyClock()
        self._peers = LocalPeers()
        self._engine = SqliteEngine(path, self._clock_ms, self._peers)
        self._told_drift_ms = 0
        super().__init__(self._engine, self._peers, readers)

    async def open(self) -> None:
        if not Path(self.path).parent.is_dir():  # a mistyped path must not start an empty store
            raise StoreUnavailable(f"Cannot open the SQLite store at {self.path}: "
                                   f"the folder {Path(self.path).parent} does not exist.")
        # What the files are is learnt afresh: a store closed and opened again
        # has new -wal and -shm files (the last close removes them).
        self._engine.guard = FileGuard(self.path)
        self._engine.release_files()
        self._engine.checkpoints = Checkpointer(self.path, self._engine.connect)
        try:
            await asyncio.to_thread(apply_migrations, f"sqlite:///{self.path}", "sqlite")
            self._peers.bind(asyncio.get_running_loop(), self._publish)
            await self._start()
        except sqlite3.Error as exc:
            self._peers.unbind()
            raise StoreUnavailable(f"Cannot open the SQLite store at {self.path}: {exc}.") from exc
        except BaseException:
            self._peers.unbind()
            raise

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self._engine.checkpoints.stop)
        self._peers.unbind()
        self._engine.turn.close()
        self._engine.release_files()

    async def now_ms(self) -> int:
        return self._clock_ms()

    def lost(self) -> str | None:
        return self._engine.guard.check()

    async def reap(self) -> int:
        self._notice_wall_clock_step()
        return await super().reap()

    def _notice_wall_clock_step(self) -> None:
        """Say once in the log when the wall clock stepped away from the
        server's clock: what the server stamps now differs from `date`."""
        if not isinstance(self._clock_ms, SteadyClock):
            return
        drift = self._clock_ms.drift_ms()
        if abs(drift - self._told_drift_ms) >= WALL_STEP_NOTICE_MS:
            self._told_drift_ms = drift
            _log.warning("the wall clock is %+.1f s from the server's clock; leases keep "
                         "their times; a restart adopts the wall clock", drift / 1000)

