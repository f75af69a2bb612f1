"""Deleting at most so many rows per statement, for the reaper's bounded passes."""

from __future__ import annotations

from typing import Any

from fencepost.store.batch import Tx


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
