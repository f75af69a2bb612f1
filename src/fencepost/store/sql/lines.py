"""Keeping waiters' places in line alive, for every parked waiter of a process
in one operation (server/waiting.py sweeps with it).

Contract: a place is refreshed only while the transaction holds its line's key
(claimed, never waited for, see batch.py): a line busy in another transaction
is skipped, so the sweep never waits for, nor deadlocks with, the operations
on any one line. Only places with less than `refresh_below_ms` left are
written, so a place is written once every few sweeps, not at each.
"""

from __future__ import annotations

from fencepost.store.batch import Key, Tx

# Which table holds the places of each kind of line (the Freed / Key kind).
_TABLES = {"lock": "lock_waiters", "pool": "slot_waiters"}
# Tickets per statement: few distinct statement texts, well under every
# database's parameter limit.
_CHUNK = 500


def keep(
    tx: Tx, places: list[tuple[str, str, str, int]], alive_ms: int, refresh_below_ms: int
) -> None:
    claimed = set(tx.claim({Key(kind, project, name) for kind, project, name, _ in places}))
    for kind, table in _TABLES.items():
        tickets = sorted(
            ticket for k, project, name, ticket in places
            if k == kind and Key(k, project, name) in claimed
        )
        for start in range(0, len(tickets), _CHUNK):
            chunk = tickets[start:start + _CHUNK]
            tx.execute(
                f"UPDATE {table} SET alive_until_ms = ? WHERE alive_until_ms < ? "
                f"AND ticket IN ({', '.join(['?'] * len(chunk))})",
                (tx.now_ms + alive_ms, tx.now_ms + refresh_below_ms, *chunk),
            )
