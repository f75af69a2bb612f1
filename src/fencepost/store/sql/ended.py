"""Why recent leases ended, so a late renewal can be told why it lost the lock.

Within a batch the records are gathered and written together before the commit
(a statement per batch, not one per ended lease); a renewal later
in the same batch reads the gathered ones first. Under savepoint replay each
record is written at once, so a refused operation's rollback takes it too.
"""

from __future__ import annotations

from fencepost.core.leases import EndReason
from fencepost.events import Ended
from fencepost.store.batch import PerBatch, Tx
from fencepost.store.sql.bounded import delete_oldest

_INSERT = (
    "INSERT INTO ended_leases (project, key, lock_token, reason, ended_ms, fencing_token) VALUES "
)
_ROW = "(?, ?, ?, ?, ?, ?)"
_ON_CONFLICT = (
    " ON CONFLICT (project, key, lock_token) DO UPDATE SET "
    "reason = excluded.reason, ended_ms = excluded.ended_ms, "
    "fencing_token = excluded.fencing_token"
)
# A fence check's lookup, by the index that leads with the token (migration 0015).
BY_FENCING_TOKEN = (
    "SELECT reason FROM ended_leases WHERE fencing_token = ? AND project = ? AND key = ?"
)
# Rows per statement: 48 parameters at most. psycopg caches its parsing of a
# statement of at most 50 parameters (MAX_CACHED_STATEMENT_PARAMS) and parses
# a longer one anew every time, about 100 µs for ten rows; and few distinct
# statement texts for the statement caches.
_CHUNK = 8

# (project, key, lock_token): (reason, ended_ms, fencing_token)
_Pending = dict[tuple[str, str, str], tuple[str, int, int]]
_Row = tuple[str, str, str, str, int, int]


def _write_gathered(tx: Tx, pending: _Pending) -> None:
    _write(tx, [(*ended, *what) for ended, what in pending.items()])


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
        _write(tx, [(project, key, lock_token, reason.value, tx.now_ms, fencing_token)])
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
    row = tx.execute(
        "SELECT reason FROM ended_leases WHERE project = ? AND key = ? AND lock_token = ?",
        (project, key, lock_token),
    ).fetchone()
    return _why(row)


def reason_of_token(tx: Tx, project: str, key: str, fencing_token: int) -> EndReason | None:
    """Why the lease of this lock with this fencing token ended, if it is on record."""
    pending = _GATHERED.of(tx)
    for (p, k, _), (why, _, fencing) in (pending or {}).items():
        if (p, k, fencing) == (project, key, fencing_token):
            return EndReason(why)
    row = tx.execute(BY_FENCING_TOKEN, (fencing_token, project, key)).fetchone()
    return _why(row)


def _write(tx: Tx, rows: list[_Row]) -> None:
    # Each (project, key, lock_token) appears once: one statement may not
    # update a row twice (PostgreSQL refuses).
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
        tx, "ended_leases", "project, key, lock_token", "ended_ms", before_ms - 1, bound,
        "project",
    )
    return more


def _why(row: tuple[str] | None) -> EndReason | None:
    if row is None:
        return None
    (why,) = row
    return EndReason(why)
