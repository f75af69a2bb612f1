"""Why recent leases ended, so a late renewal can be told why it lost the lock
and a fence check why a token is stale (SPEC §3.2, §3.8), for the ended
retention (SPEC §6, `--ended-retention`).

Compact, because every acquire+release cycle leaves one: a row per ended lease
in `ended` (migration 0018), keyed by its fencing token (tokens never repeat,
and rise with time, so a record goes in at the table's newest edge), with only
what the two answers need: the reason as a small number, when it ended, and
two 64-bit digests instead of the names, one of the lease (project, lock,
lock token: a late renewal's lookup, by an index of its own) and one of the
lock (project, lock: a fence check's token must belong to the asking lock).
Two names with the same digest would give one the other's reason, a chance of
about one in 10^8 among a hundred million records (a day at over 1,000 ends a
second): the answer is still a refusal, with a wrong reason at worst.

Within a batch the records are gathered and written together before the commit
(a statement per batch, not one per ended lease); a renewal later in the same
batch reads the gathered ones first. Under savepoint replay each record is
written at once, so a refused operation's rollback takes it too.
"""

from __future__ import annotations

import hashlib
from typing import Any

from fencepost.core.leases import EndReason
from fencepost.events import Ended
from fencepost.store.batch import PerBatch, Tx
from fencepost.store.sql.bounded import delete_oldest

# Each reason's number in `ended.reason` (never renumbered: stored).
REASON_CODES = {
    EndReason.EXPIRED: 1,
    EndReason.RELEASED: 2,
    EndReason.FORCE_RELEASED: 3,
    EndReason.SUPERSEDED: 4,
    EndReason.SESSION_EXPIRED: 5,
    EndReason.SESSION_ENDED: 6,
}
_REASONS = {code: reason for reason, code in REASON_CODES.items()}

_INSERT = "INSERT INTO ended (fencing_token, lease_digest, lock_digest, reason, ended_ms) VALUES "
_ROW = "(?, ?, ?, ?, ?)"
_ON_CONFLICT = (
    " ON CONFLICT (fencing_token) DO UPDATE SET "
    "lease_digest = excluded.lease_digest, lock_digest = excluded.lock_digest, "
    "reason = excluded.reason, ended_ms = excluded.ended_ms"
)
# A fence check's lookup: by the table's key, the token.
BY_FENCING_TOKEN = "SELECT reason, lock_digest FROM ended WHERE fencing_token = ?"
# A late renewal's: the lease's latest end (a lock token may hold a lock again
# after its lease ended, and end again).
BY_LEASE = "SELECT reason FROM ended WHERE lease_digest = ? ORDER BY fencing_token DESC LIMIT 1"
# Rows per statement: 40 parameters. psycopg caches its parsing of a
# statement of at most 50 parameters (MAX_CACHED_STATEMENT_PARAMS) and parses
# a longer one anew every time, about 100 µs for ten rows; and few distinct
# statement texts for the statement caches.
_CHUNK = 8

# (project, key, lock_token): (reason, ended_ms, fencing_token)
_Pending = dict[tuple[str, str, str], tuple[str, int, int]]
_Row = tuple[int, int, int, int, int]


def _digest(kind: bytes, *names: str) -> int:
    """A 64-bit signed digest of the names (a column of INTEGER or bigint):
    BLAKE2b, keyed by what is digested, each name's length before it."""
    digest = hashlib.blake2b(digest_size=8, person=kind)
    for name in names:
        data = name.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(4, "big"))
        digest.update(data)
    return int.from_bytes(digest.digest(), "big", signed=True)


def lease_digest(project: str, key: str, lock_token: str) -> int:
    return _digest(b"fencepost-lease", project, key, lock_token)


def lock_digest(project: str, key: str) -> int:
    return _digest(b"fencepost-lock", project, key)


def row_of(project: str, key: str, lock_token: str, reason: str, ended_ms: int,
           fencing_token: int) -> _Row:
    """The `ended` row of a lease that ended (also migration 0018's)."""
    return (fencing_token, lease_digest(project, key, lock_token), lock_digest(project, key),
            REASON_CODES[EndReason(reason)], ended_ms)


def carry_over(conn: Any, insert: str) -> None:
    """Migration 0018: each record of the old `ended_leases` into `ended` (by
    `insert`, a statement of five parameters in the driver's style), then the
    old table dropped. `conn` is the migration's DB-API connection."""
    cursor, old = conn.cursor(), conn.cursor()
    old.execute("SELECT project, key, lock_token, reason, ended_ms, fencing_token "
                "FROM ended_leases WHERE fencing_token IS NOT NULL")
    while rows := old.fetchmany(10_000):
        cursor.executemany(insert, [row_of(*row) for row in rows])
    cursor.execute("DROP TABLE ended_leases")


def _write_gathered(tx: Tx, pending: _Pending) -> None:
    _write(tx, [row_of(*ended, *what) for ended, what in pending.items()])


_GATHERED = PerBatch("ended leases", _write_gathered)


def remember(
    tx: Tx, project: str, key: str, lock_token: str, fencing_token: int, reason: EndReason,
    acquired_ms: int | None = None,
) -> None:
    """Record why the lease ended (and its fencing token, for fence checks), and
    report the end (the one place every lock lease's end passes, the reaper's
    included)."""
    held_ms = None if acquired_ms is None else max(0, tx.now_ms - acquired_ms)
    tx.events.append(Ended("lock", project, key, reason.value, held_ms, tx.origin))
    if tx.batch.isolated:
        _write(tx, [row_of(project, key, lock_token, reason.value, tx.now_ms, fencing_token)])
        return
    pending = _GATHERED.of(tx)
    if pending is None:
        pending = _GATHERED.start(tx, {})
    pending[(project, key, lock_token)] = (reason.value, tx.now_ms, fencing_token)


def reason(tx: Tx, project: str, key: str, lock_token: str) -> EndReason | None:
    pending = _GATHERED.of(tx)
    if pending and (gathered := pending.get((project, key, lock_token))) is not None:
        why, _ended_ms, _fencing_token = gathered
        return EndReason(why)
    row = tx.execute(BY_LEASE, (lease_digest(project, key, lock_token),)).fetchone()
    return None if row is None else _REASONS.get(int(row[0]))


def reason_of_token(tx: Tx, project: str, key: str, fencing_token: int) -> EndReason | None:
    """Why the lease of this lock with this fencing token ended, if it is on record."""
    pending = _GATHERED.of(tx)
    for (p, k, _), (why, _, fencing) in (pending or {}).items():
        if (p, k, fencing) == (project, key, fencing_token):
            return EndReason(why)
    row = tx.execute(BY_FENCING_TOKEN, (fencing_token,)).fetchone()
    if row is None or int(row[1]) != lock_digest(project, key):
        return None  # a token of another lock, or none on record
    return _REASONS.get(int(row[0]))


def _write(tx: Tx, rows: list[_Row]) -> None:
    # Each fencing token appears once: one statement may not update a row
    # twice (PostgreSQL refuses), and a lease has one token.
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start:start + _CHUNK]
        tx.execute(
            _INSERT + ", ".join([_ROW] * len(chunk)) + _ON_CONFLICT,
            tuple(value for row in chunk for value in row),
        )


def forget(tx: Tx, before_ms: int, bound: int) -> bool:
    """Delete at most `bound` records of leases that ended before `before_ms`;
    True when the bound was reached (more may be left)."""
    # ended_ms < before_ms: the last millisecond deleted is the one before.
    _, more = delete_oldest(
        tx, "ended", "fencing_token", "ended_ms", before_ms - 1, bound, "fencing_token",
    )
    return more
