"""Lock and lease statements (portable SQL, `?` placeholders). Each function runs
inside the batch transaction, whose operation declared the lock's key
(`key_of`): holding it (BEGIN IMMEDIATE on SQLite, the key's advisory lock on
PostgreSQL) makes read-decide-write atomic. The reaper, which finds its locks as
it reads, claims each key before it writes (batch.py)."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any, NamedTuple, Sequence

from fencepost.core import leases as rules
from fencepost.core.leases import (
    AcquireRequest,
    Busy,
    EndReason,
    FenceVerdict,
    Granted,
    Lease,
    LockState,
    Mode,
    OnExpiry,
    SetGranted,
)
from fencepost.errors import Forbidden, LeaseExpired, LeaseLost, NotFound, SessionLost
from fencepost.events import Granted as LeaseGranted
from fencepost.store.base import (
    LINE_SHOWN,
    AcquireResult,
    ForceReleased,
    ForceReleaser,
    KeyRef,
    LockView,
    SetAttempt,
    WaiterView,
    lock_freed,
)
from fencepost.store.batch import (
    UNDECIDED,
    Cursor,
    Key,
    Keys,
    Refused,
    Step,
    Tx,
    Undecided,
    refused_before_writing,
)
from fencepost.store.sql import ended, fencing, sessions
from fencepost.store.sql.bounded import delete_oldest_claimed
from fencepost.store.sql.known_leases import KnownLeases
from fencepost.store.sql.replicas import Place
from fencepost.store.sql.rows import HOLDER_NAME, columns, names_of, width
from fencepost.store.together import Together, unnest


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
    mode: str
    session_id: str | None  # attached to this session (SPEC §3.10)


_LEASE_COLUMNS = columns(_LeaseRow)
# Where a row of lease columns continues (e.g. the holder's name that follows them).
_AFTER_LEASE = width(_LeaseRow)
_NO_TICKET = 2**62
_WAITER_COLUMNS = f"w.key_id, {HOLDER_NAME}, w.since_ms, w.gives_up_ms"
_LEASE_VALUES = (
    "project, key, lock_token, fencing_token, acquired_ms, expires_ms, deadline_ms, dies_ms, "
    "operation, metadata, on_expiry, key_id, lock_delay_ms, mode, session_id"
)
KIND = "lock"


def key_of(project: str, key: str) -> Keys:
    """The keys an operation on one lock touches (see batch.py)."""
    return (Key(KIND, project, key),)


def keys_of(project: str, keys: Sequence[str]) -> Keys:
    """The keys an operation on a lock set touches: every lock of the set."""
    return tuple(Key(KIND, project, key) for key in keys)


def _lease_places(token_sql: str | None) -> str:
    """The placeholders of a lease's values; the fencing token's (4th) is
    `token_sql` when the statement draws the token itself (a sequence)."""
    places = ["?"] * len(_LEASE_VALUES.split(", "))
    if token_sql is not None:
        places[3] = token_sql
    return ", ".join(places)


_FREE_LINE_AND_NO_DELAY = (
    "NOT EXISTS (SELECT 1 FROM lock_waiters WHERE project = ? AND key = ? AND alive_until_ms > ?) "
    "AND NOT EXISTS (SELECT 1 FROM lock_delays WHERE project = ? AND key = ? AND until_ms > ?)"
)
# The hot path: an exclusive lease is written only in the state the rules were
# asked about: no lease row of the lock (not even a dead one), no live waiter
# and no lock delay running. Otherwise nothing is written. The batch holds the
# lock's key (BEGIN IMMEDIATE; its advisory lock on PostgreSQL), so the NOT
# EXISTS tests and the insert are one atomic decision.
_IF_FREE = (
    f"WHERE {_FREE_LINE_AND_NO_DELAY} "
    "AND NOT EXISTS (SELECT 1 FROM locks WHERE project = ? AND key = ?) "
    "ON CONFLICT (project, key, lock_token) DO NOTHING"
)
# A shared lease joins live shared ones (SPEC §3.6) under the same conditions,
# except that only exclusive or dead rows (a dead one may start a lock delay)
# send it to the general path.
_IF_SHARABLE = (
    f"WHERE {_FREE_LINE_AND_NO_DELAY} "
    "AND NOT EXISTS (SELECT 1 FROM locks WHERE project = ? AND key = ? "
    "AND (mode <> 'shared' OR dies_ms <= ?)) "
    "ON CONFLICT (project, key, lock_token) DO NOTHING"
)


# The parameters of the guarded exclusive insert that draws its token, with
# their types (as arrays, when gathered): the lease's values without the
# token, then the free-lock test's.
_FREE_INSERT_PARAMS = (
    ("project", "text"), ("key", "text"), ("lock_token", "text"), ("acquired_ms", "bigint"),
    ("expires_ms", "bigint"), ("deadline_ms", "bigint"), ("dies_ms", "bigint"),
    ("operation", "text"), ("metadata", "text"), ("on_expiry", "text"), ("key_id", "text"),
    ("lock_delay_ms", "bigint"), ("mode", "text"), ("session_id", "text"),
    ("w_project", "text"), ("w_key", "text"), ("w_now", "bigint"),
    ("d_project", "text"), ("d_key", "text"), ("d_now", "bigint"),
    ("l_project", "text"), ("l_key", "text"),
)


# A shared acquire's test has the time too: the lease rows that send it to
# the general case are the exclusive or dead ones.
_SHARABLE_INSERT_PARAMS = (*_FREE_INSERT_PARAMS, ("l_now", "bigint"))


@lru_cache(maxsize=8)
def _free_insert(token_sql: str, mode: Mode = Mode.EXCLUSIVE) -> Together:
    """The hot path's insert that draws its token, for one acquire or for
    several of a batch: the same test per row (_IF_FREE's, or _IF_SHARABLE's
    for a shared lease), and the token drawn only for the rows it inserts."""
    chosen = [token_sql if name == "fencing_token" else f"x.{name}"
              for name in _LEASE_VALUES.split(", ")]
    shared = mode is Mode.SHARED
    params = _SHARABLE_INSERT_PARAMS if shared else _FREE_INSERT_PARAMS
    blocking = " AND (l.mode <> 'shared' OR l.dies_ms <= x.l_now)" if shared else ""
    # Each test looks up its own key by index (OFFSET 0 keeps the planner
    # from making it a join): as a join, planned for the hundred rows it
    # guesses an unnest gives, it hashed every row of the table instead, all
    # 10,000 parked waiters for a batch of 20 acquires (4 ms, measured).
    many = (
        f"WITH x AS (SELECT * FROM {unnest(params)}), "
        f"granted AS (INSERT INTO locks ({_LEASE_VALUES}) SELECT {', '.join(chosen)} FROM x "
        "WHERE NOT EXISTS (SELECT 1 FROM lock_waiters w WHERE w.project = x.w_project "
        "AND w.key = x.w_key AND w.alive_until_ms > x.w_now OFFSET 0) "
        "AND NOT EXISTS (SELECT 1 FROM lock_delays d WHERE d.project = x.d_project "
        "AND d.key = x.d_key AND d.until_ms > x.d_now OFFSET 0) "
        "AND NOT EXISTS (SELECT 1 FROM locks l WHERE l.project = x.l_project "
        f"AND l.key = x.l_key{blocking} OFFSET 0) "
        "ON CONFLICT (project, key, lock_token) DO NOTHING "
        "RETURNING project, key, lock_token, fencing_token) "
        "SELECT x.n, granted.fencing_token FROM granted JOIN x ON granted.project = x.project "
        "AND granted.key = x.key AND granted.lock_token = x.lock_token"
    )
    return Together(_insert_if(_IF_SHARABLE if shared else _IF_FREE, token_sql), many)


# A release deletes the token's lease only while it is live: a dead one (not
# yet reaped) ended at its expiry, which may start a lock delay, and must stay
# on record until that is written, or an acquire sent after it in the same
# pipeline would find the lock free and no delay yet (SPEC §3.9). The general
# case ends it as the reaper would.
_RELEASE_PARAMS = (("project", "text"), ("key", "text"), ("lock_token", "text"), ("now", "bigint"))
# A release's lease, and whether the lock's line has anyone in it: with nobody
# there, no other process can be waiting for the lock (a waiter has its place
# from its join on, and joins wait their turn on the lock like releases), so
# the wake-up stays in this process (Freed.remote).
_LINED = (
    "EXISTS (SELECT 1 FROM lock_waiters w WHERE w.project = {t}.project AND w.key = {t}.key)"
)
_RELEASE = Together(
    f"DELETE FROM locks WHERE project = ? AND key = ? AND lock_token = ? AND dies_ms > ? "
    f"RETURNING {_LEASE_COLUMNS}, {_LINED.format(t='locks')}",
    f"DELETE FROM locks l USING {unnest(_RELEASE_PARAMS)} "
    "WHERE l.project = x.project AND l.key = x.key AND l.lock_token = x.lock_token "
    f"AND l.dies_ms > x.now RETURNING x.n, {columns(_LeaseRow, 'l')}, {_LINED.format(t='l')}",
)


@lru_cache(maxsize=8)
def _insert_if(condition: str, token_sql: str | None) -> str:
    """The guarded insert of a lease; with `token_sql` it draws the fencing
    token itself, only if it inserts, and returns it."""
    returning = "" if token_sql is None else " RETURNING fencing_token"
    return (
        f"INSERT INTO locks ({_LEASE_VALUES}) SELECT {_lease_places(token_sql)} "
        f"{condition}{returning}"
    )
_LEASES_OF = f"SELECT {_LEASE_COLUMNS} FROM locks WHERE project = ? AND key = ?"
def _lease(row: Any) -> Lease:
    """The lease of a row that starts with the lease columns."""
    r = _LeaseRow._make(row[:_AFTER_LEASE])
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
        mode=Mode(r.mode),
        session_id=r.session_id,
    )


def load_leases(tx: Tx, project: str, key: str) -> list[Lease]:
    """Every lease row of the lock, live or dead (not yet reaped)."""
    return [_lease(row) for row in tx.execute(_LEASES_OF, (project, key)).fetchall()]


def load_lease(tx: Tx, project: str, key: str, lock_token: str) -> Lease | None:
    row = tx.execute(_LEASES_OF + " AND lock_token = ?", (project, key, lock_token)).fetchone()
    return None if row is None else _lease(row)


def load_state(tx: Tx, project: str, key: str, before_ticket: int | None = None) -> LockState:
    """What an acquire is decided on: the lease rows, the live waiters ahead of
    `before_ticket` (all of them when None), and the recorded lock delay, in
    one statement (on PostgreSQL one round trip, not one for the line and
    another for the leases)."""
    return _state_of(tx.execute(_STATE, _state_params(tx, project, key, before_ticket)).fetchall())


# load_state's reads as one statement: one row per lease row of the lock (one
# row of nulls for none), each followed by the counts of the live waiters
# ahead of a ticket (how many, how many of them exclusive) and the recorded
# lock delay.
_STATE = (
    f"SELECT {columns(_LeaseRow, 'l')}, q.waiting, q.exclusive, q.delay_until FROM ("
    "SELECT COUNT(*) AS waiting, "
    "COALESCE(SUM(CASE WHEN mode = 'exclusive' THEN 1 ELSE 0 END), 0) AS exclusive, "
    "(SELECT d.until_ms FROM lock_delays d WHERE d.project = ? AND d.key = ?) AS delay_until "
    "FROM lock_waiters WHERE project = ? AND key = ? AND ticket < ? AND alive_until_ms > ?) q "
    "LEFT JOIN locks l ON l.project = ? AND l.key = ?"
)


def _state_params(
    tx: Tx, project: str, key: str, before_ticket: int | None
) -> tuple[Any, ...]:
    ahead = before_ticket if before_ticket is not None else _NO_TICKET
    return (project, key, project, key, ahead, tx.now_ms, project, key)


def _state_of(rows: list[Any]) -> LockState:
    """The LockState of _STATE's rows."""
    count, exclusive, delay = rows[0][_AFTER_LEASE:]
    leases = [_lease(row) for row in rows if row[1] is not None]  # lock_token: a lease row
    return LockState(leases, int(count), int(exclusive), None if delay is None else int(delay))


def live_of(leases: list[Lease], now_ms: int) -> list[Lease]:
    """The live leases, oldest first (the oldest holder is the one shown)."""
    live = [lease for lease in leases if rules.is_live(lease, now_ms)]
    return sorted(live, key=lambda lease: (lease.acquired_ms, lease.fencing_token))


def start_delay(tx: Tx, project: str, lease: Lease, reason: EndReason) -> None:
    """Record the lock delay `lease` asked for, if its ending starts one that
    has not passed yet (SPEC §3.9). Of several leases ending (a force release
    of a shared lock), the longest delay holds."""
    until = rules.delay_until_ms(lease, reason, tx.now_ms)
    if until is None or until <= tx.now_ms:
        return
    tx.execute(
        "INSERT INTO lock_delays (project, key, until_ms) VALUES (?, ?, ?) "
        "ON CONFLICT (project, key) DO UPDATE SET until_ms = excluded.until_ms "
        "WHERE lock_delays.until_ms < excluded.until_ms",
        (project, lease.key, until),
    )


def _lease_values(project: str, lease: Lease) -> tuple[Any, ...]:
    return (
        project, lease.key, lease.lock_token, lease.fencing_token, lease.acquired_ms,
        lease.expires_ms, lease.deadline_ms, rules.end_of_life_ms(lease), lease.operation,
        lease.metadata_json, lease.on_expiry.value, lease.key_id, lease.lock_delay_ms,
        lease.mode.value,
        lease.session_id,
    )


_PLACE_COLUMNS = (
    "(ticket, project, key, lock_token, alive_until_ms, replica, key_id, since_ms, "
    "gives_up_ms, mode)"
)


def join_line(
    tx: Tx, project: str, keys: Sequence[str], request: AcquireRequest, place: Place
) -> int:
    """Put the caller in the line of every key under one new ticket: one
    number for all its lines, so no two waiters can each wait for the other
    (in every line the smaller ticket goes first; SPEC §3.7). The ticket is
    drawn while this batch holds the keys of every line it joins (batch.py),
    after every earlier join of those lines committed, so in each line
    ticket order is arrival order: a set waits behind exactly the sets and
    callers that came before it on any of its keys. On PostgreSQL from a
    sequence, so joins of different lines never wait for each other; on
    SQLite from the counter row (its batches take turns anyway)."""
    with tx.sending():  # on PostgreSQL a cursor per statement: a set sends several
        placed = _send_join(tx, project, keys, request, place)
    return _ticket_of(placed)


def _send_join(
    tx: Tx, project: str, keys: Sequence[str], request: AcquireRequest, place: Place
) -> Cursor:
    """join_line's statements, none of them waiting for another's answer (so
    that they can go out with others in one round trip): the cursor whose
    row is the ticket (`_ticket_of`)."""
    # since/gives_up are only shown (SPEC §3.4); a waiter that rejoins after
    # being dropped as dead shows its new place, measured from the rejoin.
    def place_of(key: str) -> tuple[Any, ...]:
        return (project, key, request.lock_token, tx.now_ms + place.alive_ms, place.replica,
                request.key_id, tx.now_ms, tx.now_ms + request.wait_ms, request.mode.value)

    sequence = tx.engine.ticket_sequence
    if sequence is not None:
        # The first line's place draws the ticket itself; the others take the
        # number this session drew last, that one.
        drawn, again = f"nextval('{sequence}')", f"currval('{sequence}')"
    else:
        tx.execute("UPDATE counters SET value = value + 1 WHERE name = 'lock_ticket'")
        drawn = again = "(SELECT value FROM counters WHERE name = 'lock_ticket')"
    first, *rest = keys
    placed = tx.execute(
        f"INSERT INTO lock_waiters {_PLACE_COLUMNS} VALUES ({drawn}, "
        "?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING ticket", place_of(first),
    )
    for key in rest:
        tx.execute(
            f"INSERT INTO lock_waiters {_PLACE_COLUMNS} VALUES ({again}, "
            "?, ?, ?, ?, ?, ?, ?, ?, ?)", place_of(key),
        )
    return placed


def _ticket_of(placed: Cursor) -> int:
    (ticket,) = placed.fetchone()
    return int(ticket)


def _decide_or_join(
    tx: Tx, known: KnownLeases, project: str, keys: Sequence[str], request: AcquireRequest,
    place: Place | None,
) -> tuple[SetGranted | Busy, int | None]:
    """The general case of an acquire of `keys` by a caller not in line:
    decide it, and with a `place`, join the line if it is refused (the
    outcome, and the ticket if it joined). The reads it is decided on and the
    join go out together (one round trip on PostgreSQL, not two): a caller
    that may wait is mostly refused here (a free lock with an empty line was
    granted by the acquire's first statement), and a grant takes its places
    back out in the same transaction. The reads come first, so they do not
    see its own places."""
    if place is None:
        return _settle(tx, known, project, keys, request, None), None
    with tx.sending():
        reads = [tx.execute(_STATE, _state_params(tx, project, key, None)) for key in keys]
        placed = _send_join(tx, project, keys, request, place)
    states = {key: _state_of(read.fetchall()) for key, read in zip(keys, reads, strict=True)}
    ticket = _ticket_of(placed)
    outcome = _settle(tx, known, project, keys, request, None, states)
    if isinstance(outcome, SetGranted):
        tx.execute("DELETE FROM lock_waiters WHERE ticket = ?", (ticket,))
        return outcome, None
    return outcome, ticket


def _settle(
    tx: Tx,
    known: KnownLeases,
    project: str,
    keys: Sequence[str],
    request: AcquireRequest,
    ticket: int | None,
    states: dict[str, LockState] | None = None,
) -> SetGranted | Busy:
    """Decide an acquire of `keys` (one key, or a lock set) for the caller
    holding `ticket` (None: not in line) and write the new leases; `states`:
    what the caller read already (load_state's, for `ticket`)."""
    if states is None:
        states = {key: load_state(tx, project, key, ticket) for key in keys}
    outcome = rules.decide_set(keys, states, request, tx.now_ms, lambda: fencing.take(tx))
    if not isinstance(outcome, SetGranted):
        return outcome
    for lease in outcome.leases:
        state = states[lease.key]
        if lease in state.leases:
            continue  # already held by this token: a retried acquire
        for dead in state.leases:
            # Dead leases not yet reaped end here, as the reaper would end them.
            if not rules.is_live(dead, tx.now_ms):
                known.forget(project, dead)
                end_lease(tx, project, dead, rules.dead_reason(dead))
        tx.execute(f"INSERT INTO locks ({_LEASE_VALUES}) VALUES ({_lease_places(None)})",
                   _lease_values(project, lease))
        known.put(project, lease)
        report_grant(tx, project, lease)
        if lease.mode is Mode.SHARED:
            # The shared waiters at the head are granted together (SPEC §3.6):
            # wake the next in line, which may be one of them.
            tx.events.append(lock_freed(project, lease.key))
    return outcome


def _single(outcome: SetGranted | Busy) -> Granted | Busy:
    if isinstance(outcome, Busy):
        return replace(outcome, key=None)  # the path names the key already
    (lease,) = outcome.leases
    return Granted(lease, outcome.created)


def report_grant(tx: Tx, project: str, lease: Lease) -> None:
    """Every new lease is reported once, after the commit (metrics, event log)."""
    tx.events.append(LeaseGranted(
        "lock", project, lease.key, lease.fencing_token, tx.origin, lease.mode.value
    ))


def acquire_attached(
    tx: Tx,
    known: KnownLeases,
    project: str,
    key: str,
    request: AcquireRequest,
    place: Place | None,
) -> AcquireResult | Refused:
    """An acquire with a `session_id` (SPEC §3.10): the session's row, read in
    the same transaction, must be live and the caller's, and gives the lease
    its expiry. A plain operation: the session is read before anything else."""
    attached = _attached(tx, project, request)
    if isinstance(attached, Refused):
        return attached
    return _decide_in_line(tx, known, project, key, attached, place)


def _decide_in_line(
    tx: Tx,
    known: KnownLeases,
    project: str,
    key: str,
    request: AcquireRequest,
    place: Place | None,
) -> AcquireResult:
    """The general case: read the leases, the line and the delay, decide, and
    grant or (with a place) join the line."""
    decided, ticket = _decide_or_join(tx, known, project, [key], request, place)
    return AcquireResult(_single(decided), ticket)


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
    if place is None and known.contended(project, key):
        return _refusal_first(tx, known, project, key, request)
    token_sql = fencing.drawn_by_statement(tx)
    guess = rules.decide_acquire(
        key, (), request, tx.now_ms, waiters_ahead=0,
        next_fencing_token=(lambda: 0) if token_sql else (lambda: fencing.take(tx)),
    )
    assert isinstance(guess, Granted)
    values = _lease_values(project, guess.lease)
    if token_sql is not None:  # the token is drawn by the insert, only if it inserts
        values = (*values[:3], *values[4:])
    free: tuple[Any, ...] = (project, key, tx.now_ms, project, key, tx.now_ms, project, key)
    if request.mode is Mode.SHARED:
        free = (*free, tx.now_ms)
    if token_sql is not None:  # gathered with the batch's like acquires, where it may be
        sent = tx.send(_free_insert(token_sql, request.mode), (*values, *free))
    else:
        condition = _IF_SHARABLE if request.mode is Mode.SHARED else _IF_FREE
        sent = tx.execute(_insert_if(condition, token_sql), (*values, *free))

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
            known.found(project, key, busy=False)
            report_grant(tx, project, granted.lease)
            return AcquireResult(granted)
        fencing.give_back(tx, guess.lease.fencing_token)
        return UNDECIDED

    def otherwise() -> AcquireResult:
        return _found(known, project, key, _decide_in_line(tx, known, project, key, request, place))

    return Step(answer, otherwise)


def _found(known: KnownLeases, project: str, key: str, result: AcquireResult) -> AcquireResult:
    known.found(project, key, busy=isinstance(result.outcome, Busy))
    return result


def _refusal_first(
    tx: Tx, known: KnownLeases, project: str, key: str, request: AcquireRequest
) -> Step[AcquireResult]:
    """A fail-fast acquire of a lock last found held by someone else: its
    first statement reads what the acquire is decided on, and a refusal,
    which writes nothing, is decided from it; anything else (the lock is free
    after all, the caller's own lease, a dead lease to end) is the general
    case's. On PostgreSQL a hot lock's refusals then cost one statement of the
    batch's pipeline each, not a guarded insert and two round trips. (A
    waiting acquire joins the line, a write, which must not come after later
    operations' first statements: it is not decided here.)"""
    sent = tx.execute(_STATE, _state_params(tx, project, key, None))

    def answer() -> AcquireResult | Undecided:
        verdict = rules.judge_acquire(key, _state_of(sent.fetchall()), request, tx.now_ms)
        return AcquireResult(_single(verdict)) if isinstance(verdict, Busy) else UNDECIDED

    def otherwise() -> AcquireResult:
        return _found(known, project, key, _decide_in_line(tx, known, project, key, request, None))

    return Step(answer, otherwise)


def acquire_set(
    tx: Tx,
    known: KnownLeases,
    project: str,
    keys: Sequence[str],
    request: AcquireRequest,
    place: Place | None,
) -> SetAttempt | Refused:
    """All or nothing (SPEC §3.7); refused and `place` given: one ticket, a
    place in every key's line. With a `session_id`, the session is read
    first, as for one key (SPEC §3.10)."""
    attached = _attached(tx, project, request)
    if isinstance(attached, Refused):
        return attached
    request = attached
    outcome, ticket = _decide_or_join(tx, known, project, keys, request, place)
    return SetAttempt(outcome, ticket)


def _attached(tx: Tx, project: str, request: AcquireRequest) -> AcquireRequest | Refused:
    """The request with its session's expiry, if it names a session: read on
    every attempt, since the session may have ended while the caller waited.
    An unknown, foreign or ended session is Refused: every caller reads the
    session first, so its operation has written nothing yet."""
    if request.session_id is None:
        return request
    return refused_before_writing(
        lambda: sessions.attach(tx, project, request), NotFound, SessionLost
    )


def _retried(
    tx: Tx, known: KnownLeases, project: str, keys: Sequence[str], request: AcquireRequest,
    ticket: int, place: Place,
) -> tuple[int, SetGranted | Busy]:
    """Refresh the caller's place in every line, then decide its acquire:
    the ticket it holds now, and the outcome. The refresh and the reads the
    decision needs go out together (one round trip on PostgreSQL): the reads
    count only the waiters ahead of the ticket, which the refresh of its own
    place leaves as they are."""
    # Contract: only the live waiter with the smallest ticket may take a free
    # lock, so waiters are granted in arrival order.
    with tx.sending():
        refresh = tx.execute(
            "UPDATE lock_waiters SET alive_until_ms = ? WHERE ticket = ?",
            (tx.now_ms + place.alive_ms, ticket),
        )
        reads = [tx.execute(_STATE, _state_params(tx, project, key, ticket)) for key in keys]
    states = {key: _state_of(read.fetchall()) for key, read in zip(keys, reads, strict=True)}
    if refresh.rowcount == len(keys):
        return ticket, _settle(tx, known, project, keys, request, ticket, states)
    # Dropped as dead (e.g. a stalled loop), from some lines or all: rejoin
    # every line at the back, under one new ticket, and decide from there.
    tx.execute("DELETE FROM lock_waiters WHERE ticket = ?", (ticket,))
    ticket = join_line(tx, project, keys, request, place)
    return ticket, _settle(tx, known, project, keys, request, ticket)


def retry_waiter(
    tx: Tx,
    known: KnownLeases,
    project: str,
    key: str,
    request: AcquireRequest,
    ticket: int,
    place: Place,
) -> AcquireResult | Refused:
    attached = _attached(tx, project, request)
    if isinstance(attached, Refused):
        return attached
    request = attached
    ticket, settled = _retried(tx, known, project, [key], request, ticket, place)
    outcome = _single(settled)
    if isinstance(outcome, Granted):
        tx.execute("DELETE FROM lock_waiters WHERE ticket = ?", (ticket,))
        return AcquireResult(outcome)
    return AcquireResult(outcome, ticket)


def retry_set_waiter(
    tx: Tx,
    known: KnownLeases,
    project: str,
    keys: Sequence[str],
    request: AcquireRequest,
    ticket: int,
    place: Place,
) -> SetAttempt | Refused:
    """A waiting set is granted when it is at the head of every key's line
    (behind shared waiters only, for a shared set) and every key is free for
    it, all in this one transaction."""
    attached = _attached(tx, project, request)
    if isinstance(attached, Refused):
        return attached
    request = attached
    ticket, outcome = _retried(tx, known, project, keys, request, ticket, place)
    if isinstance(outcome, SetGranted):
        tx.execute("DELETE FROM lock_waiters WHERE ticket = ?", (ticket,))
        return SetAttempt(outcome)
    return SetAttempt(outcome, ticket)


def leave_line(tx: Tx, ticket: int) -> None:
    """Give up the ticket's place in every line it holds (a set holds several)."""
    left = tx.execute(
        "DELETE FROM lock_waiters WHERE ticket = ? RETURNING project, key", (ticket,)
    ).fetchall()
    for project, key in left:
        tx.events.append(lock_freed(project, key))  # the next in line may go now


def drop_waiters_of(tx: Tx, replica: str) -> None:
    """Remove a dead replica's waiters from every lock's line; the next in
    each line may go now."""
    gone = tx.execute(
        "DELETE FROM lock_waiters WHERE replica = ? RETURNING project, key", (replica,)
    ).fetchall()
    for project, key in {(p, k) for p, k in gone}:
        tx.events.append(lock_freed(project, key))


_EXPIRY_PARAMS = (
    ("expires_ms", "bigint"), ("dies_ms", "bigint"), ("project", "text"), ("key", "text"),
    ("lock_token", "text"), ("fencing_token", "bigint"), ("judged_expires_ms", "bigint"),
)
# Contract: the row changes only if it is still exactly the lease the rules
# judged (the fencing token names the grant; only renewals move the expiry).
# Each returns a row for each lease it moved, so a gathered renewal's answer
# and a lone one's read the same way.
_EXPIRY = Together(
    "UPDATE locks SET expires_ms = ?, dies_ms = ? "
    "WHERE project = ? AND key = ? AND lock_token = ? AND fencing_token = ? "
    "AND expires_ms = ? RETURNING fencing_token",
    f"UPDATE locks l SET expires_ms = x.expires_ms, dies_ms = x.dies_ms "
    f"FROM {unnest(_EXPIRY_PARAMS)} "
    "WHERE l.project = x.project AND l.key = x.key AND l.lock_token = x.lock_token "
    "AND l.fencing_token = x.fencing_token AND l.expires_ms = x.judged_expires_ms "
    "RETURNING x.n, l.fencing_token",
)


def _send_expiry(tx: Tx, project: str, before: Lease, after: Lease) -> Cursor:
    """Move the judged lease's expiry (a first statement that may be
    gathered); the cursor has a row when it did."""
    return tx.send(_EXPIRY, (
        after.expires_ms, rules.end_of_life_ms(after), project, before.key,
        before.lock_token, before.fencing_token, before.expires_ms,
    ))


def _judged(leases: list[Lease], lock_token: str, now_ms: int) -> Lease | None:
    """The lease the renewal and release rules judge a token against: the
    token's own, or else the lock's newest live lease (a lock held by someone
    else tells a late renewal it was superseded), or else any on record."""
    for lease in leases:
        if lease.lock_token == lock_token:
            return lease
    live = live_of(leases, now_ms)
    if live:
        return live[-1]
    return leases[0] if leases else None


def renew(
    tx: Tx, known: KnownLeases, project: str, key: str, lock_token: str, ttl_seconds: int
) -> Step[Lease | Refused]:
    """A step operation: first a guarded update of the lease this writer last
    wrote, then, if that was stale, the row decides; a renewal the rules
    refuse (LeaseLost, LeaseExpired) is Refused."""
    remembered = known.get(project, key, lock_token)
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
        if sent is not None and guess is not None and sent.fetchone() is not None:
            known.put(project, guess)
            return guess
        return UNDECIDED

    def otherwise() -> Lease | Refused:
        current = _judged(load_leases(tx, project, key), lock_token, tx.now_ms)
        reason = None
        if current is None or current.lock_token != lock_token:
            reason = ended.reason(tx, project, key, lock_token)
        # Nothing written before the rules decide: the first statement, when
        # sent, matched no row (else `answer` decided), and the rest read.
        renewed = refused_before_writing(
            lambda: rules.decide_renew(current, lock_token, ttl_seconds, tx.now_ms, reason),
            LeaseLost, LeaseExpired,
        )
        if isinstance(renewed, Refused):
            return renewed
        assert current is not None  # decide_renew refused otherwise
        _send_expiry(tx, project, current, renewed)
        known.put(project, renewed)
        return renewed

    return Step(answer, otherwise)


def release(
    tx: Tx, known: KnownLeases, project: str, key: str, lock_token: str
) -> Step[bool]:
    """A step operation: the token's own live lease ends, whatever other
    (shared) leases the lock has; if it has none, the general case ends a
    dead one still on record, as the reaper would."""
    sent = tx.send(_RELEASE, (project, key, lock_token, tx.now_ms))

    def answer() -> bool | Undecided:
        row = sent.fetchone()
        if row is None:
            return UNDECIDED
        lease = _lease(row)
        known.forget(project, lease)
        ended.remember(
            tx, project, key, lock_token, lease.fencing_token, EndReason.RELEASED,
            lease.acquired_ms,
        )
        tx.events.append(lock_freed(project, key, remote=bool(row[_AFTER_LEASE])))
        return True

    def otherwise() -> bool:
        lease = load_lease(tx, project, key, lock_token)
        if lease is None:
            return False  # never held, or already ended
        # Dead (the first statement deletes a live one): it ends as it died.
        known.forget(project, lease)
        end_lease(tx, project, lease, rules.dead_reason(lease))
        return False

    return Step(answer, otherwise)


def force_release(
    tx: Tx, known: KnownLeases, project: str, key: str, by: ForceReleaser
) -> ForceReleased | Refused:
    """End every live lease of the lock if `by` may (else Refused: Forbidden,
    decided on what was read, before anything is written); dead ones on
    record end as they died (expired, or with their session)."""
    leases = load_leases(tx, project, key)
    live = live_of(leases, tx.now_ms)
    if live and not rules.may_force_release_all(live, by.key_id, by.is_admin):
        return Refused(Forbidden(
            "Only an admin or the API key that took every live lease of this lock "
            "may force-release it."
        ))
    for lease in leases:
        known.forget(project, lease)
        alive = rules.is_live(lease, tx.now_ms)
        reason = EndReason.FORCE_RELEASED if alive else rules.dead_reason(lease)
        end_lease(tx, project, lease, reason)
    return ForceReleased(key, live[0] if live else None, tx.now_ms, len(live))


def fence_check(tx: Tx, project: str, key: str, token: int) -> FenceVerdict:
    """Whether `token` is the fencing token of a live lease of the lock, and
    if not, why (SPEC §3.8). A read: nothing is written."""
    leases = load_leases(tx, project, key)
    if any(lease.fencing_token == token for lease in leases):
        return rules.judge_fence(leases, token, tx.now_ms, None)
    reason = ended.reason_of_token(tx, project, key, token)
    return rules.judge_fence(leases, token, tx.now_ms, reason)


def view(tx: Tx, project: str, key: str) -> LockView:
    live = live_of(load_leases(tx, project, key), tx.now_ms)
    (waiting,) = tx.execute(
        "SELECT COUNT(*) FROM lock_waiters WHERE project = ? AND key = ? AND alive_until_ms > ?",
        (project, key, tx.now_ms),
    ).fetchone()
    lease = live[0] if live else None
    holder = None if lease is None else holder_of(tx, project, lease)
    line = line_of(tx, project, key) if waiting else ()
    return LockView(key, lease, int(waiting), tx.now_ms, holder, line, len(live))


def holder_of(tx: Tx, project: str, lease: Lease) -> KeyRef:
    if lease.key_id is None:
        return KeyRef(None, None)
    (name,) = tx.execute(
        "SELECT COALESCE((SELECT name FROM api_keys WHERE id = ?), "
        "(SELECT name FROM identities WHERE project = ? AND id = ?))",
        (lease.key_id, project, lease.key_id),
    ).fetchone()
    return KeyRef(lease.key_id, name)


def _waiter(key_id: str | None, name: str | None, since_ms: int, gives_up_ms: int) -> WaiterView:
    return WaiterView(KeyRef(key_id, name), since_ms, gives_up_ms)


def line_of(tx: Tx, project: str, key: str) -> tuple[WaiterView, ...]:
    """The first LINE_SHOWN live waiters in arrival (ticket) order."""
    rows = tx.execute(
        f"SELECT {_WAITER_COLUMNS} FROM lock_waiters w {names_of('w')} "
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
        f"FROM lock_waiters w {names_of('w')} "
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
    # First the page of held keys with their holder counts (a grouped scan of
    # the key range, stopping at `limit` keys however many holders each has),
    # then their leases, waiter counts and lines, each in one statement.
    low = max(prefix, after or "")
    counted = tx.execute(
        "SELECT key, COUNT(*) FROM locks WHERE project = ? AND key >= ? AND key < ? "
        "AND key > ? AND dies_ms > ? GROUP BY key ORDER BY key LIMIT ?",
        (project, low, prefix + "\U0010ffff", after or "", tx.now_ms, limit),
    ).fetchall()
    if not counted:
        return []
    first, last = counted[0][0], counted[-1][0]
    oldest: dict[str, tuple[Lease, str | None]] = {}
    for row in tx.execute(
        f"SELECT {columns(_LeaseRow, 'l')}, {HOLDER_NAME} FROM locks l "
        f"{names_of('l')} WHERE l.project = ? AND l.key >= ? "
        "AND l.key <= ? AND l.dies_ms > ? ORDER BY l.key, l.acquired_ms, l.fencing_token",
        (project, first, last, tx.now_ms),
    ).fetchall():
        lease = _lease(row)
        (holder_name,) = row[_AFTER_LEASE:]
        oldest.setdefault(lease.key, (lease, holder_name))
    waiting = dict(tx.execute(
        "SELECT key, COUNT(*) FROM lock_waiters WHERE project = ? AND key >= ? AND key <= ? "
        "AND alive_until_ms > ? GROUP BY key",
        (project, first, last, tx.now_ms),
    ).fetchall())
    lines = _lines_between(tx, project, first, last) if waiting else {}
    views = []
    for key, holders in counted:
        lease, name = oldest[key]
        views.append(LockView(
            key, lease, int(waiting.get(key, 0)), tx.now_ms, KeyRef(lease.key_id, name),
            tuple(lines.get(key, ())), int(holders),
        ))
    return views


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
        tx, KIND, "locks", "project, key, lock_token", "key", "dies_ms", tx.now_ms, bound,
        f"{_LEASE_COLUMNS}, project",
    )
    for row in dead:
        lease = _lease(row)
        (project,) = row[_AFTER_LEASE:]
        known.forget(project, lease)
        reason = rules.dead_reason(lease)  # an attached lease dies with its session
        ended.remember(
            tx, project, lease.key, lease.lock_token, lease.fencing_token, reason,
            lease.acquired_ms,
        )
        start_delay(tx, project, lease, reason)
        tx.events.append(lock_freed(project, lease.key))
    # Locks whose delay is over: their lines may go now (SPEC §3.9).
    delays_over, more_delays = delete_oldest_claimed(
        tx, KIND, "lock_delays", "project, key", "key", "until_ms", tx.now_ms, bound,
        "project, key",
    )
    for project, key in delays_over:
        tx.events.append(lock_freed(project, key))
    # A lock set's places share a ticket: a waiter row is (ticket, key).
    gone, more_waiters = delete_oldest_claimed(
        tx, KIND, "lock_waiters", "ticket, key", "key", "alive_until_ms", tx.now_ms, bound,
        "project, key",
    )
    for project, key in {(p, k) for p, k in gone}:
        tx.events.append(lock_freed(project, key))
    return len(dead), more or more_delays or more_waiters


def end_attached(tx: Tx, known: KnownLeases, session_id: str) -> int:
    """End every lease attached to a session its holder ended (SPEC §3.10);
    return how many were live. One statement by the session index."""
    gone = tx.execute(
        f"DELETE FROM locks WHERE session_id = ? RETURNING {_LEASE_COLUMNS}, project",
        (session_id,),
    ).fetchall()
    live = 0
    for row in gone:
        lease = _lease(row)
        (project,) = row[_AFTER_LEASE:]
        known.forget(project, lease)
        alive = rules.is_live(lease, tx.now_ms)
        live += alive
        reason = EndReason.SESSION_ENDED if alive else rules.dead_reason(lease)
        ended.remember(
            tx, project, lease.key, lease.lock_token, lease.fencing_token, reason,
            lease.acquired_ms,
        )
        start_delay(tx, project, lease, reason)
        tx.events.append(lock_freed(project, lease.key))
    return live


def follow_session(tx: Tx, session_id: str, expires_ms: int) -> None:
    """Keep the expiry of every live lease attached to a session equal to the
    session's (never past a lease's own deadline), in the transaction that
    renews the session. Attached leases are `release` leases, so they die at
    that expiry. A dead lease is left dead for the reaper."""
    tx.execute(
        "UPDATE locks SET expires_ms = CASE WHEN deadline_ms < ? THEN deadline_ms ELSE ? END, "
        "dies_ms = CASE WHEN deadline_ms < ? THEN deadline_ms ELSE ? END "
        "WHERE session_id = ? AND dies_ms > ?",
        (expires_ms, expires_ms, expires_ms, expires_ms, session_id, tx.now_ms),
    )


def held_by_session(tx: Tx, session_id: str, limit: int) -> tuple[list[str], int]:
    """The keys of the live leases attached to a session (the first `limit`,
    sorted, each once: shared leases of one key may share a session) and how
    many leases there are."""
    rows = tx.execute(
        "SELECT DISTINCT key FROM locks WHERE session_id = ? AND dies_ms > ? "
        "ORDER BY key LIMIT ?",
        (session_id, tx.now_ms, limit),
    ).fetchall()
    (count,) = tx.execute(
        "SELECT COUNT(*) FROM locks WHERE session_id = ? AND dies_ms > ?",
        (session_id, tx.now_ms),
    ).fetchone()
    return [key for (key,) in rows], int(count)
