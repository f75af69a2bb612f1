"""SQLite's writer runs its batches on the event loop and commits without
waiting for the disk; its flusher thread then fsyncs the WAL and only then
answers (store/inline.py, Flusher). These tests hold that order: no answer,
write or read, before the sync that covers it; a sync that fails is a 503 and
a lost store, never a 2xx; and another process's turn at the write lock is
waited for off the loop, which goes on serving meanwhile."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
import threading
from pathlib import Path
from typing import AsyncIterator

import pytest

from fencepost.core.leases import Granted
from fencepost.errors import StoreUnavailable
from fencepost.store import sqlite as sqlite_module
from fencepost.store.sqlite import SqliteStore
from fencepost.store.writer_turn import WriterTurn

from .conftest import FakeClock
from .store_support import GUARD_S, P, grant, req, token


@pytest.fixture
async def store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[SqliteStore]:
    opened = SqliteStore(str(tmp_path / "durable.db"), clock_ms=clock)
    await opened.open()
    yield opened
    await opened.close()


class SyncGate:
    """Holds every sync of the store's writer until opened, and says when one
    has begun (the batches it covers have committed by then)."""

    def __init__(self, store: SqliteStore) -> None:
        self._opened = threading.Event()
        self._began = threading.Event()
        flusher = store._writer._flusher
        assert flusher is not None
        inner = flusher._sync

        def sync() -> None:
            self._began.set()
            assert self._opened.wait(GUARD_S), "the gate was never opened"
            inner()

        flusher._sync = sync

    async def began(self) -> None:
        assert await asyncio.to_thread(self._began.wait, GUARD_S), "no sync began"

    def open(self) -> None:
        self._opened.set()


def lease_tokens(path: str, key: str) -> list[str]:
    """The lock tokens of `key`'s leases, as another connection sees them."""
    with sqlite3.connect(path) as conn:
        return [tok for (tok,) in conn.execute(
            "SELECT lock_token FROM locks WHERE key = ?", (key,))]


async def test_a_grant_is_committed_then_synced_then_answered(store):
    gate = SyncGate(store)
    holder = token()
    acquire = asyncio.ensure_future(store.acquire_lock(P, "k", req(holder), wait_alive_ms=None))
    try:
        await gate.began()
        # Committed (another connection reads it) while the sync is held...
        assert lease_tokens(store.path, "k") == [holder]
        await asyncio.sleep(0.05)  # ...and the loop goes on running meanwhile,
        assert not acquire.done()  # but nobody is told before the sync returns.
    finally:
        gate.open()
    result = await acquire
    assert isinstance(result.outcome, Granted)


async def test_a_read_waits_for_the_sync_of_what_it_saw(store):
    holder = token()
    await grant(store, "k", holder)
    gate = SyncGate(store)
    release = asyncio.ensure_future(store.release_lock(P, "k", holder))
    try:
        await gate.began()
        assert lease_tokens(store.path, "k") == []  # the release committed
        view = asyncio.ensure_future(store.get_lock(P, "k"))
        await asyncio.sleep(0.05)
        # The reader saw the release, which a power loss could still undo now.
        assert not view.done() and not release.done()
    finally:
        gate.open()
    assert await release is True
    assert (await view).lease is None


async def test_a_sync_the_disk_refuses_is_a_503_and_the_store_is_lost(store, monkeypatch):
    await grant(store, "before")

    def refuse(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(sqlite_module, "_datasync", refuse)
    with pytest.raises(StoreUnavailable):
        await grant(store, "k")
    # After a failed fsync the kernel may have dropped what it could not
    # write: nothing is acknowledged any more, the file is not trusted.
    monkeypatch.undo()
    assert store.lost() is not None and "failed" in store.lost()
    with pytest.raises(StoreUnavailable):
        await grant(store, "after")


async def test_another_process_at_the_write_lock_is_waited_for_off_the_loop(store):
    other = WriterTurn(store.path)  # what another worker process holds while it writes
    other.take()
    try:
        acquire = asyncio.ensure_future(store.acquire_lock(P, "k", req(), wait_alive_ms=None))
        # A writer that waited on the loop's thread would stop it here for
        # good (the turn is given only below): the test would hang instead.
        await asyncio.sleep(0.1)
        assert not acquire.done()
        assert lease_tokens(store.path, "k") == []  # nothing was written out of turn
    finally:
        other.give()
        other.close()
    result = await asyncio.wait_for(acquire, GUARD_S)
    assert isinstance(result.outcome, Granted)


def checkpoint_sequence(path: str) -> int:
    """The WAL header's checkpoint sequence: one more each time the WAL was
    copied back whole and started again from its beginning."""
    with open(path + "-wal", "rb") as wal:
        header = wal.read(32)
    return int.from_bytes(header[12:16], "big") if len(header) == 32 else 0


async def test_the_wal_is_copied_back_and_restarted_while_writes_go_on(store):
    # The writer's connection never checkpoints in a commit on the loop; the
    # checkpoint thread must, or the WAL grows for as long as writes go on.
    await grant(store, "first")
    began = checkpoint_sequence(store.path)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GUARD_S
    written = 0
    while checkpoint_sequence(store.path) < began + 2:
        assert loop.time() < deadline, f"the WAL was never restarted in {written} writes"
        holder = token()
        await grant(store, f"k{written}", holder)
        await store.release_lock(P, f"k{written}", holder)
        written += 1
    assert store._engine.checkpoints.restarts >= 2
