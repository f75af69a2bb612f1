"""Group commit: one writer thread per store, many operations per transaction.

Requests submit operations; the writer thread runs every operation that is
waiting in one transaction and answers them all only after the commit. One
commit (and one fsync) then serves a whole batch, which is what keeps a durable
store fast under load (the idea behind PostgreSQL's and etcd's group commit).

Operations come in two kinds:

- a plain operation, `fn(tx) -> result`, submitted with `BatchWriter.run`;
- a step operation, `fn(tx) -> Step`, submitted with `BatchWriter.run_steps`.
  Calling `fn` sends the statement of the common case (and reads nothing);
  `Step.answer` then reads its answer and returns the result, or `UNDECIDED`
  when the common case did not apply; `Step.otherwise` then runs the general
  case. A first statement changes nothing unless it is the whole operation (a
  guarded write that takes effect, or matches nothing).

A batch runs in one of three ways (`BatchWriter._run_in_transaction`):

- in turn (SQLite, whose statements are in-process calls): each operation runs
  whole, in batch order;
- in steps (PostgreSQL): every step operation sends its first statement in one
  pipeline (one round trip for the batch, not one each); then each reads its
  answer, in batch order; then the undecided ones run their general case, in
  batch order. Plain operations run whole in their turn, outside the pipeline.
  The batch equals a serial run: the operations decided by their first
  statement, then the others;
- isolated: when an operation raised in either of the above, the batch is
  rolled back and replayed in turn with a savepoint around each operation, so
  that one refusal undoes only its own writes.

What the operations of one batch share (the fencing counter, gathered records)
is a `PerBatch` state of the module that owns it; its `finish` writes what was
gathered, after the last operation and before the commit.

The database specifics live in an Engine: how to connect, how a batch
transaction begins (SQLite: BEGIN IMMEDIATE; PostgreSQL: BEGIN plus one
advisory lock that serialises the batches of every replica), which clock
judges expiry, and how other replicas hear about freed locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Generic, Protocol, TypeVar, cast

from fencepost.errors import StoreUnavailable
from fencepost.events import current_origin

_log = logging.getLogger(__name__)

T = TypeVar("T")
S = TypeVar("S")
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
    # Whether a batch runs in steps, the first statements of its step
    # operations sent in one `pipeline` (see the module docstring).
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


class Undecided(enum.Enum):
    """What `Step.answer` returns when the first statement did not decide."""

    UNDECIDED = "undecided"


UNDECIDED = Undecided.UNDECIDED


@dataclass(slots=True)
class Step(Generic[T]):
    """A step operation after its first statement was sent (see the module
    docstring): `answer` reads that statement's answer and returns the result,
    or UNDECIDED (having undone anything in memory the first statement took);
    `otherwise` then runs the general case."""

    answer: Callable[[], T | Undecided]
    otherwise: Callable[[], T]

    def to_the_end(self) -> T:
        """The result, the general case run at once if it is needed."""
        result = self.answer()
        if result is UNDECIDED:
            return self.otherwise()
        return result


class PerBatch(Generic[S]):
    """A kind of state the operations of one batch share, owned by the module
    that declares it (one module-level instance per kind): `start` puts it in
    the batch, `of` reads it back (None until started), and `finish` writes
    what the batch gathered, once, after the last operation and before the
    commit.

    A finish's writes fall outside the operations' savepoints, so while the
    batch is `isolated` (replay, one savepoint per operation) nothing an
    operation may later have to undo can be left for a finish."""

    __slots__ = ("name", "finish")

    def __init__(self, name: str, finish: Callable[[Tx, S], None]) -> None:
        self.name = name  # for reading a traceback
        self.finish = finish

    def of(self, tx: Tx) -> S | None:
        return cast("S | None", tx.batch.states.get(self))

    def start(self, tx: Tx, state: S) -> S:
        tx.batch.states[self] = state
        return state


@dataclass(slots=True)
class Batch:
    """One run of a batch's operations in a transaction: whether each
    operation has its own savepoint, and the PerBatch states they started."""

    isolated: bool = True
    states: dict[PerBatch[Any], Any] = field(default_factory=dict)

    def finish(self, tx: Tx) -> None:
        for kind, state in self.states.items():
            kind.finish(tx, state)


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
    fn: Callable[[Tx], Any]  # a plain operation, or a step operation if `steps`
    future: asyncio.Future[T]
    loop: asyncio.AbstractEventLoop
    steps: bool = False
    origin: Any = None  # the submitting request's (see Tx.origin)

    def run_whole(self, tx: Tx) -> Any:
        produced = self.fn(tx)
        return produced.to_the_end() if self.steps else produced


# A job, its result (or None) and its error (or None).
_Outcome = tuple[_Job[Any], Any, BaseException | None]
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
        """The result of the plain operation `fn`, once its batch has committed."""
        return cast(T, await self._submit(fn, steps=False))

    async def run_steps(self, fn: Callable[[Tx], Step[T]]) -> T:
        """The result of the step operation `fn`, once its batch has committed."""
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
            # and replayed isolated.
            done = self._run_in_transaction(conn, batch, isolated=False)
            if done is None:
                self._engine.execute(conn, "ROLLBACK", ())
                done = self._run_in_transaction(conn, batch, isolated=True)
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

    def _run_in_transaction(
        self, conn: Any, batch: list[_Job[Any]], isolated: bool
    ) -> tuple[list[_Outcome], list[Any]] | None:
        """Begin the batch transaction and run the batch's operations in it, up
        to (not including) the commit. Unless `isolated`, give up (None, the
        transaction to be rolled back) at the first operation that raises."""
        clock = self._engine.begin(conn, self._exclusive)
        shared = Batch(isolated=isolated)
        if isolated:
            outcomes, events = self._isolated(conn, batch, clock, shared)
        else:
            try:
                if self._engine.pipelines:
                    done = self._in_steps(conn, batch, clock, shared)
                else:
                    done = self._in_turn(conn, batch, clock, shared)
            except Exception as exc:  # noqa: BLE001 - replayed isolated
                if isinstance(exc, self._engine.errors) and self._engine.fatal(exc):
                    raise  # the connection or transaction failed: the whole batch fails
                return None
            outcomes = []
            events = []
            for job, result, tx in done:
                outcomes.append((job, result, None))
                events.extend(tx.events)
        try:
            shared.finish(Tx(self._engine, conn, clock(), [], shared))
        except self._engine.errors as exc:
            if isolated or self._engine.fatal(exc):
                raise
            return None  # the replay writes as it goes, in each operation's savepoint
        return outcomes, events

    def _in_turn(
        self, conn: Any, batch: list[_Job[Any]], clock: Callable[[], int], shared: Batch
    ) -> list[tuple[_Job[Any], Any, Tx]]:
        """Run each operation whole, in batch order; raise what any raises."""
        done = []
        for job in batch:
            tx = Tx(self._engine, conn, clock(), [], shared, job.origin)
            done.append((job, job.run_whole(tx), tx))
        return done

    def _in_steps(
        self, conn: Any, batch: list[_Job[Any]], clock: Callable[[], int], shared: Batch
    ) -> list[tuple[_Job[Any], Any, Tx]]:
        """Send every step operation's first statement in a pipeline (plain
        operations run whole in their turn, outside it), then read each answer
        in batch order, then run each undecided one's general case in batch
        order; raise what any operation raises."""
        # (job, tx, its Step while undecided, else its result)
        runs: list[tuple[_Job[Any], Tx, Any]] = []
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
                runs.append((job, tx, job.fn(tx)))
        undecided: list[int] = []
        for index, (job, tx, produced) in enumerate(runs):
            if job.steps:
                result = produced.answer()
                if result is UNDECIDED:
                    undecided.append(index)
                else:
                    runs[index] = (job, tx, result)
        for index in undecided:
            job, tx, step = runs[index]
            runs[index] = (job, tx, step.otherwise())
        return [(job, result, tx) for job, tx, result in runs]

    def _isolated(
        self, conn: Any, batch: list[_Job[Any]], clock: Callable[[], int], shared: Batch
    ) -> tuple[list[_Outcome], list[Any]]:
        """Run each operation whole, in batch order, in a savepoint of its own:
        one that raises has its writes undone and its error delivered, and
        the others go on."""
        outcomes: list[_Outcome] = []
        events: list[Any] = []
        for job in batch:
            tx = Tx(self._engine, conn, clock(), [], shared, job.origin)
            self._engine.execute(conn, "SAVEPOINT op", ())
            try:
                result = job.run_whole(tx)
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
        return outcomes, events

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

    def _deliver(self, outcomes: list[_Outcome], events: list[Any]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        for outcome in outcomes:
            by_loop.setdefault(outcome[0].loop, []).append(outcome)
        for loop, done in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, done, events, self._publish)
            except RuntimeError:
                pass  # that loop is closed; nobody is waiting any more
            events = []  # publish each event once, on the first loop


def _settle(
    done: list[_Outcome],
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
