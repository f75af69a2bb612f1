"""Copying an SQLite store's WAL back into the database file, off the event loop.

SQLite's own checkpoint runs inside the COMMIT that finds the WAL long
(1,000 pages): on the event loop, where SQLite's batches run, it would stop
every request for the page copies and two fsyncs (measured: 5 to 10 ms, a few
times a second under load). So the writer's connection turns that off and
this thread checkpoints instead, at most every CHECKPOINT_EVERY_S while
writes go on: it takes the turn at the write lock (writer_turn.py; a turn of
its own, so that it waits for the loop's writer like another process does),
then runs a RESTART checkpoint, which copies every frame and starts the WAL
again from its beginning, so it stays as short as what a few hundred
milliseconds write. Holding the turn matters: a checkpoint that let writes
go on beside it would never find every frame copied under a steady load, and
the WAL would grow without end. While it holds the turn, the loop's writer
waits for it on a thread and the loop goes on serving.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Callable

from fencepost.store.background import Background
from fencepost.store.file_guard import SharedMemoryGuard
from fencepost.store.writer_turn import WriterTurn

_log = logging.getLogger(__name__)

CHECKPOINT_EVERY_S = 0.5


class Checkpointer(Background):
    def __init__(self, path: str, connect: Callable[[], sqlite3.Connection]) -> None:
        super().__init__("fencepost-checkpoint")
        self._path = path
        self._connect = connect
        self._due = False
        self.restarts = 0  # checkpoints that copied everything and restarted the WAL

    def nudge(self) -> None:
        """Something was written: checkpoint soon (called after each sync)."""
        if self._due:
            # Already due: the thread's timed wait will come to it. Waking it
            # at every sync only made it count down again (a thread switch
            # per batch). Read without the lock: the thread clears `_due`
            # before it copies, so a write seen as due here is in that copy.
            return
        with self._ready:
            if not self._stopping:
                self._due = True
                self._wake()

    def _run(self) -> None:
        turn = WriterTurn(self._path)
        # A checkpoint writes the WAL index (-shm) through its mapping: made
        # unwritable, that write would kill the process with SIGBUS (see
        # file_guard.py). This thread's own guard (its own descriptor) asks
        # first, and the checkpoint waits for the file to be writable again.
        shared_memory = SharedMemoryGuard(self._path)
        conn: sqlite3.Connection | None = None
        last = 0.0
        try:
            while True:
                with self._ready:
                    while not self._stopping:
                        if not self._due:
                            self._ready.wait()
                            continue
                        left = CHECKPOINT_EVERY_S - (time.monotonic() - last)
                        if left <= 0:
                            break
                        self._ready.wait(left)
                    if self._stopping:
                        return
                    self._due = False
                last = time.monotonic()
                if shared_memory.unwritable():
                    with self._ready:
                        self._due = True  # copy it once the file may be written again
                    continue
                try:
                    conn = conn or self._connect()
                    self._checkpoint(conn, turn)
                except sqlite3.Error as exc:
                    # The writer meets a broken file itself (503); nothing to
                    # copy into one that is gone.
                    _log.warning("checkpoint of %s failed: %s", self._path, exc)
        finally:
            turn.close()
            shared_memory.close()
            if conn is not None:
                conn.close()

    def _checkpoint(self, conn: sqlite3.Connection, turn: WriterTurn) -> None:
        turn.take()
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
        finally:
            turn.give()
        if not busy:
            self.restarts += 1
