"""Group commit for SQLite: one writer thread, many operations per transaction.

Requests submit small functions; the writer thread runs every function that is
waiting in one `BEGIN IMMEDIATE ... COMMIT`, each inside its own savepoint so
one failing operation does not undo the others, and answers them all only after
the commit. One fsync then serves a whole batch, which is what keeps a durable
store fast under load (the same idea as PostgreSQL's and etcd's group commit).
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

from fencepost.errors import StoreUnavailable

T = TypeVar("T")
MAX_BATCH = 512


@dataclass(slots=True)
class Tx:
    """What one operation sees: the connection, the store's clock reading, and
    events to publish once the batch has committed."""

    conn: sqlite3.Connection
    now_ms: int
    events: list[Any] = field(default_factory=list)


@dataclass(slots=True)
class _Job(Generic[T]):
    fn: Callable[[Tx], T]
    future: asyncio.Future[T]
    loop: asyncio.AbstractEventLoop


_STOP = object()


class BatchWriter:
    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        clock_ms: Callable[[], int],
        publish: Callable[[list[Any]], None],
    ) -> None:
        self._connect = connect
        self._clock_ms = clock_ms
        self._publish = publish
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        conn = self._connect()  # fail here, in the caller, if the file cannot be opened
        self._thread = threading.Thread(
            target=self._run, args=(conn,), name="fencepost-sqlite-writer", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout=10)
            self._thread = None

    async def run(self, fn: Callable[[Tx], T]) -> T:
        if self._thread is None:
            raise StoreUnavailable("The store is closed.")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Job(fn, future, loop))
        return await future

    def _run(self, conn: sqlite3.Connection) -> None:
        try:
            while True:
                first = self._queue.get()
                if first is _STOP:
                    return
                batch = [first]
                stopping = False
                while len(batch) < MAX_BATCH:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stopping = True
                        break
                    batch.append(item)
                self._run_batch(conn, batch)
                if stopping:
                    return
        finally:
            conn.close()

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Job[Any]]) -> None:
        outcomes: list[tuple[_Job[Any], Any, BaseException | None]] = []
        events: list[Any] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for job in batch:
                tx = Tx(conn, self._clock_ms())
                conn.execute("SAVEPOINT op")
                try:
                    result = job.fn(tx)
                except Exception as exc:  # noqa: BLE001 - delivered to the caller
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    outcomes.append((job, None, exc))
                else:
                    conn.execute("RELEASE op")
                    outcomes.append((job, result, None))
                    events.extend(tx.events)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # Nothing of this batch is durable: fail every caller in it.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            failure = StoreUnavailable(f"The store failed to commit: {exc}.")
            outcomes = [(job, None, failure) for job in batch]
            events = []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job[Any], Any, Any]]] = {}
        for outcome in outcomes:
            by_loop.setdefault(outcome[0].loop, []).append(outcome)
        for loop, done in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, done, events, self._publish)
            except RuntimeError:
                pass  # that loop is closed; nobody is waiting any more
            events = []  # publish each event once, on the first loop


def _deliver(
    done: list[tuple[_Job[Any], Any, BaseException | None]],
    events: list[Any],
    publish: Callable[[list[Any]], None],
) -> None:
    for job, result, exc in done:
        if job.future.done():
            continue
        if exc is None:
            job.future.set_result(result)
        else:
            job.future.set_exception(exc)
    if events:
        publish(events)
