"""The PostgreSQL store: many server replicas, one database, one truth.

Each replica runs the same batch writer as SQLite, over several connections
(WRITER_CONNECTIONS). A batch transaction first takes one transaction-scoped
advisory lock per key its operations declared (batch.py), in sorted order, in
the statement that begins it: the read-decide-write of every operation on a
lock or pool is atomic across the deployment, batches on different keys commit
concurrently (from one replica's connections and from every replica), and no
two batches can deadlock. Fencing tokens come from a sequence drawn while the
lock's key is held (store/sql/fencing.py). The database's clock, read once per
batch and advanced by the local steady clock (clock.steady_ns) after it,
judges every expiry, so a replica with a skewed or stepped wall clock never
decides anything by it.

Everything runs on the event loop's thread: the batches, each in a greenlet
that awaits its round trips on the loop (store/on_loop.py), and the listener.
Run on threads, every answer from the database waited for the loop to let go
of the interpreter lock before it could be read.

Replicas hear about freed locks and slots through LISTEN/NOTIFY; the waiting
module sweeps its lines now and then in case a notification is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from functools import lru_cache
from typing import Any, Callable, ContextManager, Iterator

import psycopg

from fencepost.clock import steady_ns, wall_clock_ms
from fencepost.errors import StoreNotReplicated, StoreUnavailable
from fencepost.events import DatabaseChanged, Granted
from fencepost.store import pg_url
from fencepost.store.base import Freed
from fencepost.store.batch import Cursor
from fencepost.store.migrate import apply_migrations
from fencepost.store.on_loop import wait_for
from fencepost.store.sql.replicas import DatabaseSessions
from fencepost.store.sql_store import DEFAULT_READERS, SqlStore
from fencepost.store.standing import (
    STANDING_SQL,
    SYNC_COMMIT_LEVELS,
    TOKENS,
    WENT_BACK_SHOWN_MS,
    Change,
    Replication,
    Standing,
    WentBack,
    Written,
    change_of,
    floor_sequences,
    floored,
    standing_of,
)

_log = logging.getLogger(__name__)

CHANNEL = "fencepost_freed"
# Batches in flight per replica: enough that a key held by a slow transaction
# (another replica's, or a long lock wait) leaves the others moving, few
# enough that the database's sessions stay cheap.
WRITER_CONNECTIONS = 3
# The sequence fencing tokens are drawn from (migration 0012).
TOKEN_SEQUENCE = "fencing_tokens"
# The sequence tickets in a lock's line are drawn from (migration 0014).
TICKET_SEQUENCE = "lock_tickets"
CONNECT_TIMEOUT_S = 2
# How long a request may wait for a database that stopped answering before it
# is answered 503 (SPEC §6, `--store-timeout`).
DEFAULT_STORE_TIMEOUT_S = 2.0
# A new connection's own statements (its standing, the token floor) get this
# long; a commit waiting for a synchronous standby that is gone would wait
# for ever, and statement_timeout does not end that wait.
ARRIVAL_BOUND_S = 10.0
# How often a running store reads its standing again (SPEC §6: every 10 s).
STANDING_EVERY_S = 10.0
# SQLSTATE classes that say the database cannot take the batch now: connection
# exceptions, insufficient resources (disk full, out of memory), operator
# intervention (shutting down, recovering), system errors (I/O), internal
# errors (corruption). A database that refuses writes answers 25006 (a
# read-only standby, or default_transaction_read_only) or 42501 (the role's
# privileges revoked). Each fails the batch whole with 503 store_unavailable,
# never a 500, and turns /readyz off until a write succeeds again.
_UNUSABLE_CLASSES = {"08", "53", "57", "58", "XX"}
_REFUSED_WRITES = {"25006", "42501"}
_CLOCK = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
# With --require-sync-replication, each write batch reads beside the clock
# whether its commit will wait for a synchronous standby, and whether one is
# there to confirm it: with none streaming, a commit would wait for ever (a
# role without pg_read_all_stats sees no sync_state: any standby streaming
# counts, and a commit that then waits meets the store timeout).
_SYNC = (
    ", current_setting('synchronous_standby_names') <> '' AND "
    "current_setting('synchronous_commit') IN ("
    + ", ".join(f"'{level}'" for level in SYNC_COMMIT_LEVELS) + ") AND "
    "EXISTS (SELECT 1 FROM pg_stat_replication "
    "WHERE sync_state IS NULL OR sync_state IN ('sync', 'quorum'))"
)
_BEGIN_READ = f"BEGIN READ ONLY; {_CLOCK}"
_NOTIFY_EACH = "SELECT pg_notify(%s, payload) FROM json_array_elements_text(%s::json) AS payload"


def _begin_write(keys: list[int], sync: bool = False) -> str:
    """BEGIN, then each key's advisory lock in the order given (sorted, so no
    two batches wait for each other in a cycle), then the clock (and, if
    `sync`, whether commits wait for a synchronous standby), in one round
    trip: without parameters psycopg sends the simple protocol, which carries
    several statements. The keys are integers of ours, not input text."""
    read = f"{_CLOCK}{_SYNC if sync else ''}"
    if not keys:
        return f"BEGIN; {read}"
    # unnest yields the array in order, and the aggregate takes the locks row
    # by row in that order.
    listed = ",".join(str(int(key)) for key in keys)
    return (
        f"BEGIN; {read} FROM (SELECT count(pg_advisory_xact_lock(k)) "
        f"FROM unnest('{{{listed}}}'::bigint[]) AS k) AS held"
    )


# A parameter that is an array (`?::text[]`: the gathered statements' unnest).
_ARRAY_PARAMETER = re.compile(r"\?(?=::\w+\[\])")


@lru_cache(maxsize=512)
def _placeholders(sql: str) -> str:
    # The shared statements use `?`; psycopg wants `%s`. None of them holds a
    # literal `?` or `%`. Arrays go in binary (`%b`): psycopg writes a text
    # array by checking every element with a regular expression for quoting,
    # at 2.5 times the CPU of the binary form (measured: 52 against 20 µs for
    # four arrays of fourteen).
    return _ARRAY_PARAMETER.sub("%b", sql).replace("?", "%s")


class _Connection(psycopg.AsyncConnection[Any]):
    """A connection driven by the event loop (store/on_loop.py) that runs
    every statement on one cursor: setting up a fresh cursor is about a third
    of psycopg's own cost per statement. A statement's rows must therefore be
    read before the next statement runs (the SQL modules always do), except
    in a pipeline, where each has its own."""

    __slots__ = ("statements", "pipe", "identity", "floor")
    statements: _Answered
    pipe: psycopg.AsyncPipeline | None
    # The database it reached (Standing.identity), judged when it opened; None
    # once it may no longer be written to.
    identity: str | None
    # The highest fencing token this process had seen when the connection's
    # transaction began: every token that transaction draws must be above it.
    floor: int


class _WentAway(psycopg.OperationalError):
    """A batch on a connection to a database this process no longer writes to,
    or whose tokens fell below one this process has seen: refused before its
    commit, and every connection replaced (fatal)."""


class _Answered:
    """A cursor whose statement has been answered, read from synchronous code
    run on the loop (reading an answered cursor waits for nothing)."""

    __slots__ = ("cursor",)

    def __init__(self, cursor: psycopg.AsyncCursor[Any]) -> None:
        self.cursor = cursor

    def execute(self, sql: str, params: tuple[Any, ...] | None = None) -> _Answered:
        wait_for(self.cursor.execute(sql, params))
        return self

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount

    def nextset(self) -> bool | None:
        return self.cursor.nextset()

    def fetchone(self) -> Any:
        return wait_for(self.cursor.fetchone())

    def fetchall(self) -> list[Any]:
        return wait_for(self.cursor.fetchall())


class _PipelinedCursor:
    """A statement sent in a pipeline: reading its answer waits for it."""

    __slots__ = ("_cursor", "_pipe")

    def __init__(self, cursor: psycopg.AsyncCursor[Any], pipe: psycopg.AsyncPipeline) -> None:
        self._cursor = cursor
        self._pipe = pipe

    @property
    def rowcount(self) -> int:
        if self._cursor.pgresult is None:  # not answered yet
            wait_for(self._pipe.sync())
        return self._cursor.rowcount

    def fetchone(self) -> Any:
        return wait_for(self._cursor.fetchone())

    def fetchall(self) -> list[Any]:
        return wait_for(self._cursor.fetchall())


@contextlib.contextmanager
def _pipelined(conn: _Connection) -> Iterator[None]:
    # Not nested: an inner block's end would close the outer one's `pipe`.
    assert conn.pipe is None, "a pipeline inside a pipeline"
    manager = conn.pipeline()
    conn.pipe = wait_for(manager.__aenter__())
    try:
        yield
    except BaseException as exc:
        conn.pipe = None
        if not wait_for(manager.__aexit__(type(exc), exc, exc.__traceback__)):
            raise
    else:
        conn.pipe = None
        wait_for(manager.__aexit__(None, None, None))


class PostgresEngine:
    errors: tuple[type[BaseException], ...] = (psycopg.Error,)
    pipelines = True
    inline = False  # statements are round trips, awaited on the loop (on_loop)
    locks_keys = True  # advisory locks, one per key
    token_sequence: str | None = TOKEN_SEQUENCE
    ticket_sequence: str | None = TICKET_SEQUENCE
    stale_together = True
    on_loop = True  # round trips awaited on the event loop (store/on_loop.py)

    def __init__(
        self, url: str, clock_ms: Callable[[], int] | None, application_name: str,
        timeout_s: float = DEFAULT_STORE_TIMEOUT_S, require_sync: bool = False,
    ) -> None:
        self.url = pg_url.conninfo(url)
        self.clock_ms = clock_ms
        self.application_name = application_name  # names the replica (sql/replicas.py)
        # The batch writers answer 503 after this long without an answer
        # (batch.py's watchdog); the database ends what they gave up on.
        self.timeout_s = timeout_s
        statement_ms = max(5_000, int(timeout_s * 1000) + 3_000)
        self.session_options = (
            f"-c statement_timeout={statement_ms} -c lock_timeout={statement_ms} "
            f"-c idle_in_transaction_session_timeout={max(15_000, 3 * statement_ms)}"
        )
        self.require_sync = require_sync
        # The database clock as last read, and the local steady instant of
        # that reading: between batches, time runs on by the steady clock, so
        # a step of this machine's wall clock moves nothing. One tuple,
        # replaced whole, as the writer and the readers each set it.
        self.seen: tuple[int, int] = (wall_clock_ms(), steady_ns())
        # Where the store stands (store/standing.py), as last read by any
        # connection; None until the first connection.
        self.standing: Standing | None = None
        # The highest value of each sequence (standing.SEQUENCES) this process
        # has read on any database it accepted, and every token it drew: a
        # floor on a new one starts above it, and no batch may draw below it.
        self.high_water: dict[str, int] = {}
        self.new_databases = 0  # databases this process floored as new
        self.written = Written()  # the databases this process wrote to
        self.went_back: WentBack | None = None  # the last database behind them written to
        # Told of each database change (the store's event listeners).
        self.on_change: Callable[[DatabaseChanged], None] | None = None
        # Arrivals are judged and settled one at a time: connections opened
        # together (after a failover, all of them) would otherwise each judge
        # the database before any recorded it, and each floor it again.
        self._arrivals: asyncio.Lock | None = None

    def connect(self, writes: bool = True) -> _Connection:
        return wait_for(self.open_connection(writes))

    async def open_connection(self, writes: bool = True) -> _Connection:
        """A connection to the primary, its database judged (store/standing.py)
        and, for a writer, the fencing tokens floored, before anything else
        runs on it."""
        conn = await self._connect(self.url)
        try:
            async with asyncio.timeout(ARRIVAL_BOUND_S):
                conn = await self._arrive(conn, writes)
        except TimeoutError:
            await conn.close()
            raise psycopg.OperationalError(
                f"the database did not finish a new connection's set-up within "
                f"{ARRIVAL_BOUND_S:g} s") from None
        except BaseException:
            await conn.close()
            raise
        conn.statements = _Answered(conn.cursor())
        conn.pipe = None
        conn.floor = 0
        return conn

    async def _connect(self, conninfo: str) -> _Connection:
        conn = await _Connection.connect(
            conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
            options=self.session_options, application_name=self.application_name,
        )
        conn.identity = None
        return conn

    async def _arrive(self, conn: _Connection, writes: bool) -> _Connection:
        """Judge the database `conn` reached; return the connection to use:
        `conn`, or one to another host of a multi-host URL when `conn`'s
        database is behind one this process wrote to and that host's is not
        (`conn` is then closed). A writer's tokens are floored for it."""
        if self._arrivals is None:
            self._arrivals = asyncio.Lock()  # made on the loop that uses it
        async with self._arrivals:
            return await self._judged(conn, writes)

    async def _judged(self, conn: _Connection, writes: bool) -> _Connection:
        # The tokens seen before the database is read: grants on other
        # connections go on meanwhile, and a token drawn after the read would
        # make the very database being written to look behind.
        seen = dict(self.high_water)
        standing = await _standing(conn)
        change = change_of(standing, self.written, seen)
        if change is Change.BACK:
            found = await self._look_past(standing, seen)
            if found is not None:
                _log.warning(
                    "the store's host answered with a database behind one fencepost wrote to "
                    "(%s, wrote to %s): a deposed primary that still takes writes; using "
                    "another host instead (%s)",
                    standing.identity, self.written.last, found[1].identity)
                await conn.close()
                conn, standing = found
                change = change_of(standing, self.written, seen)
        self.saw(standing)
        if writes:
            await self._settle(conn, standing, change)
        conn.identity = standing.identity
        return conn

    async def _look_past(
        self, behind: Standing, seen: dict[str, int]
    ) -> tuple[_Connection, Standing] | None:
        """A connection to another host of a multi-host URL whose database is
        a primary not behind any this process wrote to, with its standing;
        None when no such host answers (or the URL names one host)."""
        for conninfo in pg_url.each_host(self.url):
            try:
                conn = await self._connect(conninfo)
            except psycopg.Error:
                continue
            try:
                standing = await _standing(conn)
                if standing.identity != behind.identity and \
                        change_of(standing, self.written, seen) is not Change.BACK:
                    return conn, standing
            except psycopg.Error:
                pass
            except BaseException:
                await conn.close()
                raise
            await conn.close()
        return None

    async def _settle(self, conn: _Connection, standing: Standing, change: Change) -> None:
        """Floor a writer's tokens on the database it reached, as judged, and
        say so unless it is the one this process last wrote to."""
        async def execute(sql: str, params: tuple[Any, ...] | None) -> list[tuple[Any, ...]]:
            cursor = await conn.execute(sql, params)
            return await cursor.fetchall() if cursor.description is not None else []

        if change is not Change.SAME or not floored(standing, self.high_water, change):
            values, _ = await floor_sequences(execute, self.high_water, change)
            self._raise_high_water(values)
        before = self.written.last or standing.recorded
        self.written.record(standing.identity)
        if change is Change.SAME:
            return
        tokens_from = self.high_water.get(TOKENS, 0)
        if change is Change.NEW:
            self.new_databases += 1
            recorded = "" if standing.recorded in (None, before) else \
                f"; its own record names {standing.recorded}"
            _log.warning(
                "the store is a database fencepost did not last write to (%s, was %s%s): a "
                "promoted standby or a restored copy; fencing tokens now continue above %d",
                standing.identity, before, recorded, tokens_from,
            )
        else:
            count = 1 if self.went_back is None else self.went_back.count + 1
            self.went_back = WentBack(str(before), standing.identity, wall_clock_ms(),
                                      tokens_from, count)
            _log.error(
                "the store went back: the database is %s, behind %s which fencepost wrote "
                "to before (an older timeline, another cluster, or fencing tokens below ones "
                "already granted), and no other host is ahead of it. Acknowledged changes "
                "made on %s may be lost; fencing tokens continue above %d, above every one "
                "granted. Check the failover manager (operations guide: High availability)",
                standing.identity, before, before, tokens_from,
            )
        if self.on_change is not None:
            self.on_change(DatabaseChanged(change.value, before, standing.identity, tokens_from))

    def stale(self, conn: _Connection) -> bool:
        """Whether `conn` reached a database other than the one this process
        writes to now (another connection has moved on): it is replaced."""
        written = self.written.last
        return written is not None and conn.identity != written

    def saw(self, standing: Standing) -> None:
        """Take a standing read on any connection as the store's latest."""
        before = self.standing
        self.standing = standing
        self._raise_high_water(standing.sequences)
        if before is None or before.replication.mode != standing.replication.mode:
            _report_replication(standing.replication, before is None)

    def _raise_high_water(self, values: dict[str, int]) -> None:
        for name, value in values.items():
            self.high_water[name] = max(self.high_water.get(name, 0), value)

    @property
    def replication(self) -> Replication | None:
        standing = self.standing
        return None if standing is None else standing.replication

    def close(self, conn: _Connection) -> None:
        wait_for(conn.close())

    def begin(
        self, conn: _Connection, exclusive: bool, keys: list[int], changes: bool = True
    ) -> Callable[[], int]:
        sync = exclusive and changes and self.require_sync
        conn.floor = self.high_water.get(TOKENS, 0)
        cur = conn.statements.execute(_begin_write(keys, sync) if exclusive else _BEGIN_READ)
        cur.nextset()  # past BEGIN's result to the clock's
        row = cur.fetchone()
        assert row is not None
        db_ms, started = int(row[0]), steady_ns()
        self.seen = (db_ms, started)
        if sync and not row[1]:
            # Read before any operation ran: nothing is written (the writer
            # rolls the transaction back).
            raise StoreNotReplicated(
                "No synchronous standby confirms commits now (--require-sync-replication); "
                "nothing was changed."
            )
        if self.clock_ms is not None:  # a test drives time
            return self.clock_ms
        return lambda: db_ms + (steady_ns() - started) // 1_000_000

    def claim(self, conn: _Connection, keys: list[int]) -> list[bool]:
        rows = conn.statements.execute(
            "SELECT pg_try_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS k", (keys,)
        ).fetchall()
        return [bool(taken) for (taken,) in rows]

    def execute(self, conn: _Connection, sql: str, params: tuple[Any, ...]) -> Cursor:
        if conn.pipe is not None:
            cursor = conn.cursor()
            wait_for(cursor.execute(_placeholders(sql), params))
            return _PipelinedCursor(cursor, conn.pipe)
        return conn.statements.execute(_placeholders(sql), params)

    def pipeline(self, conn: _Connection) -> ContextManager[None]:
        # The first statements of a batch's operations go out together: one
        # round trip for the batch instead of one per operation.
        return _pipelined(conn)

    def commit(self, conn: _Connection, events: list[Any]) -> None:
        self._check_tokens(conn, events)
        # Only wake-ups cross replicas, and only those someone elsewhere may
        # wait for; grants and ends are this process's to report.
        payloads = sorted({
            _encode(event) for event in events if isinstance(event, Freed) and event.remote
        })
        # Called inside `pipeline`, behind the batch's gathered writes
        # (batch.py): the notification and the commit go out with them, one
        # statement per message, and the answers are read at the pipeline's end.
        if payloads:
            wait_for(conn.execute(_NOTIFY_EACH, (CHANNEL, json.dumps(payloads))))
        wait_for(conn.execute("COMMIT"))

    def _check_tokens(self, conn: _Connection, events: list[Any]) -> None:
        """Refuse, before its commit, a batch whose database this process no
        longer writes to, or that drew a token at or below one this process
        had seen when the batch began: a database that went back without a
        change of name (SPEC §7.9). Nothing of it is committed; every
        connection is replaced, and the one that reaches this database again
        floors its tokens above every one seen."""
        drawn = [event.fencing_token for event in events
                 if type(event) is Granted and event.fencing_token is not None]
        if self.stale(conn):
            conn.identity = None
            raise _WentAway("the database of this connection is no longer the one written to")
        if not drawn:
            return
        lowest, highest = min(drawn), max(drawn)
        if lowest <= conn.floor:
            _log.error(
                "the store went back: %s drew fencing token %d, not above %d which this "
                "process had seen; nothing of the batch is committed, and tokens are floored "
                "again", conn.identity, lowest, conn.floor)
            conn.identity = None
            raise _WentAway(f"fencing token {lowest} drawn, not above {conn.floor}")
        if highest > self.high_water.get(TOKENS, 0):
            self.high_water[TOKENS] = highest

    def fatal(self, exc: BaseException) -> bool:
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            return True
        sqlstate = getattr(exc, "sqlstate", None) or ""
        return sqlstate in _REFUSED_WRITES or sqlstate[:2] in _UNUSABLE_CLASSES

    def now_ms(self) -> int:
        if self.clock_ms is not None:
            return self.clock_ms()
        db_ms, at = self.seen
        return db_ms + (steady_ns() - at) // 1_000_000

    def broken(self, conn: _Connection) -> bool:
        return bool(conn.closed or conn.broken)


def _encode(event: Freed) -> str:
    return json.dumps([event.kind, event.project, event.name, event.wake_all])


def _decode(payload: str) -> Freed | None:
    try:
        kind, project, name, wake_all = json.loads(payload)
        return Freed(str(kind), str(project), str(name), bool(wake_all))
    except (ValueError, TypeError):
        return None


def _read_standing(tx: Any) -> Standing:
    return standing_of(tuple(tx.execute(STANDING_SQL).fetchone()))


async def _standing(conn: _Connection) -> Standing:
    """A fresh connection's standing; a standby is refused: libpq's
    target_session_attrs=read-write avoids one with several hosts, and a
    single host that is a standby (demoted, or named by mistake) must not be
    read from either: it may lag the primary."""
    cursor = await conn.execute(STANDING_SQL)
    row = await cursor.fetchone()
    assert row is not None
    standing = standing_of(tuple(row))
    if standing.standby:
        raise psycopg.OperationalError(
            "the database is a standby (in recovery): fencepost reads and writes only "
            "on the primary"
        )
    return standing


def _report_replication(replication: Replication, first: bool) -> None:
    """Say in the log what confirms commits: at start-up, and on each change."""
    mode = replication.mode.value
    standbys = replication.standbys
    if mode == "async":
        _log.warning(
            "store replication: async (%d standbys attached asynchronously): a failover may "
            "lose acknowledged changes; fencing tokens never repeat (operations guide: High "
            "availability)", standbys)
    elif first or mode == "sync":
        _log.info("store replication: %s (%d standbys attached)", mode, standbys)
    else:
        _log.warning("store replication: %s now (%d standbys attached)", mode, standbys)


class _Listener:
    """A task on the event loop, with a connection of its own, LISTENing for
    other replicas' events. It runs on the loop rather than on a thread so
    that reading every notification (this replica's own among them) never
    contends with the loop for the interpreter lock."""

    def __init__(self, url: str, application_name: str, deliver: Callable[[Freed], None]) -> None:
        self._url = url
        self._application_name = application_name
        self._deliver = deliver
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """End the task (again: nothing)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    @property
    def listening(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                    application_name=self._application_name,
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    # Until the connection ends, which raises.
                    async for note in conn.notifies():
                        event = _decode(note.payload)
                        if event is not None:
                            self._deliver(event)
            except psycopg.Error as exc:
                # The database is away; until it is back, waiters rely on the
                # safety wake (server/waiting.py, SAFETY_WAKE_S).
                _log.error("listener: %s", exc)
                await asyncio.sleep(1.0)


class PostgresStore(SqlStore):
    url_scheme = "postgresql"

    def __init__(
        self, url: str, clock_ms: Callable[[], int] | None = None,
        readers: int = DEFAULT_READERS, writers: int = WRITER_CONNECTIONS,
        timeout_s: float = DEFAULT_STORE_TIMEOUT_S, require_sync: bool = False,
    ) -> None:
        self.url = url
        sessions = DatabaseSessions()
        self._engine = PostgresEngine(
            url, clock_ms, sessions.application_name, timeout_s, require_sync
        )
        self._listener: _Listener | None = None
        self._watcher: asyncio.Task[None] | None = None
        super().__init__(self._engine, sessions, readers, writers)
        self._engine.on_change = lambda change: self._publish([change])

    async def open(self) -> None:
        try:
            await self._refuse_a_standby()
            await asyncio.to_thread(
                apply_migrations, pg_url.migration_url(self.url), "postgresql"
            )
            await self._start()
        except psycopg.Error as exc:
            raise StoreUnavailable(f"Cannot open the PostgreSQL store: {exc}.") from exc

        def deliver(event: Freed) -> None:
            self._publish([event])

        self._listener = _Listener(self._engine.url, self._engine.application_name, deliver)
        self._listener.start()
        self._watcher = asyncio.get_running_loop().create_task(self._watch_standing())

    async def close(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        await super().close()

    async def _refuse_a_standby(self) -> None:
        """Before migrating: a standby named alone (or every host a standby)
        refuses writes, and its answers may lag the primary's. And a warning
        when autovacuum is off: every grant and end leaves a dead row, which
        only a vacuum makes reusable, so the tables would grow without bound."""
        async with await psycopg.AsyncConnection.connect(
            self._engine.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
        ) as conn:
            row = await (await conn.execute(
                "SELECT pg_is_in_recovery(), current_setting('autovacuum') = 'on'")).fetchone()
        if row is not None and not row[0] and not row[1]:
            _log.warning(
                "the database runs with autovacuum off: the rows of ended leases stay dead "
                "and fencepost's tables grow without bound; turn it on (operations guide: "
                "What the store keeps)")
        if row is not None and row[0]:
            raise StoreUnavailable(
                "Cannot open the PostgreSQL store: the database is a standby (in recovery); "
                "name the primary, or every host with target_session_attrs=read-write."
            )

    async def _watch_standing(self) -> None:
        """Read the store's standing every STANDING_EVERY_S (SPEC §6): the
        replication reported in /readyz and /metrics, and the token sequence's
        value, the high-water mark a floor on a new database starts above."""
        while True:
            await asyncio.sleep(STANDING_EVERY_S)
            try:
                standing = await self._read(_read_standing)
            except Exception as exc:  # noqa: BLE001 - an outage shows in /readyz already
                _log.debug("standing not read: %s", exc)
                continue
            self._engine.saw(standing)

    def replication(self) -> Replication | None:
        return self._engine.replication

    def went_back(self) -> WentBack | None:
        went_back = self._engine.went_back
        if went_back is None or wall_clock_ms() - went_back.at_ms > WENT_BACK_SHOWN_MS:
            return None
        return went_back

    async def check_ready(self) -> None:
        replication = self._engine.replication
        if self._engine.require_sync and (
                replication is None or replication.mode != "sync" or not replication.standbys):
            mode = "unknown" if replication is None else replication.mode.value
            raise StoreNotReplicated(
                f"No synchronous standby confirms commits (replication: {mode}); changes are "
                f"refused (--require-sync-replication)."
            )
        await super().check_ready()

    @property
    def new_databases(self) -> int:
        return self._engine.new_databases

    async def now_ms(self) -> int:
        """The database's clock as last seen, advanced by the monotonic clock,
        for decisions outside a transaction (key expiry); lease and slot expiry
        are judged inside the batch."""
        return self._engine.now_ms()
