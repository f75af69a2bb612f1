"""The Store protocol on top of a BatchWriter and the shared SQL statements.

Both backends are this class with a different Engine: the rules, the SQL and
the transaction boundaries are the same, which is what lets one conformance
suite hold them to the same behaviour.
"""

from __future__ import annotations

import itertools
from typing import Any, Awaitable, Callable, TypeVar

from fencepost.core.keys import hash_secret, new_secret
from fencepost.core.leases import AcquireRequest, FenceVerdict, Lease
from fencepost.core.sessions import Session, SessionEnd
from fencepost.core.slots import PoolConfig, Slot
from fencepost.errors import NotFound, SessionLost, StoreUnavailable
from fencepost.events import SessionChanged
from fencepost.store.base import (
    SESSION_SHOWN,
    AcquireResult,
    BatchObserver,
    Census,
    EventListener,
    ForceReleased,
    ForceReleaser,
    Freed,
    FreedListener,
    KeyRecord,
    LockView,
    NewKey,
    PoolView,
    SessionEnded,
    SessionView,
    SetAttempt,
    SlotAttempt,
    SlotHolderView,
    SlotReport,
)
from fencepost.store.batch import (
    NO_KEYS,
    BatchWriter,
    Engine,
    Key,
    Keys,
    Refused,
    Tx,
    refused_before_writing,
)
from fencepost.store.health import WriteHealth, probe_writes
from fencepost.store.sql import (
    census,
    ended,
    fencing,
    keys,
    lines,
    locks,
    pools,
    sessions,
    slot_holders,
)
from fencepost.store.sql.known_leases import KnownLeases
from fencepost.store.sql.replicas import Liveness, Place
from fencepost.store.standing import Replication, WentBack

T = TypeVar("T")

# While nothing else writes, a write probe this often keeps /readyz truthful
# about writes (a full disk, a database that turned read-only).
WRITE_PROBE_EVERY_MS = 1_000
# Why a lease ended is kept this long, so a late renewal learns the reason.
# How long an ended lease (and an ended session) is remembered by default
# (SPEC §6, `--ended-retention`): a late renewal is told why its lease ended,
# and a fence check why a token is stale, for this long.
DEFAULT_ENDED_RETENTION_MS = 24 * 3_600_000
_PRUNE_EVERY_MS = 60_000
# The most leases (and, separately, slots, waiters, lock delays and ended-lease
# records) one reaper pass ends. A pass is one batch on the writer, and every
# request queued behind it waits for it: bounded, a mass expiry (100,000 leases
# at once) becomes many short batches with other requests' batches between
# them, instead of one that stalls every request for seconds. Ending a
# thousand leases takes a few tens of milliseconds, so a normal load still
# ends in one pass, well within SPEC §7.4's second.
REAP_BOUND = 1_000


DEFAULT_READERS = 2
# Key management (create, refresh, revoke, bootstrap) is rare, and a refresh
# must not slip past a revocation of its parent: all of it is one key.
_KEY_MANAGEMENT: Keys = (Key("api_keys", "", ""),)


def _quota_of(key_id: str) -> Keys:
    return (Key("quota", "", key_id),)


class SqlStore:
    url_scheme = "sql"

    def __init__(
        self, engine: Engine, liveness: Liveness, readers: int = DEFAULT_READERS,
        writers: int = 1,
    ) -> None:
        # Which replica this process is, stamped on its waiter rows, and how
        # the backend tells which replicas died (see sql/replicas.py).
        self._liveness = liveness
        self._listeners: list[FreedListener] = []
        self._event_listeners: list[EventListener] = []
        self.health = WriteHealth()
        self.writers = writers
        # `writers` connections, each running one batch at a time; batches on
        # different keys run concurrently (see batch.py).
        self._writer = BatchWriter(
            engine, self._publish, on_failure=self.health.failed, connections=writers
        )
        # Reads run on their own connections, so a GET never queues behind a
        # write batch (nor, on PostgreSQL, behind other replicas' batches).
        self._readers = [
            BatchWriter(engine, self._publish, name=f"reader-{i}", exclusive=False)
            for i in range(readers)
        ]
        for reader in self._readers:
            reader.answer_when_durable(self._writer)
        self._next_reader = itertools.cycle(self._readers or [self._writer])
        self._pepper = b""
        self._known = KnownLeases()  # shared by the writer's threads
        self._known_pools = pools.KnownPools()  # likewise
        self._last_prune_ms = 0
        # While set, pruning the memory of ended leases older than this goes on
        # pass after pass until it is done.
        self._forget_before_ms: int | None = None
        self.ended_retention_ms = DEFAULT_ENDED_RETENTION_MS
        self._last_probe_ms = 0
        self.reap_bound = REAP_BOUND

    def _read(self, fn: Callable[[Tx], T | Refused]) -> Awaitable[T]:
        return next(self._next_reader).run(fn, NO_KEYS)  # a read-only snapshot holds nothing

    # --- lifecycle (backends extend open/close) ----------------------------
    async def _start(self) -> None:
        await self._writer.open()
        for reader in self._readers:
            await reader.open()
        self._pepper = (
            await self._writer.run(keys.load_pepper, _KEY_MANAGEMENT, upkeep=True)
        ).encode()
        # This replica's own row, and the sequence or counter in one statement.
        await self._writer.run(self._liveness.register, NO_KEYS, upkeep=True)
        await self._writer.run(fencing.floor_at_clock, NO_KEYS, upkeep=True)

    def _place(self, alive_ms: int) -> Place:
        return Place(self._liveness.replica, alive_ms)

    async def close(self) -> None:
        for batcher in [self._writer, *self._readers]:
            await batcher.close()

    async def ping(self) -> None:
        await self._read(lambda tx: tx.execute("SELECT 1").fetchone())

    def lost(self) -> str | None:
        """Why the store can no longer be trusted in this process (its file
        deleted or replaced), or None."""
        return None

    async def check_ready(self) -> None:
        lost = self.lost()
        if lost is not None:
            raise StoreUnavailable(f"The store file is lost ({lost}); restart the server.")
        failure = self.health.failure
        if failure is not None:
            raise StoreUnavailable(f"The last write failed: {failure}")
        await self.ping()

    def replication(self) -> Replication | None:
        return None  # an SQLite file replicates nothing (PostgresStore reads its database's)

    def went_back(self) -> WentBack | None:
        return None  # an SQLite file has no other copy to go back to (PostgresStore's may)

    def add_freed_listener(self, listener: FreedListener) -> None:
        self._listeners.append(listener)

    def add_event_listener(self, listener: EventListener) -> None:
        self._event_listeners.append(listener)

    def watch_batches(self, observer: BatchObserver) -> None:
        self._writer.observer = lambda size, seconds, failed, replayed: observer(
            True, size, seconds, failed, replayed
        )
        for reader in self._readers:
            reader.observer = lambda size, seconds, failed, replayed: observer(
                False, size, seconds, failed, replayed
            )

    async def census(self) -> Census:
        return await self._read(census.read)

    def _publish(self, events: list[Any]) -> None:
        # Wake-ups (Freed, also heard from other replicas) go to the waiters;
        # this process's grants and ends go to the event listeners.
        for event in events:
            if isinstance(event, Freed):
                for listener in self._listeners:
                    listener(event)
            else:
                for reported in self._event_listeners:
                    reported(event)

    # --- projects and keys -------------------------------------------------
    async def bootstrap(self, secret: str | None) -> str | None:
        return await self._writer.run(
            lambda tx: keys.bootstrap(tx, self._pepper, secret), _KEY_MANAGEMENT, upkeep=True
        )

    async def create_project(self, name: str) -> str:
        return await self._writer.run(
            lambda tx: keys.create_project(tx, self._pepper, name), _KEY_MANAGEMENT
        )

    async def create_key(self, project: str, new: NewKey) -> tuple[KeyRecord, str]:
        secret = new_secret()
        record = await self._writer.run(
            lambda tx: keys.insert_key(tx, self._pepper, project, new, secret), _KEY_MANAGEMENT
        )
        return record, secret

    async def recover_admin_key(self, project: str) -> tuple[KeyRecord, str]:
        secret = new_secret()
        record = await self._writer.run(
            lambda tx: keys.recover_admin_key(tx, self._pepper, project, secret),
            _KEY_MANAGEMENT,
        )
        return record, secret

    async def list_keys(
        self, project: str, after: str | None = None, limit: int | None = None
    ) -> list[KeyRecord]:
        return await self._read(lambda tx: keys.list_keys(tx, project, after, limit))

    async def revoke_key(self, project: str, key_id: str) -> bool:
        return await self._writer.run(
            lambda tx: keys.revoke_key(tx, project, key_id), _KEY_MANAGEMENT
        )

    async def retire_key(
        self, project: str, key_id: str, by_key_id: str, by_admin: bool
    ) -> KeyRecord | None:
        return await self._writer.run(
            lambda tx: keys.retire_key(tx, project, key_id, by_key_id, by_admin),
            _KEY_MANAGEMENT,
        )

    async def refresh_key(
        self, key_id: str, expires_in_ms: int | None, retire_previous: bool = False
    ) -> tuple[KeyRecord, str]:
        secret = new_secret()
        record = await self._writer.run(
            lambda tx: keys.refresh_key(
                tx, self._pepper, key_id, expires_in_ms, secret, retire_previous),
            _KEY_MANAGEMENT,
        )
        return record, secret

    async def find_key(self, secret: str) -> KeyRecord | None:
        wanted = hash_secret(secret, self._pepper)
        return await self._read(lambda tx: keys.find_key(tx, wanted))

    async def project_exists(self, project: str) -> bool:
        return await self._read(lambda tx: keys.project_exists(tx, project))

    async def note_identity(
        self, project: str, caller_id: str, name: str | None, app_key_id: str | None
    ) -> None:
        # Upkeep: a name is remembered whatever the replication, like a quota's count.
        await self._writer.run(
            lambda tx: keys.note_identity(tx, project, caller_id, name, app_key_id),
            (Key("identity", project, caller_id),), upkeep=True,
        )

    async def admit_request(self, key_id: str, per_minute: int) -> int | None:
        # Upkeep: a quota counts reads too, which no want of replication refuses.
        return await self._writer.run(
            lambda tx: keys.admit_request(tx, key_id, per_minute), _quota_of(key_id),
            upkeep=True,
        )

    # --- locks ---------------------------------------------------------------
    async def acquire_lock(
        self, project: str, key: str, request: AcquireRequest, *, wait_alive_ms: int | None
    ) -> AcquireResult:
        place = None if wait_alive_ms is None else self._place(wait_alive_ms)
        if request.session_id is not None:
            return await self._writer.run(
                lambda tx: locks.acquire_attached(tx, self._known, project, key, request, place),
                locks.key_of(project, key) + sessions.key_of(project, request.session_id),
            )
        return await self._writer.run_steps(
            lambda tx: locks.acquire(tx, self._known, project, key, request, place),
            locks.key_of(project, key),
        )

    async def retry_waiter(
        self, project: str, key: str, request: AcquireRequest, ticket: int, alive_ms: int
    ) -> AcquireResult:
        place = self._place(alive_ms)
        return await self._writer.run(
            lambda tx: locks.retry_waiter(tx, self._known, project, key, request, ticket, place),
            locks.key_of(project, key) + sessions.key_of(project, request.session_id),
        )

    async def acquire_lock_set(
        self, project: str, keys: list[str], request: AcquireRequest, *,
        wait_alive_ms: int | None,
    ) -> SetAttempt:
        place = None if wait_alive_ms is None else self._place(wait_alive_ms)
        return await self._writer.run(
            lambda tx: locks.acquire_set(tx, self._known, project, keys, request, place),
            locks.keys_of(project, keys) + sessions.key_of(project, request.session_id),
        )

    async def retry_set_waiter(
        self, project: str, keys: list[str], request: AcquireRequest, ticket: int,
        alive_ms: int,
    ) -> SetAttempt:
        place = self._place(alive_ms)
        return await self._writer.run(
            lambda tx: locks.retry_set_waiter(
                tx, self._known, project, keys, request, ticket, place
            ),
            locks.keys_of(project, keys) + sessions.key_of(project, request.session_id),
        )

    async def leave_line(self, project: str, key: str, ticket: int) -> None:
        # Tickets are unique across locks (a set's one ticket names its places
        # in every line), so the ticket alone says which places to give up.
        await self._writer.run(
            lambda tx: locks.leave_line(tx, ticket), locks.key_of(project, key), upkeep=True
        )

    async def leave_set_line(self, project: str, keys: list[str], ticket: int) -> None:
        await self._writer.run(
            lambda tx: locks.leave_line(tx, ticket), locks.keys_of(project, keys), upkeep=True
        )

    async def renew_lock(self, project: str, key: str, lock_token: str, ttl_seconds: int) -> Lease:
        return await self._writer.run_steps(
            lambda tx: locks.renew(tx, self._known, project, key, lock_token, ttl_seconds),
            locks.key_of(project, key),
        )

    async def release_lock(self, project: str, key: str, lock_token: str) -> bool:
        return await self._writer.run_steps(
            lambda tx: locks.release(tx, self._known, project, key, lock_token),
            locks.key_of(project, key),
        )

    async def force_release(self, project: str, key: str, by: ForceReleaser) -> ForceReleased:
        return await self._writer.run(
            lambda tx: locks.force_release(tx, self._known, project, key, by),
            locks.key_of(project, key),
        )

    async def get_lock(self, project: str, key: str) -> LockView:
        return await self._read(lambda tx: locks.view(tx, project, key))

    async def fence_check(self, project: str, key: str, token: int) -> FenceVerdict:
        return await self._read(lambda tx: locks.fence_check(tx, project, key, token))

    async def list_locks(
        self, project: str, prefix: str, after: str | None, limit: int
    ) -> list[LockView]:
        return await self._read(lambda tx: locks.list_views(tx, project, prefix, after, limit))

    # --- pools ---------------------------------------------------------------
    async def put_pool(self, project: str, name: str, config: PoolConfig) -> tuple[PoolView, bool]:
        return await self._writer.run(
            lambda tx: pools.put(tx, self._known_pools, project, name, config),
            pools.key_of(project, name),
        )

    async def get_pool(self, project: str, name: str) -> PoolView | None:
        return await self._read(lambda tx: pools.view(tx, project, name))

    async def list_pools(
        self, project: str, prefix: str, after: str | None, limit: int
    ) -> list[PoolView]:
        return await self._read(lambda tx: pools.list_views(tx, project, prefix, after, limit))

    async def delete_pool(self, project: str, name: str) -> bool:
        return await self._writer.run(
            lambda tx: pools.delete(tx, self._known_pools, project, name),
            pools.key_of(project, name),
        )

    async def acquire_slot(
        self, project: str, pool: str, *, wait_ms: int = 0, no_queue: bool = False,
        wait_alive_ms: int | None, key_id: str | None = None, session_id: str | None = None,
        cost: int | None = None,
    ) -> SlotAttempt:
        place = None if wait_alive_ms is None else self._place(wait_alive_ms)
        known = self._known_pools
        wanted = pools.Wanted(wait_ms, no_queue, cost)
        if session_id is not None:
            # A plain operation: the pool's existence, then the session, are
            # read before anything else (an unknown pool is 404 first, SPEC §4.2),
            # so either refusal comes before anything is written.
            def attached(tx: Tx) -> SlotAttempt | Refused:
                missing = refused_before_writing(
                    lambda: pools.require(tx, project, pool), NotFound
                )
                if isinstance(missing, Refused):
                    return missing
                return _attached_slot(
                    tx, project, key_id, session_id,
                    lambda: pools.acquire(tx, known, project, pool, wanted, place),
                )

            return await self._writer.run(
                attached, pools.key_of(project, pool) + sessions.key_of(project, session_id)
            )
        return await self._writer.run_steps(
            lambda tx: pools.acquire_step(
                tx, known, project, pool, key_id, wanted,
                lambda: slot_holders.stamp_holder(
                    tx, pools.acquire(tx, known, project, pool, wanted, place), key_id
                ),
            ),
            pools.key_of(project, pool),
        )

    async def retry_slot_waiter(
        self, project: str, pool: str, ticket: int, alive_ms: int, key_id: str | None = None,
        session_id: str | None = None, cost: int | None = None,
    ) -> SlotAttempt:
        place = self._place(alive_ms)
        return await self._writer.run(
            lambda tx: _attached_slot(
                tx, project, key_id, session_id,
                lambda: pools.retry_waiter(tx, self._known_pools, project, pool, ticket, place,
                                           cost),
            ),
            pools.key_of(project, pool) + sessions.key_of(project, session_id),
        )

    async def list_slots(self, project: str, pool: str) -> list[SlotHolderView]:
        return await self._read(lambda tx: slot_holders.list_slots(tx, project, pool))

    async def leave_slot_line(self, project: str, pool: str, ticket: int) -> None:
        await self._writer.run(
            lambda tx: pools.leave_line(tx, project, pool, ticket), pools.key_of(project, pool),
            upkeep=True,
        )

    async def renew_slot(self, project: str, pool: str, slot_id: str) -> Slot:
        return await self._writer.run_steps(
            lambda tx: pools.renew(tx, self._known_pools, project, pool, slot_id),
            pools.key_of(project, pool),
        )

    async def release_slot(
        self, project: str, pool: str, slot_id: str, report: SlotReport | None
    ) -> bool:
        return await self._writer.run_steps(
            lambda tx: pools.release(tx, self._known_pools, project, pool, slot_id, report),
            pools.key_of(project, pool),
        )

    # --- sessions ------------------------------------------------------------------
    async def create_session(
        self, project: str, key_id: str, ttl_seconds: int, name: str | None,
        lineage: str | None = None,
    ) -> Session:
        # The lineage's count of live sessions is read, then grown: creations
        # by the keys of one lineage take turns, on every replica (the new
        # row's id is drawn inside: nobody knows it).
        return await self._writer.run(
            lambda tx: sessions.create(tx, project, key_id, ttl_seconds, name),
            (Key("sessions_of", project, lineage or key_id),),
        )

    async def _with_attached(
        self, project: str, key_id: str, session_id: str, fn: Callable[[Tx], T | Refused]
    ) -> T:
        """Run `fn`, which moves or ends what is attached to the session, with
        the session's key and the key of every lock and pool attached to it
        declared (see batch.py). They are read first; attaching declares the
        session's key too, so once the batch holds it nothing new attaches, and
        a lease or slot attached between the read and the batch makes it read
        again."""
        while True:
            attached = await self._read(
                lambda tx: sessions.attached_keys(tx, project, session_id)
            )
            declared = set(attached)

            def op(tx: Tx, declared: set[Key] = declared) -> T | Refused:
                if not set(sessions.attached_keys(tx, project, session_id)) <= declared:
                    return Refused(_AttachedMoved())  # read, nothing written: try again
                return fn(tx)

            try:
                return await self._writer.run(
                    op, sessions.key_of(project, session_id) + tuple(sorted(declared))
                )
            except _AttachedMoved:
                continue

    async def renew_session(
        self, project: str, key_id: str, session_id: str, ttl_seconds: int
    ) -> Session:
        def op(tx: Tx) -> Session | Refused:
            # Contract: the session and everything attached move together, so an
            # attached lease never outlives, nor dies before, its session.
            renewed = sessions.renew(tx, project, session_id, key_id, ttl_seconds)
            if isinstance(renewed, Refused):
                return renewed
            locks.follow_session(tx, session_id, renewed.expires_ms)
            pools.follow_session(tx, session_id, renewed.expires_ms)
            return renewed

        return await self._with_attached(project, key_id, session_id, op)

    async def end_session(self, project: str, key_id: str, session_id: str) -> SessionEnded:
        def op(tx: Tx) -> SessionEnded | Refused:
            marked = sessions.mark_ended(tx, project, session_id, key_id)
            if isinstance(marked, Refused):
                return marked
            if not marked:
                return SessionEnded(False, 0, 0)
            leases = locks.end_attached(tx, self._known, session_id)
            slots = pools.end_attached(tx, session_id)
            tx.events.append(SessionChanged(
                "ended", project, SessionEnd.ENDED.value, tx.origin, leases, slots
            ))
            return SessionEnded(True, leases, slots)

        return await self._with_attached(project, key_id, session_id, op)

    async def get_session(self, project: str, key_id: str, session_id: str) -> SessionView:
        def op(tx: Tx) -> SessionView | Refused:
            # A read: nothing is written, whatever it finds.
            session = refused_before_writing(
                lambda: sessions.load(tx, project, session_id, key_id), NotFound
            )
            if isinstance(session, Refused):
                return session
            keys, leases = locks.held_by_session(tx, session_id, SESSION_SHOWN)
            held = pools.held_by_session(tx, session_id, SESSION_SHOWN)
            slots = sessions.count_slots(tx, session_id)
            return SessionView(session, tx.now_ms, keys, leases, held, slots)

        return await self._read(op)

    # --- background ------------------------------------------------------------
    async def keep_waiting(
        self, waiting: dict[tuple[str, str, str], list[int]], alive_ms: int
    ) -> dict[tuple[str, str, str], list[int]]:
        # Ahead of the operations waiting on those lines: behind a backlog
        # (10,000 waiters joining at once) places would run out first.
        return await self._writer.run(
            lambda tx: lines.keep(tx, waiting, alive_ms), lines.keys(waiting), ahead=True,
            upkeep=True,
        )

    async def reap(self) -> int:
        freed = 0
        while True:
            ended, more = await self.reap_pass()
            freed += ended
            if not more:
                return freed

    async def reap_pass(self) -> tuple[int, bool]:
        """One pass of `reap`, in one batch: end at most `reap_bound` leases
        and as many slots (and of each kind of waiter); return how many leases
        and slots it ended, and whether a bound was reached (then another pass
        should follow at once)."""
        probed: int | None = None  # failures counted when the probe was written

        def op(tx: Tx) -> tuple[int, bool]:
            nonlocal probed
            # Often enough that what is kept stays near the retention window
            # however short it is set.
            if tx.now_ms - self._last_prune_ms >= min(_PRUNE_EVERY_MS,
                                                      max(1_000, self.ended_retention_ms // 4)):
                self._last_prune_ms = tx.now_ms
                self._forget_before_ms = tx.now_ms - self.ended_retention_ms
            for dead in self._liveness.dead_replicas(tx):
                # A dead replica's waiters leave every line at once (SPEC §7.4).
                locks.drop_waiters_of(tx, dead)
                pools.drop_waiters_of(tx, dead)
            if not (0 <= tx.now_ms - self._last_probe_ms < WRITE_PROBE_EVERY_MS):
                self._last_probe_ms = tx.now_ms
                probe_writes(tx)
                probed = self.health.failures
            sessions_ended, more_sessions = sessions.reap(tx, self.reap_bound)
            leases, more_locks = locks.reap(tx, self._known, self.reap_bound)
            slots, more_slots = pools.reap(tx, self.reap_bound)
            more_memory = False
            if self._forget_before_ms is not None:
                more_memory = ended.forget(tx, self._forget_before_ms, self.reap_bound)
                forgotten = sessions.forget(tx, self._forget_before_ms, self.reap_bound)
                more_memory = more_memory or forgotten
                if not more_memory:
                    self._forget_before_ms = None
            more = more_sessions or more_locks or more_slots or more_memory
            return leases + slots, more

        # No keys declared: the reaper claims what it ends (see sql/bounded.py).
        reaped, more = await self._writer.run(op, NO_KEYS, upkeep=True)
        if probed is not None:  # it committed: writes work (again)
            self.health.succeeded(probed)
        return reaped, more


class _AttachedMoved(Exception):
    """A lease or slot was attached to a session between the read of its keys
    and the batch that moves or ends them: read them again."""


def _attached_slot(
    tx: Tx, project: str, key_id: str | None, session_id: str | None,
    admit: Callable[[], SlotAttempt | Refused],
) -> SlotAttempt | Refused:
    """Admit (or queue) as `admit` does, recording who took the slot and, with
    a session, attaching it. The session is checked before admission, so a
    caller whose session has ended neither gets a slot nor joins the line:
    an unknown, foreign or ended session is Refused, and every caller reads
    it before its operation writes anything."""
    session: Session | None = None
    if session_id is not None:
        live = refused_before_writing(
            lambda: sessions.live(tx, project, session_id, key_id), NotFound, SessionLost
        )
        if isinstance(live, Refused):
            return live
        session = live
    attempt = slot_holders.stamp_holder(tx, admit(), key_id)
    if session is None or isinstance(attempt, Refused):
        return attempt
    return pools.attach(tx, attempt, session.session_id, session.expires_ms)
