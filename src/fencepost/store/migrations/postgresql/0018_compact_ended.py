"""Ended leases kept compactly (store/sql/ended.py), as on SQLite: one row per
ended lease keyed by its fencing token, with digests of the names; the records
of `ended_leases` are carried over."""

from typing import Any

from yoyo import step

from fencepost.store.sql.ended import carry_over

__depends__ = {"0017_sessions_by_key"}


def apply(conn: Any) -> None:
    cursor = conn.cursor()
    # By fencing token: a record goes in at the primary key index's newest edge.
    cursor.execute("CREATE TABLE ended (fencing_token BIGINT PRIMARY KEY, "
                   "lease_digest BIGINT NOT NULL, lock_digest BIGINT NOT NULL, "
                   "reason SMALLINT NOT NULL, ended_ms BIGINT NOT NULL)")
    # With the token: a late renewal's lookup (the lease's latest end) is then
    # one index descent; on the digest alone the planner may walk the primary
    # key backwards instead, through every record when the lease has none.
    cursor.execute("CREATE INDEX ended_by_lease ON ended (lease_digest, fencing_token)")
    cursor.execute("CREATE INDEX ended_by_age ON ended (ended_ms)")
    carry_over(conn, "INSERT INTO ended VALUES (%s, %s, %s, %s, %s) "
                     "ON CONFLICT (fencing_token) DO NOTHING")


steps = [step(apply)]
