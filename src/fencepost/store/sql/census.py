"""Counts across every project for the metrics (read at scrape time: the store
is the truth every replica shares, so each replica reports the same numbers)."""

from __future__ import annotations

from fencepost.store.base import Census
from fencepost.store.batch import Tx
from fencepost.store.sql import pools, sessions

# Pools are made by admins and few; a bound keeps a scrape cheap regardless.
MAX_POOLS = 500


def read(tx: Tx) -> Census:
    # Contract: one snapshot (a reader's transaction), judged by the store's clock.
    now = tx.now_ms
    live, overdue = tx.execute(
        "SELECT COUNT(*), COALESCE(SUM(CASE WHEN expires_ms <= ? THEN 1 ELSE 0 END), 0) "
        "FROM locks WHERE dies_ms > ?",
        (now, now),
    ).fetchone()
    (slots,) = tx.execute(
        "SELECT COUNT(*) FROM slots WHERE lease_deadline_ms > ?", (now,)
    ).fetchone()
    names = tx.execute(
        "SELECT project, name FROM pools ORDER BY project, name LIMIT ?", (MAX_POOLS,)
    ).fetchall()
    views = [(p, v) for p, n in names if (v := pools.view(tx, p, n)) is not None]
    return Census(int(live), int(overdue), int(slots), views, sessions.count_live(tx))
