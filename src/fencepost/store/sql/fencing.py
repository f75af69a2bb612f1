"""Fencing tokens (SPEC §1, §7.2): each new lease of a lock gets a token above
every token that lock was granted before, and no token is issued twice.

Two ways, chosen by the engine (`Engine.token_sequence`):

- the counter row (SQLite), moved in memory within a batch and stored once
  per batch: written, in the transaction of the grants it was drawn for, to the
  highest token handed out, so a token is never reused, even after a crash.
  Batches are serialised whole (BEGIN IMMEDIATE), so no other writer moves the
  row between the batch's first bump and its last write. A token given back
  after a failed conditional insert can leave a number unissued: tokens may
  skip, never repeat;
- a database sequence (PostgreSQL), drawn while the batch holds the lock's key
  (batch.py), so every earlier grant of that lock had drawn its token and
  committed before: the new token is above them all. nextval never returns a
  value twice, and the value drawn by a transaction that commits is durable
  with it (commits are synchronous). Grants of different locks, on any
  replica, draw concurrently: no counter row serialises them.
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


def drawn_by_statement(tx: Tx) -> str | None:
    """The SQL expression that draws a token inside a statement (the lock's
    key held), or None when the token is `take`n before the statement."""
    sequence = tx.engine.token_sequence
    return None if sequence is None else f"nextval('{sequence}')"


def take(tx: Tx) -> int:
    """A new token, for a grant of a lock whose key this batch holds."""
    sequence = tx.engine.token_sequence
    if sequence is not None:
        (drawn,) = tx.execute(f"SELECT nextval('{sequence}')").fetchone()
        return int(drawn)
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
    have it, so the counter keeps moving only when a lock changes hands (a
    sequence's values are simply skipped)."""
    counter = _COUNTER.of(tx)
    if counter is not None and counter.issued == token:
        counter.issued -= 1


def floor_at_clock(tx: Tx) -> int:
    """Raise the counter (or sequence) to the store clock in microseconds
    (SPEC §7.8), and return it. Run when a store opens (each PostgreSQL
    replica, as it starts): a store restored from an older copy then never
    reissues a token it had issued before the copy was superseded, as long as
    it granted fewer than a million leases a second. Today's microseconds
    (~1.8e15) stay far below 2^53 (~9e15), the limit every JSON reader gets
    exactly, until the 2250s."""
    floor = tx.now_ms * 1000
    sequence = tx.engine.token_sequence
    if sequence is not None:
        # Moved only upwards, and only when below the floor: a replica
        # starting while others draw never sets the sequence back (they would
        # have to draw a million tokens a second to pass the clock).
        (value,) = tx.execute(
            f"SELECT CASE WHEN last_value < ? THEN setval('{sequence}', ?) ELSE last_value END "
            f"FROM {sequence}",
            (floor, floor),
        ).fetchone()
        return int(value)
    tx.execute(
        "UPDATE counters SET value = ? WHERE name = 'fencing' AND value < ?", (floor, floor)
    )
    (value,) = tx.execute("SELECT value FROM counters WHERE name = 'fencing'").fetchone()
    return int(value)
