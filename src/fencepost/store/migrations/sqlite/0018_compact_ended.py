"""Ended leases kept compactly (store/sql/ended.py): one row per ended lease
keyed by its fencing token, with digests of the names instead of the names.
`ended_leases` repeated the lock's name and the lock token in its table and in
each of its two indexes, about 270 bytes kept per acquire+release cycle; the
records it holds are carried over."""

from typing import Any

from yoyo import step

from fencepost.store.sql.ended import carry_over

__depends__ = {"0017_sessions_by_key"}


def apply(conn: Any) -> None:
    cursor = conn.cursor()
    # The fencing token is the rowid: a record goes in at the table's newest edge.
    cursor.execute("CREATE TABLE ended (fencing_token INTEGER PRIMARY KEY, "
                   "lease_digest INTEGER NOT NULL, lock_digest INTEGER NOT NULL, "
                   "reason INTEGER NOT NULL, ended_ms INTEGER NOT NULL)")
    cursor.execute("CREATE INDEX ended_by_lease ON ended (lease_digest)")
    cursor.execute("CREATE INDEX ended_by_age ON ended (ended_ms)")
    carry_over(conn, "INSERT OR REPLACE INTO ended VALUES (?, ?, ?, ?, ?)")


steps = [step(apply)]
