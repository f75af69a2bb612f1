"""The fencing counter, moved in memory within a batch and stored once per batch.

Contract: the counter row is written, in the transaction of the grants it was
drawn for, to the highest token handed out, so a token is never reused, even
after a crash, and never goes backwards. Batches are serialised (BEGIN
IMMEDIATE on SQLite; on PostgreSQL one advisory lock per batch, across
replicas), so no other writer moves the row between the batch's first bump and
its last write. A token given back after a failed conditional insert can leave
a number unissued: tokens may skip, never repeat.
"""

from __future__ import annotations

from dataclasses import dataclass

from fencepost.store.batch import PerBatch, Tx


@dataclass(slots=True)
class _Counter:
    stored: int  # the row's value in this transaction
    issued: int  # the highest token handed out and still in use


def _store(tx: Tx, counter: _Counter) -> None:
    if counter.issued > counter.stored:
        tx.execute("UPDATE counters SET value = ? WHERE name = 'fencing'", (counter.issued,))


_COUNTER = PerBatch("fencing counter", _store)


def take(tx: Tx) -> int:
    counter = _COUNTER.of(tx)
    if counter is None:
        # The first grant of a batch bumps the row itself (which also serves a
        # batch of one grant in one statement); later ones count in memory.
        (value,) = tx.execute(
            "UPDATE counters SET value = value + 1 WHERE name = 'fencing' RETURNING value"
        ).fetchone()
        _COUNTER.start(tx, _Counter(int(value), int(value)))
        return int(value)
    counter.issued += 1
    return counter.issued


def give_back(tx: Tx, token: int) -> None:
    """`token` was taken for a grant that was not written: let the next grant
    have it, so the counter keeps moving only when a lock changes hands."""
    counter = _COUNTER.of(tx)
    if counter is not None and counter.issued == token:
        counter.issued -= 1


def floor_at_clock(tx: Tx) -> int:
    """Raise the counter to the store clock in microseconds (SPEC §7.8), and
    return it. Run when a store opens (each PostgreSQL replica, as it starts):
    a store restored from an older copy then never reissues a token it had
    issued before the copy was superseded, as long as it granted fewer than a
    million leases a second. Today's microseconds (~1.8e15) stay far below
    2^53 (~9e15), the limit every JSON reader gets exactly, until the 2250s."""
    floor = tx.now_ms * 1000
    tx.execute(
        "UPDATE counters SET value = ? WHERE name = 'fencing' AND value < ?", (floor, floor)
    )
    (value,) = tx.execute("SELECT value FROM counters WHERE name = 'fencing'").fetchone()
    return int(value)
