"""Lock and lease statements (portable SQL, `?` placeholders). Each function runs
inside the batch transaction, whose operation declared the lock's key
(`key_of`): holding it (BEGIN IMMEDIATE on SQLite, the key's advisory lock on
PostgreSQL) makes read-decide-write atomic. The reaper, which finds its locks as
it reads, claims each key before it writes (batch.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from fencepost.core import leases as rules
from fencepost.core.leases import (
    AcquireRequest,
    Busy,
    EndReason,
    FenceVerdict,
    Granted,
    Lease,
    OnExpiry,
)
from fencepost.errors import Forbidden, LeaseExpired, LeaseLost
from fencepost.events import Granted as LeaseGranted
from fencepost.store.base import (
    LINE_SHOWN,
    AcquireResult,
    ForceReleased,
    ForceReleaser,
    KeyRef,
    LockView,
    WaiterView,
    lock_freed,
)
from fencepost.store.batch import UNDECIDED, Cursor, Key, Keys, Step, Tx, Undecided
from fencepost.store.sql import ended, fencing
from fencepost.store.sql.bounded import delete_oldest_claimed
from fencepost.store.sql.known_leases import KnownLeases
from fencepost.store.sql.replicas import Place
from fencepost.store.sql.rows import columns, width


class _LeaseRow(NamedTuple):
    """The lease columns of a `locks` row (see rows.py)."""

    key: str
    lock_token: str
    fencing_token: int
    acquired_ms: int
    expires_ms: int
    deadline_ms: int
    operation: str | None
    metadata: str | None
    on_expiry: str
    key_id: str | None
    lock_delay_ms: int


_LEASE_COLUMNS = columns(_LeaseRow)
# Where a row of lease columns continues (e.g. the waiter count that follows them).
_AFTER_LEASE = width(_LeaseRow)
_WAITERS_AHEAD = (
    "(SELECT COUNT(*) FROM lock_waiters w "
    "WHERE w.project = ? AND w.key = ? AND w.ticket < ? AND w.alive_until_ms > ?)"
)
# The row if any (a LEFT JOIN from one row, so the count comes back without it).
_LEASE_AND_LINE = (
    f"SELECT {columns(_LeaseRow, 'l')}, {_WAITERS_AHEAD} "
    "FROM (SELECT 1) AS one LEFT JOIN locks l ON l.project = ? AND l.key = ?"
)
_NO_TICKET = 2**62
_WAITER_COLUMNS = "w.key_id, k.name, w.since_ms, w.gives_up_ms"
_LEASE_VALUES = (
    "project, key, lock_token, fencing_token, acquired_ms, expires_ms, deadline_ms, dies_ms, "
    "operation, metadata, on_expiry, key_id, lock_delay_ms"
)
KIND = "lock"


def key_of(project: str, key: str) -> Keys:
    """The keys an operation on one lock touches (see batch.py)."""
    return (Key(KIND, project, key),)


# Written only in the state the rules were asked about: no lease row (not even
# a dead one), no live waiter and no lock delay running. Otherwise nothing is
# written. The fencing token (4th) is a parameter, or drawn by the statement
# itself (a sequence) and returned.
_IF_FREE = (
    "WHERE NOT EXISTS (SELECT 1 FROM lock_waiters "
    "WHERE project = ? AND key = ? AND alive_until_ms > ?) "
    "AND NOT EXISTS (SELECT 1 FROM lock_delays "
    "WHERE project = ? AND key = ? AND until_ms > ?) "
    "ON CONFLICT (project, key) DO NOTHING"
)
_INSERT_IF_FREE = (
    f"INSERT INTO locks ({_LEASE_VALUES}) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? {_IF_FREE}"
)


def _insert_if_free_drawing(token_sql: str) -> str:
    return (
        f"INSERT INTO locks ({_LEASE_VALUES}) SELECT ?, ?, ?, {token_sql}, ?, ?, ?, ?, ?, ?, ?, "
        f"?, ? {_IF_FREE} RETURNING fencing_token"
    )
_DELAY_OF = "(SELECT d.until_ms FROM lock_delays d WHERE d.project = ? AND d.key = ?)"
# The lease row, the waiters ahead and the lock delay in one statement.
_LEASE_LINE_AND_DELAY = (
    f"SELECT {columns(_LeaseRow, 'l')}, {_WAITERS_AHEAD}, "
    f"{_DELAY_OF} FROM (SELECT 1) AS one LEFT JOIN locks l ON l.project = ? AND l.key = ?"
)


def _lease(row: Any) -> Lease:
    """The lease of a row that starts with the lease columns."""
    return _lease_of(_LeaseRow._make(row[:_AFTER_LEASE]))


def _lease_of(r: _LeaseRow) -> Lease:
    return Lease(
        key=r.key,
        lock_token=r.lock_token,
        fencing_token=r.fencing_token,
        acquired_ms=r.acquired_ms,
        expires_ms=r.expires_ms,
        deadline_ms=r.deadline_ms,
        operation=r.operation,
        metadata_json=r.metadata,
        on_expiry=OnExpiry(r.on_expiry),
        key_id=r.key_id,
        lock_delay_ms=int(r.lock_delay_ms),
    )


def load_lease(tx: Tx, project: str, key: str) -> Lease | None:
    row = tx.execute(
        f"SELECT {_LEASE_COLUMNS} FROM locks WHERE project = ? AND key = ?", (project, key)
    ).fetchone()
    return None if row is None else _lease(row)


def load_line(
    tx: Tx, project: str, key: str, before_ticket: int | None = None
) -> tuple[Lease | None, int]:
    """The lease row (live or dead) and how many live waiters are ahead of
    `before_ticket` (all of them when None), in one statement."""
    ahead = before_ticket if before_ticket is not None else _NO_TICKET
    row = tx.execute(_LEASE_AND_LINE, (project, key, ahead, tx.now_ms, project, key)).fetchone()
    (waiting,) = row[_AFTER_LEASE:]
    return _lease_if_any(row), int(waiting)


def _lease_if_any(row: Any) -> Lease | None:
    """The lease of a LEFT JOINed row, None when there was no lease row."""
    r = _LeaseRow._make(row[:_AFTER_LEASE])
    return None if r.key is None else _lease_of(r)


def load_line_and_delay(
    tx: Tx, project: str, key: str, before_ticket: int | None = None
) -> tuple[Lease | None, int, int | None]:
    """`load_line`, and the end of the lock's recorded lock delay (or None)."""
    ahead = before_ticket if before_ticket is not None else _NO_TICKET
    row = tx.execute(
        _LEASE_LINE_AND_DELAY, (project, key, ahead, tx.now_ms, project, key, project, key)
    ).fetchone()
    waiting, delay_until_ms = row[_AFTER_LEASE:]
    delay = None if delay_until_ms is None else int(delay_until_ms)
    return _lease_if_any(row), int(waiting), delay


def start_delay(tx: Tx, project: str, lease: Lease, reason: EndReason) -> None:
    """Record the lock delay `lease` asked for, if its ending starts one that
    has not passed yet (SPEC §3.9)."""
    until = rules.delay_until_ms(lease, reason, tx.now_ms)
    if until is None or until <= tx.now_ms:
        return
    tx.execute(
        "INSERT INTO lock_delays (project, key, until_ms) VALUES (?, ?, ?) "
        "ON CONFLICT (project, key) DO UPDATE SET until_ms = excluded.until_ms",
        (project, lease.key, until),
    )


def _lease_values(project: str, lease: Lease) -> tuple[Any, ...]:
    return (
        project, lease.key, lease.lock_token, lease.fencing_token, lease.acquired_ms,
        lease.expires_ms, lease.deadline_ms, rules.end_of_life_ms(lease), lease.operation,
        lease.metadata_json, lease.on_expiry.value, lease.key_id, lease.lock_delay_ms,
    )


def join_line(tx: Tx, project: str, key: str, request: AcquireRequest, place: Place) -> int:
    # since/gives_up are only shown (SPEC §3.4); a waiter that rejoins after
    # being dropped as dead shows its new place, measured from the rejoin.
    (ticket,) = tx.execute(
        "INSERT INTO lock_waiters (project, key, lock_token, alive_until_ms, replica, "
        "key_id, since_ms, gives_up_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING ticket",
        (project, key, request.lock_token, tx.now_ms + place.alive_ms, place.replica,
         request.key_id, tx.now_ms, tx.now_ms + request.wait_ms),
    ).fetchone()
    return int(ticket)


def _decide_and_write(
    tx: Tx,
    known: KnownLeases,
    project: str,
    key: str,
    request: AcquireRequest,
    current: Lease | None,
    waiters_ahead: int,
    delayed_until_ms: int | None,
) -> Granted | Busy:
    outcome = rules.decide_acquire(
        key,
        current,
        request,
        tx.now_ms,
        waiters_ahead=waiters_ahead,
        next_fencing_token=lambda: fencing.take(tx),
        delayed_until_ms=delayed_until_ms,
    )
    if isinstance(outcome, Granted) and outcome.created:
        if current is not None:  # a dead lease not yet reaped is replaced
            ended.remember(
                tx, project, key, current.lock_token, current.fencing_token, EndReason.EXPIRED,
                current.acquired_ms,
            )
        write_lease(tx, project, outcome.lease)
        known.put(project, outcome.lease)
        report_grant(tx, project, outcome.lease)
    return outcome


def report_grant(tx: Tx, project: str, lease: Lease) -> None:
    """Every new lease is reported once, after the commit (metrics, event log)."""
    tx.events.append(LeaseGranted("lock", project, lease.key, lease.fencing_token, tx.origin))


def acquire(
    tx: Tx,
    known: KnownLeases,
    project: str,
    key: str,
    request: AcquireRequest,
    place: Place | None,
) -> Step[AcquireResult]:
    """A step operation (see batch.py): first the common case in one statement
    (the rules decide for a free lock with an empty line, and the insert
    happens only if that is what the lock is), then, if it was not, the
    general case."""
    token_sql = fencing.drawn_by_statement(tx)
    guess = rules.decide_acquire(
        key, None, request, tx.now_ms, waiters_ahead=0,
        next_fencing_token=(lambda: 0) if token_sql else (lambda: fencing.take(tx)),
    )
    assert isinstance(guess, Granted)
    values = _lease_values(project, guess.lease)
    free = (project, key, tx.now_ms, project, key, tx.now_ms)
    if token_sql is None:
        sent = tx.execute(_INSERT_IF_FREE, (*values, *free))
    else:  # the token is drawn by the insert, only if it inserts
        sent = tx.execute(_insert_if_free_drawing(token_sql), (*values[:3], *values[4:], *free))

    def answer() -> AcquireResult | Undecided:
        if token_sql is None:
            granted = guess if sent.rowcount else None
        else:
            row = sent.fetchone()
            granted = None if row is None else Granted(
                replace(guess.lease, fencing_token=int(row[0])), created=True
            )
        if granted is not None:
            known.put(project, granted.lease)
            report_grant(tx, project, granted.lease)
            return AcquireResult(granted)
        fencing.give_back(tx, guess.lease.fencing_token)
        return UNDECIDED

    def otherwise() -> AcquireResult:
        current, waiting, delayed = load_line_and_delay(tx, project, key)
        outcome = _decide_and_write(tx, known, project, key, request, current, waiting, delayed)
        if isinstance(outcome, Granted) or place is None:
            return AcquireResult(outcome)
        return AcquireResult(outcome, join_line(tx, project, key, request, place))

    return Step(answer, otherwise)


def retry_waiter(
    tx: Tx,
    known: KnownLeases,
    project: str,
    key: str,
    request: AcquireRequest,
    ticket: int,
    place: Place,
) -> AcquireResult:
    # Contract: only the live waiter with the smallest ticket may take a free
    # lock, so waiters are granted in arrival order.
    refreshed = tx.execute(
        "UPDATE lock_waiters SET alive_until_ms = ? WHERE ticket = ?",
        (tx.now_ms + place.alive_ms, ticket),
    ).rowcount
    if not refreshed:  # dropped as dead (e.g. a stalled loop): rejoin at the back
        ticket = join_line(tx, project, key, request, place)
    current, ahead, delayed = load_line_and_delay(tx, project, key, before_ticket=ticket)
    outcome = _decide_and_write(tx, known, project, key, request, current, ahead, delayed)
    if isinstance(outcome, Granted):
        tx.execute("DELETE FROM lock_waiters WHERE ticket = ?", (ticket,))
        return AcquireResult(outcome)
    return AcquireResult(outcome, ticket)


def leave_line(tx: Tx, project: str, key: str, ticket: int) -> None:
    if tx.execute("DELETE FROM lock_waiters WHERE ticket = ?", (ticket,)).rowcount:
        tx.events.append(lock_freed(project, key))  # the next in line may go now


def drop_waiters_of(tx: Tx, replica: str) -> None:
    """Remove a dead replica's waiters from every lock's line; the next in
    each line may go now."""
    gone = tx.execute(
        "DELETE FROM lock_waiters WHERE replica = ? RETURNING project, key", (replica,)
    ).fetchall()
    for project, key in {(p, k) for p, k in gone}:
        tx.events.append(lock_freed(project, key))


def _send_expiry(tx: Tx, project: str, before: Lease, after: Lease) -> Cursor:
    # Contract: the row changes only if it is still exactly the lease the rules
    # judged (the fencing token names the grant; only renewals move the expiry).
    return tx.execute(
        "UPDATE locks SET expires_ms = ?, dies_ms = ? "
        "WHERE project = ? AND key = ? AND fencing_token = ? AND expires_ms = ?",
        (after.expires_ms, rules.end_of_life_ms(after), project, before.key,
         before.fencing_token, before.expires_ms),
    )


def renew(
    tx: Tx, known: KnownLeases, project: str, key: str, lock_token: str, ttl_seconds: int
) -> Step[Lease]:
    """A step operation: first a guarded update of the lease this writer last
    wrote, then, if that was stale, the row decides."""
    remembered = known.get(project, key)
    sent: Cursor | None = None
    guess: Lease | None = None
    if remembered is not None:
        try:
            guess = rules.decide_renew(remembered, lock_token, ttl_seconds, tx.now_ms, None)
        except (LeaseLost, LeaseExpired):
            pass  # maybe stale (renewed or ended elsewhere): the row decides below
        else:
            sent = _send_expiry(tx, project, remembered, guess)

    def answer() -> Lease | Undecided:
        if sent is not None and guess is not None and sent.rowcount > 0:
            known.put(project, guess)
            return guess
        return UNDECIDED

    def otherwise() -> Lease:
        current = load_lease(tx, project, key)
        reason = None
        if current is None or current.lock_token != lock_token:
            reason = ended.reason(tx, project, key, lock_token)
        renewed = rules.decide_renew(current, lock_token, ttl_seconds, tx.now_ms, reason)
        assert current is not None  # decide_renew raised otherwise
        _send_expiry(tx, project, current, renewed)
        known.put(project, renewed)
        return renewed

    return Step(answer, otherwise)


def release(
    tx: Tx, known: KnownLeases, project: str, key: str, lock_token: str
) -> Step[bool]:
    """A step operation decided by its first statement."""
    sent = tx.execute(
        f"DELETE FROM locks WHERE project = ? AND key = ? AND lock_token = ? "
        f"RETURNING {_LEASE_COLUMNS}",
        (project, key, lock_token),
    )

    def answer() -> bool:
        row = sent.fetchone()
        if row is None:
            return False
        known.forget(project, key)
        # A dead lease not yet reaped ends here just as the reaper would end it.
        lease = _lease(row)
        released = rules.holds(lease, lock_token, tx.now_ms)
        reason = EndReason.RELEASED if released else EndReason.EXPIRED
        ended.remember(
            tx, project, key, lock_token, lease.fencing_token, reason, lease.acquired_ms
        )
        start_delay(tx, project, lease, reason)
        tx.events.append(lock_freed(project, key))
        return released

    return Step(answer, _never)


def _never() -> Any:
    raise AssertionError("this step operation is always decided by its first statement")


def force_release(
    tx: Tx, known: KnownLeases, project: str, key: str, by: ForceReleaser
) -> ForceReleased:
    """End the live lease if `by` may (else raise Forbidden, changing nothing)."""
    current = load_lease(tx, project, key)
    if current is None or not rules.is_live(current, tx.now_ms):
        known.forget(project, key)
        if current is not None:  # dead but not yet reaped
            end_lease(tx, project, current, EndReason.EXPIRED)
        return ForceReleased(key, None, tx.now_ms)
    if not rules.may_force_release(current, by.key_id, by.is_admin):
        raise Forbidden(
            "Only an admin or the API key that took this lease may force-release it."
        )
    known.forget(project, key)
    end_lease(tx, project, current, EndReason.FORCE_RELEASED)
    return ForceReleased(key, current, tx.now_ms)


def fence_check(tx: Tx, project: str, key: str, token: int) -> FenceVerdict:
    """Whether `token` is the fencing token of the lock's live lease, and if
    not, why (SPEC §3.8). A read: nothing is written."""
    current = load_lease(tx, project, key)
    if current is not None and current.fencing_token == token:
        return rules.judge_fence(current, token, tx.now_ms, None)
    reason = ended.reason_of_token(tx, project, key, token)
    return rules.judge_fence(current, token, tx.now_ms, reason)


def view(tx: Tx, project: str, key: str) -> LockView:
    lease, waiting = load_line(tx, project, key)
    if lease is not None and not rules.is_live(lease, tx.now_ms):
        lease = None
    holder = None if lease is None else holder_of(tx, lease)
    line = line_of(tx, project, key) if waiting else ()
    return LockView(key, lease, waiting, tx.now_ms, holder, line)


def holder_of(tx: Tx, lease: Lease) -> KeyRef:
    if lease.key_id is None:
        return KeyRef(None, None)
    row = tx.execute("SELECT name FROM api_keys WHERE id = ?", (lease.key_id,)).fetchone()
    if row is None:
        return KeyRef(lease.key_id, None)
    (name,) = row
    return KeyRef(lease.key_id, name)


def _waiter(key_id: str | None, name: str | None, since_ms: int, gives_up_ms: int) -> WaiterView:
    return WaiterView(KeyRef(key_id, name), since_ms, gives_up_ms)


def line_of(tx: Tx, project: str, key: str) -> tuple[WaiterView, ...]:
    """The first LINE_SHOWN live waiters in arrival (ticket) order."""
    rows = tx.execute(
        f"SELECT {_WAITER_COLUMNS} FROM lock_waiters w LEFT JOIN api_keys k ON k.id = w.key_id "
        "WHERE w.project = ? AND w.key = ? AND w.alive_until_ms > ? ORDER BY w.ticket LIMIT ?",
        (project, key, tx.now_ms, LINE_SHOWN),
    ).fetchall()
    return tuple(_waiter(*row) for row in rows)


def _lines_between(
    tx: Tx, project: str, first: str, last: str
) -> dict[str, list[WaiterView]]:
    """The lines of every lock keyed first..last, at most LINE_SHOWN each, in
    one statement (a page of the list, not one query per lock)."""
    rows = tx.execute(
        f"SELECT * FROM (SELECT w.key, {_WAITER_COLUMNS}, w.ticket, "
        "ROW_NUMBER() OVER (PARTITION BY w.key ORDER BY w.ticket) AS place "
        "FROM lock_waiters w LEFT JOIN api_keys k ON k.id = w.key_id "
        "WHERE w.project = ? AND w.key >= ? AND w.key <= ? AND w.alive_until_ms > ?) AS line "
        "WHERE place <= ? ORDER BY key, ticket",
        (project, first, last, tx.now_ms, LINE_SHOWN),
    ).fetchall()
    lines: dict[str, list[WaiterView]] = {}
    for key, key_id, name, since_ms, gives_up_ms, _ticket, _place in rows:
        lines.setdefault(key, []).append(_waiter(key_id, name, since_ms, gives_up_ms))
    return lines


def list_views(
    tx: Tx, project: str, prefix: str, after: str | None, limit: int
) -> list[LockView]:
    # Range scan on the primary key: keys >= prefix and < prefix + U+10FFFF are
    # exactly the keys starting with prefix (names are ASCII; byte-order collation).
    low = max(prefix, after or "")
    rows = tx.execute(
        f"SELECT {columns(_LeaseRow, 'l')}, "
        "(SELECT COUNT(*) FROM lock_waiters w "
        "WHERE w.project = l.project AND w.key = l.key AND w.alive_until_ms > ?), k.name "
        "FROM locks l LEFT JOIN api_keys k ON k.id = l.key_id WHERE l.project = ? "
        "AND l.key >= ? AND l.key < ? AND l.key > ? AND l.dies_ms > ? ORDER BY l.key LIMIT ?",
        (tx.now_ms, project, low, prefix + "\U0010ffff", after or "", tx.now_ms, limit),
    ).fetchall()
    found = [(_lease(row), *row[_AFTER_LEASE:]) for row in rows]
    waited = [lease.key for lease, waiting, _ in found if waiting]
    lines = _lines_between(tx, project, waited[0], waited[-1]) if waited else {}
    return [
        LockView(
            lease.key, lease, int(waiting), tx.now_ms, KeyRef(lease.key_id, holder_name),
            tuple(lines.get(lease.key, ())),
        )
        for lease, waiting, holder_name in found
    ]


def write_lease(tx: Tx, project: str, lease: Lease) -> None:
    tx.execute(
        f"INSERT INTO locks ({_LEASE_VALUES}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (project, key) DO UPDATE SET lock_token = excluded.lock_token, "
        "fencing_token = excluded.fencing_token, acquired_ms = excluded.acquired_ms, "
        "expires_ms = excluded.expires_ms, deadline_ms = excluded.deadline_ms, "
        "dies_ms = excluded.dies_ms, operation = excluded.operation, "
        "metadata = excluded.metadata, on_expiry = excluded.on_expiry, "
        "key_id = excluded.key_id, lock_delay_ms = excluded.lock_delay_ms",
        _lease_values(project, lease),
    )
    # An older ended_leases row for this token (a token reused after its lease
    # ended) needs no delete: it is read only while the token does not hold the
    # lock, and is overwritten when this lease ends.


def end_lease(tx: Tx, project: str, lease: Lease, reason: EndReason) -> None:
    tx.execute(
        "DELETE FROM locks WHERE project = ? AND key = ? AND lock_token = ?",
        (project, lease.key, lease.lock_token),
    )
    ended.remember(
        tx, project, lease.key, lease.lock_token, lease.fencing_token, reason, lease.acquired_ms
    )
    start_delay(tx, project, lease, reason)
    tx.events.append(lock_freed(project, lease.key))


def reap(tx: Tx, known: KnownLeases, bound: int) -> tuple[int, bool]:
    """Free leases dead by the store's clock and drop dead waiters, at most
    `bound` of each kind (leases, lock delays, waiters);
    return how many leases were freed, and whether a bound was reached (more
    may be left for the next pass).

    Contract: deletes only leases that are dead now, of locks whose key it
    claimed; running it twice, or on two servers at once, frees nothing twice."""
    dead, more = delete_oldest_claimed(
        tx, KIND, "locks", "project, key", "key", "dies_ms", tx.now_ms, bound,
        f"{_LEASE_COLUMNS}, project",
    )
    for row in dead:
        lease = _lease(row)
        (project,) = row[_AFTER_LEASE:]
        known.forget(project, lease.key)
        ended.remember(
            tx, project, lease.key, lease.lock_token, lease.fencing_token, EndReason.EXPIRED,
            lease.acquired_ms,
        )
        start_delay(tx, project, lease, EndReason.EXPIRED)
        tx.events.append(lock_freed(project, lease.key))
    # Locks whose delay is over: their lines may go now (SPEC §3.9).
    delays_over, more_delays = delete_oldest_claimed(
        tx, KIND, "lock_delays", "project, key", "key", "until_ms", tx.now_ms, bound,
        "project, key",
    )
    for project, key in delays_over:
        tx.events.append(lock_freed(project, key))
    gone, more_waiters = delete_oldest_claimed(
        tx, KIND, "lock_waiters", "ticket", "key", "alive_until_ms", tx.now_ms, bound,
        "project, key",
    )
    for project, key in {(p, k) for p, k in gone}:
        tx.events.append(lock_freed(project, key))
    return len(dead), more or more_delays or more_waiters
