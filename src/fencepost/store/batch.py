"""Group commit: one writer thread per store, many operations per transaction.

Requests submit small functions; the writer thread runs every function that is
waiting in one transaction and answers them all only after the commit. If one
operation fails, the batch is replayed with a savepoint around each operation,
so one failure does not undo the others. One commit (and one fsync) then
serves a whole batch, which is what keeps a durable store fast under load (the
idea behind PostgreSQL's and etcd's group commit).

The database specifics live in an Engine: how to connect, how a batch
transaction begins (SQLite: BEGIN IMMEDIATE; PostgreSQL: BEGIN plus one
advisory lock that serialises the batches of every replica), which clock
judges expiry, and how other replicas hear about freed locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from types import GeneratorType
from typing import Any, Callable, ContextManager, Generator, Generic, Protocol, TypeVar, cast

from fencepost.errors import StoreUnavailable
from fencepost.events import current_origin

_log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_BATCH = 512


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Engine(Protocol):
    """What the batch writer needs from a database."""

    # The driver's errors; those `fatal` says so fail the whole batch (503),
    # others (a constraint, a bad statement) fail only their operation.
    errors: tuple[type[BaseException], ...]
    # Whether a batch's operations are stepped together, their first
    # statements sent in one `pipeline` (see BatchWriter._in_steps).
    pipelines: bool

    def fatal(self, exc: BaseException) -> bool: ...

    def connect(self) -> Any: ...

    def begin(self, conn: Any, exclusive: bool) -> Callable[[], int]:
        """Start the batch transaction (`exclusive`: serialised with every other
        writer; otherwise a read-only snapshot); return the clock (epoch ms) for
        its operations."""

    def execute(self, conn: Any, sql: str, params: tuple[Any, ...]) -> Cursor: ...

    def commit(self, conn: Any, events: list[Any]) -> None:
        """Commit the batch, announcing `events` to other replicas with it."""

    def broken(self, conn: Any) -> bool:
        """True when the connection cannot be used again."""

    def pipeline(self, conn: Any) -> ContextManager[Any]:
        """A block whose statements are sent without waiting for their answers;
        an answer is waited for when it is read, and all of them at the end."""


@dataclass(slots=True)
class Batch:
    """What the operations of one batch attempt share: values read once per
    batch, and `finishers` (by name, each registered once) that write what the
    operations gathered, after the last operation and before the commit.

    A finisher's writes fall outside the operations' savepoints, so under
    `isolated` (replay, one savepoint per operation) nothing an operation may
    later have to undo can be left for a finisher."""

    isolated: bool = True
    shared: dict[str, Any] = field(default_factory=dict)
    finishers: dict[str, Callable[[Tx], None]] = field(default_factory=dict)


@dataclass(slots=True)
class Tx:
    """What one operation sees: a way to run SQL, the store's clock reading, and
    events to publish once the batch has committed. SQL uses `?` placeholders."""

    engine: Engine
    conn: Any
    now_ms: int
    events: list[Any] = field(default_factory=list)
    batch: Batch = field(default_factory=Batch)
    # Who asked (fencepost.events.Origin), for the events the operation reports.
    origin: Any = None

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Cursor:
        return self.engine.execute(self.conn, sql, params)


@dataclass(slots=True)
class _Job(Generic[T]):
    fn: Callable[[Tx], Any]
    future: asyncio.Future[T]
    loop: asyncio.AbstractEventLoop
    steps: bool = False  # fn returns a step operation (see _in_steps)
    origin: Any = None  # the submitting request's (see Tx.origin)


_STOP = object()
# After a failed connection attempt, batches fail at once for this long instead
# of each waiting for a connect timeout: callers get a fast 503.
RECONNECT_BACKOFF_S = 0.5


class BatchWriter:
    def __init__(
        self,
        engine: Engine,
        publish: Callable[[list[Any]], None],
        name: str = "writer",
        exclusive: bool = True,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self._engine = engine
        self._on_failure = on_failure
        self._exclusive = exclusive
        self._publish = publish
        self._name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self._next_connect = 0.0
        # Told each batch's size, its seconds from begin to commit, and whether it
        # failed (the metrics); called on the writer thread.
        self.observer: Callable[[int, float, bool], None] | None = None

    def start(self) -> None:
        self._conn = self._engine.connect()  # fail here, in the caller, if unreachable
        self._thread = threading.Thread(
            target=self._run, name=f"fencepost-{self._name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout=10)
            self._thread = None

    async def run(self, fn: Callable[[Tx], T]) -> T:
        """The result of `fn`, once its batch has committed."""
        return cast(T, await self._submit(fn, steps=False))

    async def run_steps(self, fn: Callable[[Tx], Generator[None, None, T]]) -> T:
        """The result of the step operation `fn` returns (see `_in_steps`),
        once its batch has committed."""
        return cast(T, await self._submit(fn, steps=True))

    async def _submit(self, fn: Callable[[Tx], Any], steps: bool) -> Any:
        if self._thread is None:
            raise StoreUnavailable("The store is closed.")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.put(_Job(fn, future, loop, steps, current_origin()))
        return await future

    def _run(self) -> None:
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
                self._run_batch(batch)
                if stopping:
                    return
        finally:
            self._close()

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
            self._conn = None

    def _connection(self) -> Any:
        if self._conn is None:
            if time.monotonic() < self._next_connect:
                raise StoreUnavailable("The store is unreachable; retrying shortly.")
            try:
                self._conn = self._engine.connect()
            except self._engine.errors as exc:
                self._next_connect = time.monotonic() + RECONNECT_BACKOFF_S
                raise StoreUnavailable(f"The store is unreachable: {exc}.") from exc
        return self._conn

    def _run_batch(self, batch: list[_Job[Any]]) -> None:
        started = time.perf_counter()
        failed = False
        try:
            conn = self._connection()
            # Optimistic first: no savepoints (two statements fewer per
            # operation). Should any operation raise, the batch is rolled back
            # and replayed with a savepoint around each, so that one refusal
            # undoes only its own writes.
            done = self._attempt(conn, batch, isolate=False)
            if done is None:
                self._engine.execute(conn, "ROLLBACK", ())
                done = self._attempt(conn, batch, isolate=True)
            assert done is not None
            outcomes, events = done
            self._engine.commit(conn, events if self._exclusive else [])
        except Exception as exc:  # noqa: BLE001 - the writer thread must survive anything
            # Nothing of this batch is durable: fail every caller in it.
            if not isinstance(exc, (StoreUnavailable, *self._engine.errors)):
                _log.exception("a store batch failed unexpectedly")
            self._abandon()
            failure = exc if isinstance(exc, StoreUnavailable) else StoreUnavailable(
                f"The store failed: {exc}."
            )
            outcomes = [(job, None, failure) for job in batch]
            events = []
            failed = True
            if self._on_failure is not None:
                self._on_failure(failure.message)
        if self.observer is not None:
            self.observer(len(batch), time.perf_counter() - started, failed)
        self._deliver(outcomes, events)

    def _attempt(
        self, conn: Any, batch: list[_Job[Any]], isolate: bool
    ) -> tuple[list[tuple[_Job[Any], Any, BaseException | None]], list[Any]] | None:
        """Run the batch's operations in one open transaction. Without `isolate`,
        give up (None) at the first operation that raises."""
        outcomes: list[tuple[_Job[Any], Any, BaseException | None]] = []
        events: list[Any] = []
        clock = self._engine.begin(conn, self._exclusive)
        shared = Batch(isolated=isolate)
        if not isolate:
            try:
                if self._engine.pipelines:
                    done = self._in_steps(conn, batch, clock, shared)
                else:
                    done = self._one_by_one(batch, conn, clock, shared)
            except Exception as exc:  # noqa: BLE001 - replayed one by one, isolated
                if isinstance(exc, self._engine.errors) and self._engine.fatal(exc):
                    raise  # the connection or transaction failed: the whole batch fails
                return None
            for job, result, tx in done:
                outcomes.append((job, result, None))
                events.extend(tx.events)
        for job in batch if isolate else ():
            tx = Tx(self._engine, conn, clock(), [], shared, job.origin)
            self._engine.execute(conn, "SAVEPOINT op", ())
            try:
                result = _to_the_end(job.fn(tx))
            except Exception as exc:  # noqa: BLE001 - delivered to the caller
                if isinstance(exc, self._engine.errors) and self._engine.fatal(exc):
                    raise
                self._engine.execute(conn, "ROLLBACK TO SAVEPOINT op", ())
                self._engine.execute(conn, "RELEASE SAVEPOINT op", ())
                outcomes.append((job, None, exc))
            else:
                self._engine.execute(conn, "RELEASE SAVEPOINT op", ())
                outcomes.append((job, result, None))
                events.extend(tx.events)
        try:
            for finish in shared.finishers.values():
                finish(Tx(self._engine, conn, clock(), [], shared))
        except self._engine.errors as exc:
            if isolate or self._engine.fatal(exc):
                raise
            return None  # the replay writes as it goes, in each operation's savepoint
        return outcomes, events

    def _one_by_one(
        self, batch: list[_Job[Any]], conn: Any, clock: Callable[[], int], shared: Batch
    ) -> list[tuple[_Job[Any], Any, Tx]]:
        """Run each operation whole, in batch order."""
        done = []
        for job in batch:
            tx = Tx(self._engine, conn, clock(), [], shared, job.origin)
            done.append((job, _to_the_end(job.fn(tx)), tx))
        return done

    def _in_steps(
        self, conn: Any, batch: list[_Job[Any]], clock: Callable[[], int], shared: Batch
    ) -> list[tuple[_Job[Any], Any, Tx]]:
        """Run the batch's operations, stepping generator operations together.

        An operation may be a generator: it sends the statement of its common
        case and yields; once every operation has sent its first statement
        (pipelined: one round trip for all, not one each), each is resumed in
        batch order to read its answer, and either returns or yields again
        when it needs more statements; those operations then finish one at a
        time, in batch order. A first step changes nothing unless it is the
        whole operation (a guarded write that takes effect, or matches
        nothing), so the batch equals a serial run: the operations finished
        by their first step, then the others. Plain functions run whole, in
        their turn, outside the pipeline (each of their statements waits for
        its answer anyway). Raises what any operation raises."""
        steps: list[tuple[_Job[Any], Tx, Any]] = []  # (job, tx, generator or result)
        with contextlib.ExitStack() as pipeline:
            piped = False
            for job in batch:
                tx = Tx(self._engine, conn, clock(), [], shared, job.origin)
                if job.steps != piped:  # open or close the pipeline
                    if job.steps:
                        pipeline.enter_context(self._engine.pipeline(conn))
                    else:
                        pipeline.close()
                    piped = job.steps
                produced = job.fn(tx)
                if job.steps:
                    try:
                        next(produced)
                    except StopIteration as stop:
                        produced = _Finished(stop.value)
                else:
                    produced = _Finished(produced)
                steps.append((job, tx, produced))
        more: list[int] = []
        for index, (job, tx, produced) in enumerate(steps):
            if isinstance(produced, _Finished):
                continue
            try:
                next(produced)
                more.append(index)  # it needs more statements
            except StopIteration as stop:
                steps[index] = (job, tx, _Finished(stop.value))
        for index in more:
            job, tx, produced = steps[index]
            steps[index] = (job, tx, _Finished(_to_the_end(produced)))
        return [(job, produced.value, tx) for job, tx, produced in steps]

    def _abandon(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            self._engine.execute(conn, "ROLLBACK", ())
        except Exception:  # noqa: BLE001 - the connection may be gone
            pass
        if self._engine.broken(conn):
            self._close()

    def _deliver(
        self, outcomes: list[tuple[_Job[Any], Any, BaseException | None]], events: list[Any]
    ) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job[Any], Any, Any]]] = {}
        for outcome in outcomes:
            by_loop.setdefault(outcome[0].loop, []).append(outcome)
        for loop, done in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, done, events, self._publish)
            except RuntimeError:
                pass  # that loop is closed; nobody is waiting any more
            events = []  # publish each event once, on the first loop


@dataclass(slots=True)
class _Finished:
    value: Any


def _to_the_end(produced: Any) -> Any:
    """The result of an operation: a plain function's, or a generator run to
    its return."""
    if not isinstance(produced, GeneratorType):
        return produced
    try:
        while True:
            next(produced)
    except StopIteration as stop:
        return stop.value


def _settle(
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
