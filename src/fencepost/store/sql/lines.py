"""Keeping waiters' places in line alive, for the parked waiters of a process in
one operation (server/waiting.py sweeps with it).

Contract: a line's places are refreshed only while the transaction holds the
line's key, which the operation declares (`keys`) like every operation on
that line: it waits for a transaction that holds the key, never deadlocked
(keys are taken in sorted order), though it goes ahead of the operations
still queued for it (SqlStore.keep_waiting). It used to claim each line
without waiting and skip
the busy ones: on PostgreSQL, under a steady stream of operations on a line
(10,000 waiters joining the lines of 100 locks), most lines were busy at
every sweep, their places ran out, and the reaper dropped waiters that were
still parked.
"""

from __future__ import annotations

from fencepost.store.batch import Key, Keys, Tx

Line = tuple[str, str, str]  # (kind, project, name), the kind a Key kind
# Which table holds the places of each kind of line, and its line column.
_TABLES = {"lock": ("lock_waiters", "key"), "pool": ("slot_waiters", "pool")}
# Tickets per statement: few distinct statement texts, well under every
# database's parameter limit.
_CHUNK = 500


def keys(waiting: dict[Line, list[int]]) -> Keys:
    """The keys of the lines `keep` refreshes."""
    return tuple(Key(*line) for line in waiting)


def keep(tx: Tx, waiting: dict[Line, list[int]], alive_ms: int) -> dict[Line, list[int]]:
    """Make the tickets of each line last `alive_ms` from now; return, by
    line, the tickets that are no longer in it (their place ran out, or the
    store dropped it), so that their waiters can rejoin. Each line's places
    are named by line and ticket: a lock set's one ticket stands in several
    lines."""
    gone: dict[Line, list[int]] = {}
    for line in sorted(waiting):
        kind, project, name = line
        table, column = _TABLES[kind]
        tickets = sorted(set(waiting[line]))
        for start in range(0, len(tickets), _CHUNK):
            chunk = tickets[start:start + _CHUNK]
            kept = {
                ticket for (ticket,) in tx.execute(
                    f"UPDATE {table} SET alive_until_ms = ? WHERE project = ? AND {column} = ? "
                    f"AND ticket IN ({', '.join(['?'] * len(chunk))}) RETURNING ticket",
                    (tx.now_ms + alive_ms, project, name, *chunk),
                ).fetchall()
            }
            missing = [ticket for ticket in chunk if ticket not in kept]
            if missing:
                gone.setdefault(line, []).extend(missing)
    return gone
