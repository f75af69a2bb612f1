"""Deleting at most so many rows per statement, for the reaper's bounded passes."""

from __future__ import annotations

from typing import Any

from fencepost.store.batch import Key, Tx


def delete_oldest(
    tx: Tx, table: str, key: str, by: str, below: int, bound: int, returning: str
) -> tuple[list[Any], bool]:
    """Delete the rows of `table` whose `by` is at most `below`, at most `bound`
    of them, smallest `by` first (its index finds them); return the deleted
    rows' `returning` columns, and whether the bound was reached (more rows
    may be left). `key` is the table's primary key (its columns)."""
    rows = tx.execute(
        f"DELETE FROM {table} WHERE ({key}) IN (SELECT {key} FROM {table} "
        f"WHERE {by} <= ? ORDER BY {by} LIMIT ?) RETURNING {returning}",
        (below, bound),
    ).fetchall()
    return rows, len(rows) >= bound


def delete_oldest_claimed(
    tx: Tx, kind: str, table: str, key: str, name: str, by: str, below: int, bound: int,
    returning: str,
) -> tuple[list[Any], bool]:
    """`delete_oldest`, for rows that belong to a lock or pool: only the rows
    whose Key(`kind`, project, `name` column) this transaction holds or could
    claim (batch.py) are deleted; the others are busy in another transaction,
    which may be changing them, and are left for a later pass."""
    found = tx.execute(
        f"SELECT {key}, project, {name} FROM {table} WHERE {by} <= ? ORDER BY {by} LIMIT ?",
        (below, bound),
    ).fetchall()
    if not found:
        return [], False
    width = len(found[0]) - 2
    claimed = {
        (held.project, held.name)
        for held in tx.claim(Key(kind, row[width], row[width + 1]) for row in found)
    }
    rows = [row[:width] for row in found if (row[width], row[width + 1]) in claimed]
    deleted: list[Any] = []
    if rows:
        listed = ", ".join(["(" + ", ".join(["?"] * width) + ")"] * len(rows))
        deleted = tx.execute(
            f"DELETE FROM {table} WHERE {by} <= ? AND ({key}) IN (VALUES {listed}) "
            f"RETURNING {returning}",
            (below, *(value for row in rows for value in row)),
        ).fetchall()
    return deleted, len(found) >= bound
