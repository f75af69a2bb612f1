"""Group commit: one writer per store, many operations per transaction.

Requests submit operations; the writer runs every operation that is waiting
in one transaction and answers them all only after the commit. One commit
(and one fsync) then serves a whole batch, which is what keeps a durable
store fast under load (the idea behind PostgreSQL's and etcd's group commit).

Where the writer runs depends on the engine:

- on the loop, awaited (PostgreSQL, an engine `on_loop`): each statement is
  a round trip, so each connection runs one batch at a time as a task on the
  event loop, in a greenlet that hands every round trip to the loop to await
  (store/on_loop.py) while the loop serves;
- on writer threads, one per connection: a reader of an inline engine, so
  that a read never waits behind a write batch on the loop;
- inline (SQLite, an `InlineEngine`): statements are calls into this
  process, so a batch runs on the event loop itself, taking everything
  submitted until the loop got to it. A writer thread would only contend
  with the loop for the interpreter lock inside its transaction (measured:
  the write lock was held for the whole run, half of it waiting for the
  interpreter lock). The commit writes the WAL without waiting for the disk;
  the flusher thread (store/inline.py) then fsyncs it and only then answers the batch, so
  nobody is told of a write a power loss could undo, and the write lock is
  never held across a disk flush. The turn at the write lock among the
  processes sharing the file is waited for on a thread too.

Operations come in two kinds:

- a plain operation, `fn(tx) -> result`, submitted with `BatchWriter.run`;
- a step operation, `fn(tx) -> Step`, submitted with `BatchWriter.run_steps`.
  Calling `fn` sends the statement of the common case (and reads nothing);
  `Step.answer` then reads its answer and returns the result, or `UNDECIDED`
  when the common case did not apply; `Step.otherwise` then runs the general
  case. A first statement changes nothing unless it is the whole operation (a
  guarded write that takes effect, or matches nothing). `fn` may send a few
  statements (a guarded write, then a read of what it left; a guarded count,
  then the delete it counted), each read only in `answer`: on PostgreSQL they
  always go out in a pipeline, where each statement has a cursor of its own.
  `answer` may write too, to finish what the first statements decided (such
  writes run after the pipeline: a round trip, for the rarer cases).

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
  that one failure undoes only its own writes. A replay does the batch's work
  twice, for every caller in it (the observer is told of each).

An ordinary refusal (a renewal of a lease that is gone, an unknown slot, a
force release by a key that may not) is decided before its operation writes
anything, so there is nothing of it to undo: the operation returns it as a
value, `Refused(error)` (`refused_before_writing` around the decision turns
the error into one), the batch goes on and commits, and the writer raises the
error to that caller alone after the commit. A step operation's general case
may return one too, its first statement having changed nothing when it is
undecided. Only a failure that may follow a write of its own operation is
raised inside the batch. A refused operation's events are dropped, as a
replay would drop them.

What the operations of one batch share (the fencing counter, gathered records)
is a `PerBatch` state of the module that owns it; its `finish` writes what was
gathered, after the last operation and before the commit.

Every operation declares the keys it touches: each lock, pool or API key whose
state it reads to decide and then writes, as a `Key` (kind, project, name).
This is the rule that lets batches run concurrently where the database can:

- a batch transaction begins by locking the keys of all its operations, in one
  fixed (sorted) order, so batches that share no key commit concurrently and
  batches that share one run one after the other, never deadlocked (SQLite's
  BEGIN IMMEDIATE locks everything, which satisfies the rule trivially);
- a writer has several connections (`BatchWriter(connections=...)`), each
  running one batch at a time; a job whose keys a batch in flight holds waits
  for that batch (jobs on one key keep their submission order), while jobs on
  other keys go on through the other connections, so one slow key does not
  stall the rest;
- an operation that only learns which keys it touches as it reads (the
  reaper) declares none and `Tx.claim`s each key before it writes it: a claim
  never waits, and a key held elsewhere is left for a later pass.

The database specifics live in an Engine: how to connect, how a batch
transaction begins (SQLite: BEGIN IMMEDIATE; PostgreSQL: BEGIN plus one
transaction advisory lock per key), how tokens are drawn, which clock judges
expiry, and how other replicas hear about freed locks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    ContextManager,
    Generic,
    Iterable,
    NamedTuple,
    Protocol,
    TypeVar,
    cast,
)

from fencepost.errors import StoreNotReplicated, StoreUnavailable
from fencepost.events import current_origin
from fencepost.store.inline import Flusher, TurnWaiter
from fencepost.store.on_loop import Unwatched, run_on_loop, wait_for
from fencepost.store.together import Gathering, Together
from fencepost.store.writer_lines import MAX_BATCH, JobLines

_log = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
S = TypeVar("S")


# Test hooks (fault injection) are honoured only when this is set to 1.
TEST_HOOKS_VARIABLE = "FENCEPOST_TEST_HOOKS"


class Key(NamedTuple):
    """One thing whose state an operation reads to decide and then writes: a
    lock, a pool, an API key's quota... (`kind` says which). Operations that
    touch the same Key are serialised; others may commit concurrently. (A
    tuple: hashed and compared in C, as the writer's lines do for every job.)"""

    kind: str
    project: str
    name: str

    @property
    def number(self) -> int:
        """A signed 64-bit number naming the key (a PostgreSQL advisory lock);
        the same on every replica. Two keys sharing a number only serialise
        each other, which is harmless."""
        digest = hashlib.blake2b(
            f"{self.kind}\0{self.project}\0{self.name}".encode(), digest_size=8
        ).digest()
        return int.from_bytes(digest, "big", signed=True)


Keys = tuple[Key, ...]
NO_KEYS: Keys = ()


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
    # The database sequence fencing tokens are drawn from, each drawn after the
    # lock's key is locked (store/sql/fencing.py); None: the counter row, for
    # a store whose batches are serialised whole.
    token_sequence: str | None
    # Likewise the sequence tickets in a lock's line are drawn from, each
    # drawn while the keys of every line joined are held (sql/locks.py
    # join_line); None: the counter row.
    ticket_sequence: str | None

    # Whether batches run on the submitting event loop's thread (an
    # in-process database, whose statements are calls, not round trips): such
    # an engine is an InlineEngine.
    inline: bool
    # Whether batches run on the submitting event loop's thread with their
    # round trips awaited there (store/on_loop.py): every method that talks to
    # the database may then be called only inside `run_on_loop`.
    on_loop: bool
    # Whether `begin` and `claim` lock the batch's keys one by one (their
    # Key.number); False: a write transaction holds the whole database, and
    # the numbers are not worth computing.
    locks_keys: bool

    def fatal(self, exc: BaseException) -> bool: ...

    def connect(self, writes: bool = True) -> Any:
        """A connection, for a writer's batches or (`writes` False) a reader's."""

    def close(self, conn: Any) -> None: ...

    def begin(
        self, conn: Any, exclusive: bool, keys: list[int], changes: bool = True
    ) -> Callable[[], int]:
        """Start the batch transaction (`exclusive`: a write transaction that
        holds the `keys` (Key.number, sorted) until it ends, serialised with
        every other writer holding any of them; otherwise a read-only
        snapshot); return the clock (epoch ms) for its operations. `changes`:
        some operation changes callers' state, not only the store's upkeep
        (an engine told to change nothing unreplicated refuses it then)."""

    def claim(self, conn: Any, keys: list[int]) -> list[bool]:
        """Try to take each of `keys` for the rest of the transaction, without
        waiting: which ones it now holds."""

    def execute(self, conn: Any, sql: str, params: tuple[Any, ...]) -> Cursor: ...

    def commit(self, conn: Any, events: list[Any]) -> None:
        """Commit the batch, announcing `events` to other replicas with it.
        Where the engine pipelines, called inside `pipeline`."""

    def broken(self, conn: Any) -> bool:
        """True when the connection cannot be used again."""

    def stale(self, conn: Any) -> bool:
        """True when the connection reached a database other than the one the
        engine writes to now: it is replaced before its next batch."""

    # Whether one connection failing fatally means the writer's others are
    # stale too and are replaced before their next batch (a database server
    # that failed over, restarted or turned read-only ended or soured every
    # session at once). Never for SQLite: reconnecting to a deleted store
    # file would make a new, empty one.
    stale_together: bool

    def pipeline(self, conn: Any) -> ContextManager[Any]:
        """A block whose statements are sent without waiting for their answers;
        an answer is waited for when it is read, and all of them at the end."""


class LoopEngine(Engine, Protocol):
    """An engine `on_loop`: it connects with a coroutine (so that a connection
    can go on being made after the batch that wanted it gave up), and its
    writers give up on a database that does not answer within `timeout_s`
    (SPEC §7.10)."""

    timeout_s: float

    async def open_connection(self, writes: bool = True) -> Any: ...


class InlineEngine(Engine, Protocol):
    """An engine whose batches run on the event loop (`inline`): its commit
    writes without waiting for the disk, `sync` then makes it durable on
    another thread, and the right to write (the turn, among the processes
    sharing the database) is waited for on another thread too, so the loop
    never blocks on the disk or on another process."""

    def sync(self) -> None:
        """Make every commit so far durable; raise StoreUnavailable when that
        cannot be done."""

    def try_turn(self) -> bool:
        """Take the turn to write if it is free now (never waits)."""

    def wait_turn(self) -> None:
        """Wait for the turn to write and take it (on a thread of its own)."""

    def give_turn(self) -> None:
        """Give the turn back (harmless when not held)."""


class Undecided(enum.Enum):
    """What `Step.answer` returns when the first statement did not decide."""

    UNDECIDED = "undecided"


UNDECIDED = Undecided.UNDECIDED


@dataclass(frozen=True, slots=True)
class Refused:
    """An operation's refusal, decided before the operation wrote anything,
    returned as its result: the batch commits the others' work without a
    replay, and the writer raises `error` to this operation's caller once it
    has (see the module docstring). An operation that may have written first
    raises instead: only the batch's rollback undoes its writes."""

    error: Exception


def refused_before_writing(decide: Callable[[], T], *refusals: type[Exception]) -> T | Refused:
    """What `decide` returns, or any of `refusals` it raises as a Refused.
    The caller promises that its operation has written nothing yet (a guarded
    first statement that matched nothing counts as nothing) and that it
    returns the Refused at once, writing nothing more."""
    try:
        return decide()
    except refusals as refusal:
        return Refused(refusal)


@dataclass(frozen=True, slots=True)
class Step(Generic[T_co]):
    """A step operation after its first statement was sent (see the module
    docstring): `answer` reads that statement's answer and returns the result,
    or UNDECIDED (having undone anything in memory the first statement took);
    `otherwise` then runs the general case."""

    answer: Callable[[], T_co | Undecided]
    otherwise: Callable[[], T_co]

    def to_the_end(self) -> T_co:
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
    # While a step operation sends its first statements in a batch that
    # gathers them (together.py): where its Together statements go, and
    # whether its keys are its own in the batch (no other operation has one).
    gather: Gathering | None = None
    alone: bool = False

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Cursor:
        return self.engine.execute(self.conn, sql, params)

    def sending(self) -> ContextManager[Any]:
        """A block whose statements go out together where the engine
        pipelines (one round trip on PostgreSQL, not one each), each with a
        cursor of its own: read them after the block. For statements that do
        not depend on each other's answers, in a plain operation or a general
        case (never inside a step operation's first statements, which are in
        the batch's pipeline already)."""
        if self.engine.pipelines:
            return self.engine.pipeline(self.conn)
        return contextlib.nullcontext()

    def gathers(self, together: Together) -> bool:
        """Whether `together` goes out as one with the like statements of the
        batch's other operations (together.py)."""
        return self.gather is not None and (self.alone or together.shares_keys)

    def send(self, together: Together, params: tuple[Any, ...]) -> Cursor:
        """A first statement that may go out as one with the like statements
        of the batch's other operations (together.py); else it runs alone."""
        if self.gather is not None and (self.alone or together.shares_keys):
            return self.gather.add(together, params)
        assert together.single is not None, "a Together without `single` is sent only gathered"
        return self.engine.execute(self.conn, together.single, params)

    def claim(self, keys: Iterable[Key]) -> list[Key]:
        """Those of `keys` this transaction now holds (see the module
        docstring); the others are busy in another transaction. Never waits."""
        wanted = sorted(set(keys))
        if not wanted:
            return []
        taken = self.engine.claim(self.conn, [key.number for key in wanted])
        return [key for key, ok in zip(wanted, taken, strict=True) if ok]


@dataclass(slots=True)
class Job(Generic[T]):
    """One submitted operation, waiting for its batch, and whom to answer."""

    fn: Callable[[Tx], Any]  # a plain operation, or a step operation if `steps`
    future: asyncio.Future[T]
    loop: asyncio.AbstractEventLoop
    steps: bool = False
    origin: Any = None  # the submitting request's (see Tx.origin)
    keys: Keys = NO_KEYS
    order: int = 0  # its place in submission order (writer_lines.py)
    taken: bool = False  # into a batch (writer_lines.py)
    ahead: bool = False  # goes before the jobs already waiting on its keys (BatchWriter.run)
    expired: bool = False  # answered 503 while it waited (the store stopped answering)
    upkeep: bool = False  # the store's own upkeep, never refused for want of replication

    def run_whole(self, tx: Tx) -> Any:
        if not self.steps:
            return self.fn(tx)
        if tx.engine.pipelines:
            # Its first statements go out as they do in steps: each with a
            # cursor of its own, read only in `answer`.
            with tx.engine.pipeline(tx.conn):
                step = self.fn(tx)
        else:
            step = self.fn(tx)
        return step.to_the_end()


# A job, its result (or None) and its error (or None).
JobResult = tuple[Job[Any], Any, BaseException | None]
# After a failed connection attempt, batches fail at once for this long instead
# of each waiting for a connect timeout: callers get a fast 503.
RECONNECT_BACKOFF_S = 0.5


class _Link:
    """One connection of a writer; on the loop, also the batch in flight on
    it, and since when that batch waits for the database (set by
    run_on_loop, read by the watchdog)."""

    __slots__ = (
        "conn", "generation", "since", "connecting", "batch", "keys", "task", "abandoned",
    )

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.generation = 0  # the writer's generation when `conn` was opened
        self.since: float | None = None
        self.connecting: asyncio.Future[Any] | None = None  # a connection being made
        self.batch: list[Job[Any]] = []
        self.keys: set[Key] = set()
        self.task: asyncio.Task[None] | None = None
        self.abandoned = False  # given up on by the watchdog


class _Inline:
    """An inline writer's connection and the jobs waiting for its next batch."""

    __slots__ = ("link", "engine", "turn_waiter", "pending", "scheduled", "closing", "paused")

    def __init__(self, link: _Link, engine: InlineEngine, name: str) -> None:
        self.link = link
        self.engine = engine
        self.turn_waiter = TurnWaiter(engine, f"{name}-turn")
        self.pending: collections.deque[Job[Any]] = collections.deque()
        self.scheduled = False  # a drain is due on the loop
        self.closing = False
        self.paused = False  # tests only: jobs wait until resumed


class _Looped:
    """A writer whose batches run on the event loop, their round trips
    awaited there (Engine.on_loop): its connections, those free for the next
    batch, and the batches in flight."""

    __slots__ = ("loop", "links", "idle", "scheduled", "closing", "running", "watchdog",
                 "abandoned")

    def __init__(self, loop: asyncio.AbstractEventLoop, links: list[_Link]) -> None:
        self.loop = loop
        self.links = links
        self.idle = list(links)
        self.scheduled = False  # a dispatch is due on the loop
        self.closing = False
        self.running: set[asyncio.Task[None]] = set()
        self.watchdog: asyncio.Task[None] | None = None
        # Batches given up on, still ending (their connections' cancellation).
        self.abandoned: set[asyncio.Task[None]] = set()


def test_hooks_enabled() -> bool:
    return os.environ.get(TEST_HOOKS_VARIABLE) == "1"


class BatchWriter:
    def __init__(
        self,
        engine: Engine,
        publish: Callable[[list[Any]], None],
        name: str = "writer",
        exclusive: bool = True,
        on_failure: Callable[[str], None] | None = None,
        connections: int = 1,
    ) -> None:
        self._engine = engine
        self._on_failure = on_failure
        self._exclusive = exclusive
        self._publish = publish
        self._name = name
        self._connections = max(1, connections)
        self._jobs = JobLines()
        self._threads: list[threading.Thread] = []
        self._inline: _Inline | None = None
        self._looped: _Looped | None = None
        self._flusher: Flusher | None = None
        # An inline writer whose flusher also answers this reader: what a read
        # saw may have committed but not reached the disk yet.
        self._durable_by: BatchWriter | None = None
        self._hold: Callable[[list[Key]], None] | None = None
        self._hold_at_commit = False
        self._generation = 0  # bumped when a connection fails fatally (stale_together)
        # After a failed connection attempt, no connection is tried before this
        # (time.monotonic()); the first that succeeds clears it.
        self._next_connect = 0.0
        # Told each batch's size, its seconds from begin to commit, whether it
        # failed and whether it was replayed isolated (the metrics); called on
        # the writer's loop or threads.
        self.observer: Callable[[int, float, bool, bool], None] | None = None

    async def open(self) -> None:
        """Connect (failing here, in the caller, if the database is
        unreachable) and start taking jobs."""
        if not self._engine.on_loop:
            self._start()
            return
        engine = cast(LoopEngine, self._engine)
        links = [_Link(None) for _ in range(self._connections)]
        for link in links:
            link.conn = await engine.open_connection(self._exclusive)
        looped = self._looped = _Looped(asyncio.get_running_loop(), links)
        looped.watchdog = looped.loop.create_task(self._watch(looped, engine.timeout_s))

    def _start(self) -> None:
        if self._engine.inline and self._exclusive:
            # Inline (see InlineEngine); an inline engine's readers keep
            # threads of their own, so a read never waits for a write batch.
            engine = cast(InlineEngine, self._engine)
            self._inline = _Inline(_Link(engine.connect(True)), engine, f"fencepost-{self._name}")
            self._flusher = Flusher(engine.sync, self._deliver, f"fencepost-{self._name}-sync")
            return
        links = [_Link(self._engine.connect(self._exclusive)) for _ in range(self._connections)]
        self._jobs = JobLines()
        self._threads = [
            threading.Thread(
                target=self._run, args=(link,), name=f"fencepost-{self._name}-{i}", daemon=True
            )
            for i, link in enumerate(links)
        ]
        for thread in self._threads:
            thread.start()

    async def close(self) -> None:
        """Answer what was submitted, then stop."""
        looped = self._looped
        if looped is not None:
            looped.closing = True
            while self._jobs.count() or looped.running:  # the last batches
                await asyncio.sleep(0.001)
            self._looped = None
            for task in [looped.watchdog, *looped.abandoned]:
                if task is not None:
                    task.cancel()
            for link in looped.links:
                await run_on_loop(self._close, link)
            return
        inline = self._inline
        if inline is None:
            await asyncio.to_thread(self.stop)
            return
        inline.closing = True
        while inline.pending or inline.scheduled:  # the last batches, maybe a turn away
            await asyncio.sleep(0.001)
        flusher, self._flusher, self._inline = self._flusher, None, None
        if flusher is not None:
            await asyncio.to_thread(flusher.stop)
        inline.turn_waiter.stop()
        self._close(inline.link)

    def stop(self) -> None:
        if self._threads:
            self._jobs.stop()
            for thread in self._threads:
                thread.join(timeout=10)
            self._threads = []

    def answer_when_durable(self, writer: BatchWriter) -> None:
        """Answer this reader's batches only once `writer` made every commit
        so far durable (when it is inline; its own batches wait likewise), so
        that no read shows a write that a crash of the machine could undo."""
        self._durable_by = writer

    @property
    def inline(self) -> bool:
        """Whether batches run on the event loop that submits them (see store/inline.py)."""
        return self._inline is not None

    def hold_for_tests(
        self, hold: Callable[[list[Key]], None] | None, at_commit: bool = False
    ) -> None:
        """Fault injection, for tests only: `hold` is called on the writer
        thread with each batch's keys once the batch holds them, before its
        operations run (or, `at_commit`, after they ran and before the
        commit); a test blocks there to keep a key's transaction open.
        Refused unless FENCEPOST_TEST_HOOKS=1."""
        if not test_hooks_enabled():
            raise RuntimeError(f"test hooks are off (set {TEST_HOOKS_VARIABLE}=1)")
        self._hold = hold
        self._hold_at_commit = at_commit

    def pause_for_tests(self, paused: bool) -> None:
        """Fault injection, for tests only, inline writers only: while paused,
        submitted jobs wait (a test gathers them into one batch, or keeps
        them waiting); resuming runs them. Refused unless
        FENCEPOST_TEST_HOOKS=1."""
        if not test_hooks_enabled():
            raise RuntimeError(f"test hooks are off (set {TEST_HOOKS_VARIABLE}=1)")
        inline = self._inline
        if inline is None:
            raise RuntimeError("only an inline writer pauses (use hold_for_tests)")
        inline.paused = paused
        if not paused and inline.pending and not inline.scheduled:
            inline.scheduled = True
            inline.pending[0].loop.call_soon(self._drain)

    def waiting_for_tests(self) -> int:
        """How many submitted jobs wait for a batch (tests only)."""
        if self._inline is not None:
            return len(self._inline.pending)
        return self._jobs.count()

    async def run(
        self, fn: Callable[[Tx], T | Refused], keys: Keys, ahead: bool = False,
        upkeep: bool = False,
    ) -> T:
        """The result of the plain operation `fn`, which touches `keys` (NO_KEYS
        only for an operation that touches no lock, pool or quota, or claims
        what it touches), once its batch has committed; its Refused's error
        raised. `ahead`: it goes before the jobs already waiting on its keys,
        for upkeep whose order among them does not matter and which must not
        wait behind a backlog (the waiters' sweep keeping their places alive).
        `upkeep`: the store's own bookkeeping (start-up, the reaper, the
        sweep, quotas, a waiter leaving its line), which goes on where a
        caller's change would be refused (--require-sync-replication)."""
        return cast(T, await self._submit(fn, False, keys, ahead, upkeep))

    async def run_steps(self, fn: Callable[[Tx], Step[T | Refused]], keys: Keys) -> T:
        """The result of the step operation `fn`, which touches `keys`, once
        its batch has committed; its Refused's error raised."""
        return cast(T, await self._submit(fn, True, keys))

    async def _submit(
        self, fn: Callable[[Tx], Any], steps: bool, keys: Keys, ahead: bool = False,
        upkeep: bool = False,
    ) -> Any:
        inline, looped = self._inline, self._looped
        if not self._threads and (inline is None or inline.closing) \
                and (looped is None or looped.closing):
            raise StoreUnavailable("The store is closed.")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        job = Job(fn, future, loop, steps, current_origin(), keys, ahead=ahead, upkeep=upkeep)
        if inline is None:
            self._jobs.put(job)
            if looped is not None and not looped.scheduled:
                # Everything submitted until the loop gets to it may join the batch.
                looped.scheduled = True
                loop.call_soon(self._dispatch)
        else:
            inline.pending.append(job)
            if not inline.scheduled:
                # Everything submitted until the loop gets to it joins the batch.
                inline.scheduled = True
                loop.call_soon(self._drain)
        return await future

    def _drain(self) -> None:
        """Run the next inline batch on this (the event loop's) thread."""
        inline = self._inline
        if inline is None:
            return
        inline.scheduled = False
        pending = inline.pending
        if not pending or (inline.paused and not inline.closing):
            return
        loop = pending[0].loop
        if not inline.engine.try_turn():
            # Another process is writing: wait for its commit on a thread, and
            # serve meanwhile (what arrives joins this batch).
            inline.scheduled = True
            inline.turn_waiter.wait(lambda: loop.call_soon_threadsafe(self._drain))
            return
        batch = [pending.popleft() for _ in range(min(len(pending), MAX_BATCH))]
        if pending:
            inline.scheduled = True
            loop.call_soon(self._drain)
        try:
            self._run_batch(inline.link, batch, {key for job in batch for key in job.keys})
        finally:
            inline.engine.give_turn()  # already given by the commit or rollback, unless neither ran

    def _dispatch(self) -> None:
        """Start a batch on each free connection of a writer on the loop, while
        jobs are ready for one."""
        looped = self._looped
        if looped is None:
            return
        looped.scheduled = False
        while looped.idle:
            taken = self._jobs.take_ready()
            if taken is None:
                return
            link = looped.idle.pop()
            task = link.task = looped.loop.create_task(self._batch_on_loop(looped, link, *taken))
            looped.running.add(task)
            task.add_done_callback(looped.running.discard)

    async def _batch_on_loop(
        self, looped: _Looped, link: _Link, batch: list[Job[Any]], keys: set[Key]
    ) -> None:
        link.batch, link.keys = batch, keys
        try:
            await run_on_loop(self._run_batch, link, batch, keys, watch=link)
        except asyncio.CancelledError:
            if not link.abandoned:
                raise
        finally:
            link.batch, link.keys = [], set()
            if link.abandoned:
                # Its callers were answered and its keys handed on when the
                # watchdog gave up on it; a replacement took its place.
                looped.abandoned.discard(cast("asyncio.Task[None]", asyncio.current_task()))
                await run_on_loop(self._close, link)
            else:
                self._jobs.done(keys)
                looped.idle.append(link)
                self._dispatch_soon(looped)

    def _dispatch_soon(self, looped: _Looped) -> None:
        if not looped.scheduled:
            looped.scheduled = True
            looped.loop.call_soon(self._dispatch)

    async def _watch(self, looped: _Looped, limit: float) -> None:
        """Give up on a batch that has waited `limit` seconds for one answer
        from the database (SPEC §7.10: paused, partitioned, or a commit held
        by a synchronous standby that stalled): its callers, and every job
        still waiting for a connection, are answered 503 at once; a fresh
        connection takes its place. Its outcome is unknown to its callers,
        which the API makes safe to retry (the same lock token, the same
        slot). Checked every tick, so a caller hears within `limit`."""
        tick = min(0.1, limit / 10)
        while not looped.closing:
            await asyncio.sleep(tick)
            now = time.monotonic()
            stuck = [
                link for link in looped.links
                if link.since is not None and now - link.since >= limit - tick
            ]
            if stuck:
                self._give_up(looped, stuck, limit)

    def _give_up(self, looped: _Looped, stuck: list[_Link], limit: float) -> None:
        failure = StoreUnavailable(
            f"The store did not answer within {limit:g} s; a change may or may not have been "
            f"made (retrying it with the same lock token is safe).", outcome="unknown",
        )
        answered: list[Job[Any]] = []
        for link in stuck:
            link.abandoned = True
            fresh = _Link(None)
            # A connection still being made is handed on: it may yet succeed.
            if link.connecting is not None and not link.connecting.done():
                fresh.connecting = link.connecting
            looped.links[looped.links.index(link)] = fresh
            looped.idle.append(fresh)
            answered.extend(link.batch)
            self._jobs.done(link.keys)
            if link.task is not None:
                looped.running.discard(link.task)
                looped.abandoned.add(link.task)
                link.task.cancel()  # psycopg cancels the statement, or closes the connection
        # Every connection is suspect now: each is replaced before its next batch,
        # and none is tried for a moment (callers meanwhile hear 503 at once).
        self._generation += 1
        self._next_connect = time.monotonic() + RECONNECT_BACKOFF_S
        for job in [*answered, *self._jobs.waiting()]:
            job.expired = True
            if not job.future.done():
                job.future.set_exception(failure)
        if self._on_failure is not None:
            self._on_failure(failure.message)
        self._dispatch_soon(looped)

    def _run(self, link: _Link) -> None:
        try:
            while True:
                taken = self._jobs.take()
                if taken is None:
                    return
                batch, keys = taken
                try:
                    self._run_batch(link, batch, keys)
                finally:
                    self._jobs.done(keys)
        finally:
            self._close(link)

    def _close(self, link: _Link) -> None:
        if link.conn is not None:
            try:
                self._engine.close(link.conn)
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
            link.conn = None

    def _connection(self, link: _Link) -> Any:
        if link.conn is not None and (
                link.generation < self._generation or self._engine.stale(link.conn)):
            self._close(link)  # opened before another connection failed fatally, or moved on
        if link.conn is None:
            if time.monotonic() < self._next_connect:
                raise StoreUnavailable("The store is unreachable; retrying shortly.")
            try:
                link.conn = self._connect(link)
            except self._engine.errors as exc:
                self._next_connect = time.monotonic() + RECONNECT_BACKOFF_S
                raise StoreUnavailable(f"The store is unreachable: {exc}.") from exc
            self._next_connect = 0.0  # the store answers: the others may connect at once
            link.generation = self._generation
        return link.conn

    def _connect(self, link: _Link) -> Any:
        if self._looped is None:
            return self._engine.connect(self._exclusive)
        # Made by a task of its own, which a batch that gives up waiting for
        # it (the watchdog) leaves running for the next batch: with several
        # hosts, libpq tries them in turn, each for its connect timeout. An
        # attempt begun for an earlier batch that fails is old news (begun
        # while the database did not answer, say): a fresh one is tried.
        inherited = link.connecting
        link.connecting = None
        if inherited is not None:
            if not inherited.done() or (
                    not inherited.cancelled() and inherited.exception() is None):
                try:
                    return self._await_connection(link, inherited)
                except self._engine.errors:
                    pass
        engine = cast(LoopEngine, self._engine)
        pending = asyncio.ensure_future(engine.open_connection(self._exclusive))
        pending.add_done_callback(_retrieve)
        return self._await_connection(link, pending)

    @staticmethod
    def _await_connection(link: _Link, pending: asyncio.Future[Any]) -> Any:
        link.connecting = pending
        try:
            return wait_for(asyncio.shield(pending))
        finally:
            if pending.done():
                link.connecting = None

    def _run_batch(self, link: _Link, batch: list[Job[Any]], keys: set[Key]) -> None:
        if any(job.expired for job in batch):
            batch = [job for job in batch if not job.expired]  # answered 503 already
            if not batch:
                return
        started = time.perf_counter()
        failed = False
        replayed = False
        numbers = sorted({key.number for key in keys}) if self._engine.locks_keys else []
        try:
            conn = self._connection(link)
            # Optimistic first: no savepoints (two statements fewer per
            # operation). Should any operation raise, the batch is rolled back
            # and replayed isolated.
            done = self._run_in_transaction(conn, batch, keys, numbers, isolated=False)
            if done is None:
                self._engine.execute(conn, "ROLLBACK", ())
                replayed = True
                done = self._run_in_transaction(conn, batch, keys, numbers, isolated=True)
            assert done is not None
            outcomes, events = done
        except Exception as exc:  # noqa: BLE001 - the writer thread must survive anything
            # Fail every caller in it: nothing of it is durable, unless its
            # connection broke as the commit went out (then nobody knows).
            if not isinstance(exc, (StoreUnavailable, *self._engine.errors)):
                _log.exception("a store batch failed unexpectedly")
            unknown = not isinstance(exc, StoreUnavailable) and _unknown(self._engine, link)
            self._abandon(link)
            if self._engine.stale_together and isinstance(exc, self._engine.errors) \
                    and self._engine.fatal(exc):
                # Every connection opened so far is suspect: each is replaced
                # before its next batch, so the database's change of state
                # refuses one write, not one per connection.
                self._generation += 1
            if isinstance(exc, StoreUnavailable):
                failure = exc
            elif unknown:
                failure = StoreUnavailable(f"The store failed: {exc}.", outcome="unknown")
            else:
                failure = StoreUnavailable(f"The store failed: {exc}.")
            outcomes = [(job, None, failure) for job in batch]
            events = []
            failed = True
            # A change refused for want of replication is no failure to write:
            # /readyz says so by the replication it reports instead.
            if self._on_failure is not None and not isinstance(failure, StoreNotReplicated):
                self._on_failure(failure.message)
        if self.observer is not None:
            try:
                self.observer(len(batch), time.perf_counter() - started, failed, replayed)
            except Exception:  # noqa: BLE001 - the writer thread must survive anything
                # An observer that raised would otherwise end the writer
                # thread, and every request after it would wait forever.
                _log.exception("a store batch observer failed")
        flusher = self._flusher or (self._durable_by._flusher if self._durable_by else None)
        if flusher is not None:
            flusher.put(outcomes, events)  # answered once durable
        else:
            self._deliver(outcomes, events)

    def _run_in_transaction(
        self,
        conn: Any,
        batch: list[Job[Any]],
        keys: set[Key],
        numbers: list[int],
        isolated: bool,
    ) -> tuple[list[JobResult], list[Any]] | None:
        """Begin the batch transaction, holding `keys` (their `numbers`,
        sorted), run the batch's operations in it, write what they gathered
        and commit. Unless `isolated`, give up (None, the transaction to be
        rolled back) at the first operation that raises."""
        changes = not all(job.upkeep for job in batch)
        clock = self._engine.begin(conn, self._exclusive, numbers, changes)
        if self._hold is not None and not self._hold_at_commit:
            self._held(keys)
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
                if isinstance(result, Refused):
                    outcomes.append((job, None, result.error))
                else:
                    outcomes.append((job, result, None))
                    events.extend(tx.events)
        if self._hold is not None and self._hold_at_commit:
            self._held(keys)
        try:
            self._finish_and_commit(conn, shared, Tx(self._engine, conn, clock(), [], shared),
                                    events if self._exclusive else [])
        except self._engine.errors as exc:
            if isolated or self._engine.fatal(exc):
                raise
            return None  # the replay writes as it goes, in each operation's savepoint
        return outcomes, events

    def _held(self, keys: set[Key]) -> None:
        """The test hook's call (hold_for_tests): on a thread of its own when
        the batch runs on the loop, which must go on serving meanwhile."""
        hold = self._hold
        assert hold is not None
        if self._looped is not None:
            # A test's hold is not the database's silence: the watchdog ignores it.
            wait_for(Unwatched(asyncio.to_thread(hold, sorted(keys))))
        else:
            hold(sorted(keys))

    def _finish_and_commit(self, conn: Any, shared: Batch, tx: Tx, events: list[Any]) -> None:
        """Write what the batch gathered, then commit, announcing `events`.
        Where statements pipeline, the gathered writes, the announcement and
        the commit go out together, one round trip: a gathered write that
        fails makes the database skip the commit behind it, so the batch is
        rolled back and replayed as when the write fails alone."""
        if not self._engine.pipelines:
            shared.finish(tx)
            self._engine.commit(conn, events)
            return
        with self._engine.pipeline(conn):
            shared.finish(tx)
            self._engine.commit(conn, events)

    def _in_turn(
        self, conn: Any, batch: list[Job[Any]], clock: Callable[[], int], shared: Batch
    ) -> list[tuple[Job[Any], Any, Tx]]:
        """Run each operation whole, in batch order; raise what any raises."""
        done = []
        for job in batch:
            tx = Tx(self._engine, conn, clock(), [], shared, job.origin)
            done.append((job, job.run_whole(tx), tx))
        return done

    def _in_steps(
        self, conn: Any, batch: list[Job[Any]], clock: Callable[[], int], shared: Batch
    ) -> list[tuple[Job[Any], Any, Tx]]:
        """Send every step operation's first statement in a pipeline (plain
        operations run whole in their turn, outside it), then read each answer
        in batch order, then run each undecided one's general case in batch
        order; raise what any operation raises."""
        # (job, tx, its Step while undecided, else its result)
        runs: list[tuple[Job[Any], Tx, Any]] = []
        # Keys of one operation only: those operations' Together statements
        # go out gathered (together.py), as do those that share keys.
        uses = collections.Counter(key for job in batch for key in job.keys)
        gathering = Gathering()
        with contextlib.ExitStack() as pipeline:
            piped = False
            for job in batch:
                tx = Tx(self._engine, conn, clock(), [], shared, job.origin)
                if job.steps != piped:  # open or close the pipeline
                    if job.steps:
                        pipeline.enter_context(self._engine.pipeline(conn))
                    else:
                        gathering.send(self._engine, conn)  # before this one runs
                        pipeline.close()
                    piped = job.steps
                if job.steps and job.keys:
                    tx.gather = gathering
                    tx.alone = all(uses[key] == 1 for key in job.keys)
                runs.append((job, tx, job.fn(tx)))
                tx.gather = None  # its answer and general case run their statements alone
            gathering.send(self._engine, conn)
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
        self, conn: Any, batch: list[Job[Any]], clock: Callable[[], int], shared: Batch
    ) -> tuple[list[JobResult], list[Any]]:
        """Run each operation whole, in batch order, in a savepoint of its own:
        one that raises or is refused has its writes undone and its error
        delivered, and the others go on."""
        outcomes: list[JobResult] = []
        events: list[Any] = []
        for job in batch:
            tx = Tx(self._engine, conn, clock(), [], shared, job.origin)
            self._engine.execute(conn, "SAVEPOINT op", ())
            try:
                result = job.run_whole(tx)
            except Exception as exc:  # noqa: BLE001 - delivered to the caller
                if isinstance(exc, self._engine.errors) and self._engine.fatal(exc):
                    raise
                result = Refused(exc)
            if isinstance(result, Refused):
                # A refusal wrote nothing; a raise may have: undone alike.
                self._engine.execute(conn, "ROLLBACK TO SAVEPOINT op", ())
                self._engine.execute(conn, "RELEASE SAVEPOINT op", ())
                outcomes.append((job, None, result.error))
            else:
                self._engine.execute(conn, "RELEASE SAVEPOINT op", ())
                outcomes.append((job, result, None))
                events.extend(tx.events)
        return outcomes, events

    def _abandon(self, link: _Link) -> None:
        conn = link.conn
        if conn is None:
            return
        try:
            self._engine.execute(conn, "ROLLBACK", ())
        except Exception:  # noqa: BLE001 - the connection may be gone
            pass
        if self._engine.broken(conn):
            self._close(link)

    def _deliver(self, outcomes: list[JobResult], events: list[Any]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[JobResult]] = {}
        for outcome in outcomes:
            by_loop.setdefault(outcome[0].loop, []).append(outcome)
        for loop, done in by_loop.items():
            try:
                if self._looped is not None and loop is self._looped.loop:
                    loop.call_soon(_settle, done, events, self._publish)  # on it already
                else:
                    loop.call_soon_threadsafe(_settle, done, events, self._publish)
            except RuntimeError:
                pass  # that loop is closed; nobody is waiting any more
            events = []  # publish each event once, on the first loop


def _unknown(engine: Engine, link: _Link) -> bool:
    """Whether a failed batch may have committed all the same: its connection
    broke under it, maybe after the commit went out (a failure the database
    answered with rolled the batch back)."""
    conn = link.conn
    return conn is not None and engine.broken(conn)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """A connection attempt's failure is raised to the batch waiting for it,
    if any still is; marked as retrieved so that none is reported unheard."""
    if not task.cancelled():
        task.exception()


def _settle(
    done: list[JobResult],
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
