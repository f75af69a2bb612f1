"""Lock and lease statements (portable SQL, `?` placeholders). Each function runs
inside the batch transaction; the batch's serialisation (BEGIN IMMEDIATE on
SQLite, one advisory lock on PostgreSQL) makes read-decide-write atomic."""

from __future__ import annotations

from typing import Any

from fencepost.core import leases as rules
from fencepost.core.leases import AcquireRequest, Busy, EndReason, Granted, Lease, OnExpiry
from fencepost.store.base import AcquireResult, ForceReleased, LockView, lock_freed
from fencepost.store.batch import Tx

_LEASE_COLUMNS = (
    "key, lock_token, fencing_token, acquired_ms, expires_ms, deadline_ms, "
    "operation, metadata, on_expiry"
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


def load_lease(tx: Tx, project: str, key: str) -> Lease | None:
    row = tx.execute(
        f"SELECT {_LEASE_COLUMNS} FROM locks WHERE project = ? AND key = ?", (project, key)
    ).fetchone()
    return None if row is None else _lease(row)


def live_waiters(tx: Tx, project: str, key: str, before_ticket: int | None = None) -> int:
    row = tx.execute(
        "SELECT COUNT(*) FROM lock_waiters "
        "WHERE project = ? AND key = ? AND ticket < ? AND alive_until_ms > ?",
        (project, key, before_ticket if before_ticket is not None else 2**62, tx.now_ms),
    ).fetchone()
    return int(row[0])


def join_line(tx: Tx, project: str, key: str, request: AcquireRequest, alive_ms: int) -> int:
    row = tx.execute(
        "INSERT INTO lock_waiters (project, key, lock_token, alive_until_ms) "
        "VALUES (?, ?, ?, ?) RETURNING ticket",
        (project, key, request.lock_token, tx.now_ms + alive_ms),
    ).fetchone()
    return int(row[0])


def next_fencing_token(tx: Tx) -> int:
    # Contract: the counter row is bumped inside the granting transaction, so a
    # token is never reused, even after a crash, and never goes backwards.
    row = tx.execute(
        "UPDATE counters SET value = value + 1 WHERE name = 'fencing' RETURNING value"
    ).fetchone()
    return int(row[0])


def _decide_and_write(
    tx: Tx, project: str, key: str, request: AcquireRequest, waiters_ahead: int
) -> Granted | Busy:
    current = load_lease(tx, project, key)
    outcome = rules.decide_acquire(
        key,
        current,
        request,
        tx.now_ms,
        waiters_ahead=waiters_ahead,
        next_fencing_token=lambda: next_fencing_token(tx),
    )
    if isinstance(outcome, Granted) and outcome.created:
        if current is not None:  # a dead lease not yet reaped is replaced
            remember_end(tx, project, key, current.lock_token, EndReason.EXPIRED)
        write_lease(tx, project, outcome.lease)
    return outcome


def acquire(
    tx: Tx, project: str, key: str, request: AcquireRequest, wait_alive_ms: int | None
) -> AcquireResult:
    outcome = _decide_and_write(tx, project, key, request, live_waiters(tx, project, key))
    if isinstance(outcome, Granted) or wait_alive_ms is None:
        return AcquireResult(outcome)
    return AcquireResult(outcome, join_line(tx, project, key, request, wait_alive_ms))


def retry_waiter(
    tx: Tx, project: str, key: str, request: AcquireRequest, ticket: int, alive_ms: int
) -> AcquireResult:
    # Contract: only the live waiter with the smallest ticket may take a free
    # lock, so waiters are granted in arrival order.
    refreshed = tx.execute(
        "UPDATE lock_waiters SET alive_until_ms = ? WHERE ticket = ?",
        (tx.now_ms + alive_ms, ticket),
    ).rowcount
    if not refreshed:  # dropped as dead (e.g. a stalled loop): rejoin at the back
        ticket = join_line(tx, project, key, request, alive_ms)
    ahead = live_waiters(tx, project, key, before_ticket=ticket)
    outcome = _decide_and_write(tx, project, key, request, ahead)
    if isinstance(outcome, Granted):
        tx.execute("DELETE FROM lock_waiters WHERE ticket = ?", (ticket,))
        return AcquireResult(outcome)
    return AcquireResult(outcome, ticket)


def leave_line(tx: Tx, project: str, key: str, ticket: int) -> None:
    if tx.execute("DELETE FROM lock_waiters WHERE ticket = ?", (ticket,)).rowcount:
        tx.events.append(lock_freed(project, key))  # the next in line may go now


def renew(tx: Tx, project: str, key: str, lock_token: str, ttl_seconds: int) -> Lease:
    current = load_lease(tx, project, key)
    ended = None
    if current is None or current.lock_token != lock_token:
        ended = ended_reason(tx, project, key, lock_token)
    renewed = rules.decide_renew(current, lock_token, ttl_seconds, tx.now_ms, ended)
    # Contract: the lease row changes only if it is still this token's.
    tx.execute(
        "UPDATE locks SET expires_ms = ?, dies_ms = ? "
        "WHERE project = ? AND key = ? AND lock_token = ?",
        (renewed.expires_ms, rules.end_of_life_ms(renewed), project, key, lock_token),
    )
    return renewed


def release(tx: Tx, project: str, key: str, lock_token: str) -> bool:
    if not rules.holds(load_lease(tx, project, key), lock_token, tx.now_ms):
        return False
    end_lease(tx, project, key, lock_token, EndReason.RELEASED)
    return True


def force_release(tx: Tx, project: str, key: str) -> ForceReleased:
    current = load_lease(tx, project, key)
    if current is None or not rules.is_live(current, tx.now_ms):
        if current is not None:  # dead but not yet reaped
            end_lease(tx, project, key, current.lock_token, EndReason.EXPIRED)
        return ForceReleased(key, None, tx.now_ms)
    end_lease(tx, project, key, current.lock_token, EndReason.FORCE_RELEASED)
    return ForceReleased(key, current, tx.now_ms)


def view(tx: Tx, project: str, key: str) -> LockView:
    lease = load_lease(tx, project, key)
    if lease is not None and not rules.is_live(lease, tx.now_ms):
        lease = None
    return LockView(key, lease, live_waiters(tx, project, key), tx.now_ms)


def list_views(
    tx: Tx, project: str, prefix: str, after: str | None, limit: int
) -> list[LockView]:
    # Range scan on the primary key: keys >= prefix and < prefix + U+10FFFF are
    # exactly the keys starting with prefix (names are ASCII; byte-order collation).
    low = max(prefix, after or "")
    rows = tx.execute(
        f"SELECT {_LEASE_COLUMNS} FROM locks WHERE project = ? AND key >= ? "
        "AND key < ? AND key > ? AND dies_ms > ? ORDER BY key LIMIT ?",
        (project, low, prefix + "\U0010ffff", after or "", tx.now_ms, limit),
    ).fetchall()
    views = []
    for row in rows:
        lease = _lease(row)
        views.append(LockView(lease.key, lease, live_waiters(tx, project, lease.key), tx.now_ms))
    return views


def write_lease(tx: Tx, project: str, lease: Lease) -> None:
    tx.execute(
        "INSERT INTO locks (project, key, lock_token, fencing_token, acquired_ms, expires_ms, "
        "deadline_ms, dies_ms, operation, metadata, on_expiry) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (project, key) DO UPDATE SET lock_token = excluded.lock_token, "
        "fencing_token = excluded.fencing_token, acquired_ms = excluded.acquired_ms, "
        "expires_ms = excluded.expires_ms, deadline_ms = excluded.deadline_ms, "
        "dies_ms = excluded.dies_ms, operation = excluded.operation, "
        "metadata = excluded.metadata, on_expiry = excluded.on_expiry",
        (
            project, lease.key, lease.lock_token, lease.fencing_token, lease.acquired_ms,
            lease.expires_ms, lease.deadline_ms, rules.end_of_life_ms(lease), lease.operation,
            lease.metadata_json, lease.on_expiry.value,
        ),
    )
    # An older ended_leases row for this token (a token reused after its lease
    # ended) needs no delete: it is read only while the token does not hold the
    # lock, and is overwritten when this lease ends.


def end_lease(tx: Tx, project: str, key: str, lock_token: str, reason: EndReason) -> None:
    tx.execute(
        "DELETE FROM locks WHERE project = ? AND key = ? AND lock_token = ?",
        (project, key, lock_token),
    )
    remember_end(tx, project, key, lock_token, reason)
    tx.events.append(lock_freed(project, key))


def remember_end(tx: Tx, project: str, key: str, lock_token: str, reason: EndReason) -> None:
    tx.execute(
        "INSERT INTO ended_leases (project, key, lock_token, reason, ended_ms) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (project, key, lock_token) DO UPDATE SET "
        "reason = excluded.reason, ended_ms = excluded.ended_ms",
        (project, key, lock_token, reason.value, tx.now_ms),
    )


def ended_reason(tx: Tx, project: str, key: str, lock_token: str) -> EndReason | None:
    row = tx.execute(
        "SELECT reason FROM ended_leases WHERE project = ? AND key = ? AND lock_token = ?",
        (project, key, lock_token),
    ).fetchone()
    return None if row is None else EndReason(row[0])


def reap(tx: Tx, forget_before_ms: int | None) -> int:
    """Free leases dead by the store's clock and drop dead waiters.

    Contract: deletes exactly the leases that are dead now; running it twice, or
    on two servers at once, frees nothing twice."""
    dead = tx.execute(
        "DELETE FROM locks WHERE dies_ms <= ? RETURNING project, key, lock_token", (tx.now_ms,)
    ).fetchall()
    for project, key, token in dead:
        remember_end(tx, project, key, token, EndReason.EXPIRED)
        tx.events.append(lock_freed(project, key))
    gone = tx.execute(
        "DELETE FROM lock_waiters WHERE alive_until_ms <= ? RETURNING project, key",
        (tx.now_ms,),
    ).fetchall()
    for project, key in {(p, k) for p, k in gone}:
        tx.events.append(lock_freed(project, key))
    if forget_before_ms is not None:
        tx.execute("DELETE FROM ended_leases WHERE ended_ms < ?", (forget_before_ms,))
    return len(dead)
