"""The embedded SQLite store: one file, one server process, WAL and group commit.

Every public method is one transaction run by the BatchWriter thread; see
sqlite_batch.py for how concurrent calls share a commit (and an fsync).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sqlite3
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from fencepost.clock import wall_clock_ms
from fencepost.core import leases as rules
from fencepost.core.keys import Role, hash_secret, new_key_id, new_secret, same_hash
from fencepost.core.leases import AcquireRequest, EndReason, Granted, Lease, OnExpiry
from fencepost.core.slots import PoolConfig, Slot
from fencepost.errors import Conflict, StoreUnavailable
from fencepost.store import sqlite_pools as pools
from fencepost.store.base import (
    AcquireResult,
    ForceReleased,
    FreedListener,
    KeyRecord,
    LockView,
    NewKey,
    PoolView,
    SlotAttempt,
    SlotReport,
    lock_freed,
)
from fencepost.store.sqlite_batch import BatchWriter, Tx

# Why a lease ended is kept this long, so a late renewal learns the reason.
ENDED_LEASE_MEMORY_MS = 24 * 3_600_000
_PRUNE_EVERY_MS = 60_000


def _migrations_dir() -> str:
    return str(resources.files("fencepost.store").joinpath("migrations", "sqlite"))


def apply_migrations(path: str) -> None:
    """Bring the schema up to date with yoyo; its lock table serialises concurrent starts."""
    from yoyo import get_backend, read_migrations

    backend = get_backend(f"sqlite:///{path}")
    try:
        with backend.lock():
            backend.apply_migrations(backend.to_apply(read_migrations(_migrations_dir())))
    finally:
        backend.connection.close()


_LEASE_COLUMNS = (
    "key, lock_token, fencing_token, acquired_ms, expires_ms, deadline_ms, "
    "operation, metadata, on_expiry"
)
_KEY_COLUMNS = (
    "id, project, role, name, secret_hash, created_ms, expires_ms, allow_ips, rpm_quota, revoked_ms"
)


def _lease(row: Any) -> Lease:
    return Lease(
        key=row[0],
        lock_token=row[1],
        fencing_token=row[2],
        acquired_ms=row[3],
        expires_ms=row[4],
        deadline_ms=row[5],
        operation=row[6],
        metadata_json=row[7],
        on_expiry=OnExpiry(row[8]),
    )


def _key_record(row: Any) -> KeyRecord:
    return KeyRecord(
        id=row[0],
        project=row[1],
        role=Role.parse(row[2]),
        name=row[3],
        secret_hash=row[4],
        created_ms=row[5],
        expires_ms=row[6],
        allow_ips=list(json.loads(row[7])),
        rpm_quota=row[8],
        revoked_ms=row[9],
    )


class SqliteStore:
    url_scheme = "sqlite"

    def __init__(self, path: str, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        self.path = path
        self._clock_ms = clock_ms
        self._listeners: list[FreedListener] = []
        self._writer = BatchWriter(self._connect, clock_ms, self._publish)
        self._pepper = b""
        self._last_prune_ms = 0

    # --- lifecycle ---------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: the WAL is fsynced at every commit, so an acknowledged write
        # survives a crash of the process and of the machine. Group commit pays
        # for one fsync per batch, not per request.
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=10000")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    async def open(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            await asyncio.to_thread(apply_migrations, self.path)
            self._writer.start()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"Cannot open the SQLite store at {self.path}: {exc}.") from exc
        self._pepper = (await self._writer.run(_load_pepper)).encode()
        # Embedded means one server process: waiters left by a crashed
        # process can never be answered, so they leave the line now.
        await self._writer.run(_clear_waiters)

    async def close(self) -> None:
        await asyncio.to_thread(self._writer.stop)

    async def ping(self) -> None:
        await self._writer.run(lambda tx: tx.conn.execute("SELECT 1").fetchone())

    def add_freed_listener(self, listener: FreedListener) -> None:
        self._listeners.append(listener)

    def _publish(self, events: list[Any]) -> None:
        for event in events:
            for listener in self._listeners:
                listener(event)

    async def now_ms(self) -> int:
        return self._clock_ms()

    # --- projects and keys -------------------------------------------------
    async def bootstrap(self, secret: str | None) -> str | None:
        pepper = self._pepper

        def op(tx: Tx) -> str | None:
            # Contract: a store that already has any key is left untouched, so
            # restarts never mint a second bootstrap key.
            if tx.conn.execute("SELECT 1 FROM api_keys LIMIT 1").fetchone():
                return None
            tx.conn.execute(
                "INSERT OR IGNORE INTO projects (name, created_ms) VALUES ('default', ?)",
                (tx.now_ms,),
            )
            chosen = secret or new_secret()
            _insert_key(tx, pepper, "default", NewKey(Role.ADMIN, name="bootstrap"), chosen)
            return chosen

        return await self._writer.run(op)

    async def create_project(self, name: str) -> str:
        pepper = self._pepper

        def op(tx: Tx) -> str:
            try:
                tx.conn.execute(
                    "INSERT INTO projects (name, created_ms) VALUES (?, ?)", (name, tx.now_ms)
                )
            except sqlite3.IntegrityError:
                raise Conflict(f"Project {name!r} already exists.") from None
            secret = new_secret()
            _insert_key(tx, pepper, name, NewKey(Role.ADMIN, name="first admin"), secret)
            return secret

        return await self._writer.run(op)

    async def create_key(self, project: str, new: NewKey) -> tuple[KeyRecord, str]:
        pepper = self._pepper

        def op(tx: Tx) -> tuple[KeyRecord, str]:
            secret = new_secret()
            return _insert_key(tx, pepper, project, new, secret), secret

        return await self._writer.run(op)

    async def list_keys(self, project: str) -> list[KeyRecord]:
        def op(tx: Tx) -> list[KeyRecord]:
            rows = tx.conn.execute(
                f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE project = ? ORDER BY created_ms, id",
                (project,),
            )
            return [_key_record(row) for row in rows]

        return await self._writer.run(op)

    async def revoke_key(self, project: str, key_id: str) -> bool:
        def op(tx: Tx) -> bool:
            # Contract: scoped by project, so one project can never revoke
            # another's key; revoking twice keeps the first revocation time.
            cur = tx.conn.execute(
                "UPDATE api_keys SET revoked_ms = COALESCE(revoked_ms, ?) "
                "WHERE id = ? AND project = ?",
                (tx.now_ms, key_id, project),
            )
            return cur.rowcount > 0

        return await self._writer.run(op)

    async def find_key(self, secret: str) -> KeyRecord | None:
        wanted = hash_secret(secret, self._pepper)

        def op(tx: Tx) -> KeyRecord | None:
            row = tx.conn.execute(
                f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE secret_hash = ?", (wanted,)
            ).fetchone()
            if row is None or not same_hash(row[4], wanted):
                return None
            return _key_record(row)

        return await self._writer.run(op)

    # --- locks ---------------------------------------------------------------
    async def acquire_lock(
        self, project: str, key: str, request: AcquireRequest, *, wait_alive_ms: int | None
    ) -> AcquireResult:
        def op(tx: Tx) -> AcquireResult:
            ahead = _live_waiters(tx, project, key, before_ticket=None)
            outcome = _acquire(tx, project, key, request, ahead)
            if isinstance(outcome, Granted) or wait_alive_ms is None:
                return AcquireResult(outcome)
            return AcquireResult(outcome, _join_line(tx, project, key, request, wait_alive_ms))

        return await self._writer.run(op)

    async def retry_waiter(
        self, project: str, key: str, request: AcquireRequest, ticket: int, alive_ms: int
    ) -> AcquireResult:
        def op(tx: Tx) -> AcquireResult:
            # Contract: only the live waiter with the smallest ticket may take a
            # free lock, so waiters are granted in arrival order.
            still_in_line = tx.conn.execute(
                "UPDATE lock_waiters SET alive_until_ms = ? WHERE ticket = ?",
                (tx.now_ms + alive_ms, ticket),
            ).rowcount
            if not still_in_line:  # dropped as dead (e.g. a stalled loop): rejoin at the back
                ticket_now = _join_line(tx, project, key, request, alive_ms)
            else:
                ticket_now = ticket
            ahead = _live_waiters(tx, project, key, before_ticket=ticket_now)
            outcome = _acquire(tx, project, key, request, ahead)
            if isinstance(outcome, Granted):
                tx.conn.execute("DELETE FROM lock_waiters WHERE ticket = ?", (ticket_now,))
                return AcquireResult(outcome)
            return AcquireResult(outcome, ticket_now)

        return await self._writer.run(op)

    async def leave_line(self, project: str, key: str, ticket: int) -> None:
        def op(tx: Tx) -> None:
            if tx.conn.execute("DELETE FROM lock_waiters WHERE ticket = ?", (ticket,)).rowcount:
                # The next in line may be able to take a free lock now.
                tx.events.append(lock_freed(project, key))

        await self._writer.run(op)

    async def renew_lock(self, project: str, key: str, lock_token: str, ttl_seconds: int) -> Lease:
        def op(tx: Tx) -> Lease:
            current = _load_lease(tx, project, key)
            ended = None
            if current is None or current.lock_token != lock_token:
                ended = _ended_reason(tx, project, key, lock_token)
            renewed = rules.decide_renew(current, lock_token, ttl_seconds, tx.now_ms, ended)
            # Contract: the lease row changes only if it is still this token's.
            tx.conn.execute(
                "UPDATE locks SET expires_ms = ?, dies_ms = ? "
                "WHERE project = ? AND key = ? AND lock_token = ?",
                (renewed.expires_ms, rules.end_of_life_ms(renewed), project, key, lock_token),
            )
            return renewed

        return await self._writer.run(op)

    async def release_lock(self, project: str, key: str, lock_token: str) -> bool:
        def op(tx: Tx) -> bool:
            current = _load_lease(tx, project, key)
            if not rules.holds(current, lock_token, tx.now_ms):
                return False
            _end_lease(tx, project, key, lock_token, EndReason.RELEASED)
            return True

        return await self._writer.run(op)

    async def force_release(self, project: str, key: str) -> ForceReleased:
        def op(tx: Tx) -> ForceReleased:
            current = _load_lease(tx, project, key)
            if current is None or not rules.is_live(current, tx.now_ms):
                if current is not None:  # dead but not yet reaped
                    _end_lease(tx, project, key, current.lock_token, EndReason.EXPIRED)
                return ForceReleased(key, None, tx.now_ms)
            _end_lease(tx, project, key, current.lock_token, EndReason.FORCE_RELEASED)
            return ForceReleased(key, current, tx.now_ms)

        return await self._writer.run(op)

    async def get_lock(self, project: str, key: str) -> LockView:
        def op(tx: Tx) -> LockView:
            lease = _load_lease(tx, project, key)
            if lease is not None and not rules.is_live(lease, tx.now_ms):
                lease = None
            return LockView(key, lease, _live_waiters(tx, project, key, None), tx.now_ms)

        return await self._writer.run(op)

    async def list_locks(
        self, project: str, prefix: str, after: str | None, limit: int
    ) -> list[LockView]:
        def op(tx: Tx) -> list[LockView]:
            # Range scan on the primary key: keys >= prefix and < prefix + U+10FFFF
            # are exactly the keys starting with prefix (names are ASCII).
            low = max(prefix, after or "")
            rows = tx.conn.execute(
                f"SELECT {_LEASE_COLUMNS} FROM locks WHERE project = ? AND key >= ? "
                "AND key < ? AND key > ? AND dies_ms > ? ORDER BY key LIMIT ?",
                (project, low, prefix + "\U0010ffff", after or "", tx.now_ms, limit),
            )
            views = []
            for row in rows.fetchall():
                lease = _lease(row)
                waiters = _live_waiters(tx, project, lease.key, None)
                views.append(LockView(lease.key, lease, waiters, tx.now_ms))
            return views

        return await self._writer.run(op)

    async def reap(self) -> int:
        def op(tx: Tx) -> int:
            # Contract: deletes exactly the leases that are dead by the store's
            # clock; running it twice, or on two servers at once, frees nothing twice.
            dead = tx.conn.execute(
                "DELETE FROM locks WHERE dies_ms <= ? RETURNING project, key, lock_token",
                (tx.now_ms,),
            ).fetchall()
            for project, key, token in dead:
                _remember_end(tx, project, key, token, EndReason.EXPIRED)
                tx.events.append(lock_freed(project, key))
            gone = tx.conn.execute(
                "DELETE FROM lock_waiters WHERE alive_until_ms <= ? RETURNING project, key",
                (tx.now_ms,),
            ).fetchall()
            for project, key in set(gone):
                tx.events.append(lock_freed(project, key))
            reclaimed = pools.reap(tx)
            if tx.now_ms - self._last_prune_ms >= _PRUNE_EVERY_MS:
                self._last_prune_ms = tx.now_ms
                tx.conn.execute(
                    "DELETE FROM ended_leases WHERE ended_ms < ?",
                    (tx.now_ms - ENDED_LEASE_MEMORY_MS,),
                )
            return len(dead) + reclaimed

        return await self._writer.run(op)

    # --- pools ---------------------------------------------------------------
    async def put_pool(self, project: str, name: str, config: PoolConfig) -> tuple[PoolView, bool]:
        return await self._writer.run(lambda tx: pools.put(tx, project, name, config))

    async def get_pool(self, project: str, name: str) -> PoolView | None:
        return await self._writer.run(lambda tx: pools.view(tx, project, name))

    async def list_pools(
        self, project: str, prefix: str, after: str | None, limit: int
    ) -> list[PoolView]:
        return await self._writer.run(
            lambda tx: pools.list_views(tx, project, prefix, after, limit)
        )

    async def delete_pool(self, project: str, name: str) -> bool:
        return await self._writer.run(lambda tx: pools.delete(tx, project, name))

    async def acquire_slot(
        self, project: str, pool: str, *, wait_alive_ms: int | None
    ) -> SlotAttempt:
        return await self._writer.run(lambda tx: pools.acquire(tx, project, pool, wait_alive_ms))

    async def retry_slot_waiter(
        self, project: str, pool: str, ticket: int, alive_ms: int
    ) -> SlotAttempt:
        return await self._writer.run(
            lambda tx: pools.retry_waiter(tx, project, pool, ticket, alive_ms)
        )

    async def leave_slot_line(self, project: str, pool: str, ticket: int) -> None:
        await self._writer.run(lambda tx: pools.leave_line(tx, project, pool, ticket))

    async def renew_slot(self, project: str, pool: str, slot_id: str) -> Slot:
        return await self._writer.run(lambda tx: pools.renew(tx, project, pool, slot_id))

    async def release_slot(
        self, project: str, pool: str, slot_id: str, report: SlotReport | None
    ) -> bool:
        return await self._writer.run(
            lambda tx: pools.release(tx, project, pool, slot_id, report)
        )


# --- statements run inside a transaction (on the writer thread) --------------


def _load_pepper(tx: Tx) -> str:
    tx.conn.execute(
        "INSERT OR IGNORE INTO meta (name, value) VALUES ('key_pepper', ?)",
        (secrets.token_hex(32),),
    )
    row = tx.conn.execute("SELECT value FROM meta WHERE name = 'key_pepper'").fetchone()
    return str(row[0])


def _clear_waiters(tx: Tx) -> None:
    tx.conn.execute("DELETE FROM lock_waiters")
    tx.conn.execute("DELETE FROM slot_waiters")


def _insert_key(tx: Tx, pepper: bytes, project: str, new: NewKey, secret: str) -> KeyRecord:
    record = KeyRecord(
        id=new_key_id(),
        project=project,
        role=new.role,
        name=new.name,
        secret_hash=hash_secret(secret, pepper),
        created_ms=tx.now_ms,
        expires_ms=None if new.expires_in_ms is None else tx.now_ms + new.expires_in_ms,
        allow_ips=list(new.allow_ips),
        rpm_quota=new.rpm_quota,
        revoked_ms=None,
    )
    tx.conn.execute(
        f"INSERT INTO api_keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.id,
            record.project,
            record.role.label,
            record.name,
            record.secret_hash,
            record.created_ms,
            record.expires_ms,
            json.dumps(record.allow_ips),
            record.rpm_quota,
            None,
        ),
    )
    return record


def _load_lease(tx: Tx, project: str, key: str) -> Lease | None:
    row = tx.conn.execute(
        f"SELECT {_LEASE_COLUMNS} FROM locks WHERE project = ? AND key = ?", (project, key)
    ).fetchone()
    return None if row is None else _lease(row)


def _live_waiters(tx: Tx, project: str, key: str, before_ticket: int | None) -> int:
    if before_ticket is None:
        row = tx.conn.execute(
            "SELECT COUNT(*) FROM lock_waiters "
            "WHERE project = ? AND key = ? AND alive_until_ms > ?",
            (project, key, tx.now_ms),
        ).fetchone()
    else:
        row = tx.conn.execute(
            "SELECT COUNT(*) FROM lock_waiters "
            "WHERE project = ? AND key = ? AND ticket < ? AND alive_until_ms > ?",
            (project, key, before_ticket, tx.now_ms),
        ).fetchone()
    return int(row[0])


def _join_line(tx: Tx, project: str, key: str, request: AcquireRequest, alive_ms: int) -> int:
    cur = tx.conn.execute(
        "INSERT INTO lock_waiters (project, key, lock_token, alive_until_ms) VALUES (?, ?, ?, ?)",
        (project, key, request.lock_token, tx.now_ms + alive_ms),
    )
    return int(cur.lastrowid or 0)


def _next_fencing_token(tx: Tx) -> int:
    # Contract: the counter row is bumped inside the granting transaction, so a
    # token is never reused, even after a crash, and never goes backwards.
    row = tx.conn.execute(
        "UPDATE counters SET value = value + 1 WHERE name = 'fencing' RETURNING value"
    ).fetchone()
    return int(row[0])


def _acquire(
    tx: Tx, project: str, key: str, request: AcquireRequest, waiters_ahead: int
) -> Granted | rules.Busy:
    current = _load_lease(tx, project, key)
    outcome = rules.decide_acquire(
        key,
        current,
        request,
        tx.now_ms,
        waiters_ahead=waiters_ahead,
        next_fencing_token=lambda: _next_fencing_token(tx),
    )
    if isinstance(outcome, Granted) and outcome.created:
        if current is not None:  # a dead lease not yet reaped is replaced
            _remember_end(tx, project, key, current.lock_token, EndReason.EXPIRED)
        _write_lease(tx, project, outcome.lease)
    return outcome


def _write_lease(tx: Tx, project: str, lease: Lease) -> None:
    tx.conn.execute(
        "INSERT OR REPLACE INTO locks (project, key, lock_token, fencing_token, acquired_ms, "
        "expires_ms, deadline_ms, dies_ms, operation, metadata, on_expiry) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            project,
            lease.key,
            lease.lock_token,
            lease.fencing_token,
            lease.acquired_ms,
            lease.expires_ms,
            lease.deadline_ms,
            rules.end_of_life_ms(lease),
            lease.operation,
            lease.metadata_json,
            lease.on_expiry.value,
        ),
    )
    tx.conn.execute(
        "DELETE FROM ended_leases WHERE project = ? AND key = ? AND lock_token = ?",
        (project, lease.key, lease.lock_token),
    )


def _end_lease(tx: Tx, project: str, key: str, lock_token: str, reason: EndReason) -> None:
    tx.conn.execute(
        "DELETE FROM locks WHERE project = ? AND key = ? AND lock_token = ?",
        (project, key, lock_token),
    )
    _remember_end(tx, project, key, lock_token, reason)
    tx.events.append(lock_freed(project, key))


def _remember_end(tx: Tx, project: str, key: str, lock_token: str, reason: EndReason) -> None:
    tx.conn.execute(
        "INSERT OR REPLACE INTO ended_leases (project, key, lock_token, reason, ended_ms) "
        "VALUES (?, ?, ?, ?, ?)",
        (project, key, lock_token, reason.value, tx.now_ms),
    )


def _ended_reason(tx: Tx, project: str, key: str, lock_token: str) -> EndReason | None:
    row = tx.conn.execute(
        "SELECT reason FROM ended_leases WHERE project = ? AND key = ? AND lock_token = ?",
        (project, key, lock_token),
    ).fetchone()
    return None if row is None else EndReason(row[0])
