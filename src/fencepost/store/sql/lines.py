"""Keeping waiters' places in line alive, for the parked waiters of a process in
one operation (server/waiting.py sweeps with it).

Contract: a line's places are refreshed only while the transaction holds the
line's key (claimed, never waited for, see batch.py): a line busy in another
transaction is skipped and reported, so the sweep never waits for, nor
deadlocks with, the operations on any one line.
"""

from __future__ import annotations

from fencepost.store.batch import Key, Tx

Line = tuple[str, str, str]  # (kind, project, name), the kind a Key kind
# Which table holds the places of each kind of line, and its line column.
_TABLES = {"lock": ("lock_waiters", "key"), "pool": ("slot_waiters", "pool")}
# Tickets per statement: few distinct statement texts, well under every
# database's parameter limit.
_CHUNK = 500


def keep(tx: Tx, waiting: dict[Line, list[int]], alive_ms: int) -> list[Line]:
    """Make the tickets of each line last `alive_ms` from now; return the
    lines skipped as busy. Each line's places are named by line and ticket: a
    lock set's one ticket stands in several lines, each refreshed only under
    its own key."""
    held = tx.claim(Key(*line) for line in waiting)
    claimed = {(key.kind, key.project, key.name) for key in held}
    for line in sorted(claimed):
        kind, project, name = line
        table, column = _TABLES[kind]
        tickets = sorted(waiting[line])
        for start in range(0, len(tickets), _CHUNK):
            chunk = tickets[start:start + _CHUNK]
            tx.execute(
                f"UPDATE {table} SET alive_until_ms = ? WHERE project = ? AND {column} = ? "
                f"AND ticket IN ({', '.join(['?'] * len(chunk))})",
                (tx.now_ms + alive_ms, project, name, *chunk),
            )
    return [line for line in waiting if line not in claimed]
