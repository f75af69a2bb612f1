"""Replicas: which server process put each waiter in line, and which are gone.

A waiter is a parked request (SPEC §3.1, §4.2); its row in the line means
nothing once the process holding the request has died, yet until it leaves,
a free lock or slot stays blocked (a fail-fast acquire never jumps the line).
Each store object (one per `fencepost serve` process) draws a random replica
id for its life and stamps it on every waiter row it writes. The reaper asks
the backend which replicas are dead and removes their rows here and their
waiters from every line, in one transaction, waking the lines they stood in.
SPEC §7.4 asks for that within 1 s of the death.

Contract: a replica is judged dead only by a fact the database knows, never
by a replica being slow, so a live replica's waiters keep their place however
loaded it is. Batches are serialised (see batch.py), and a dead replica's row
and its waiters go together: reaping twice, or on two servers at once,
deletes nothing twice. Each waiter row also carries alive_until_ms, refreshed
by its retries: the safety net for a replica that hangs without dying, or
whose host vanished without closing its connections.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Protocol

from fencepost.store.batch import Tx

APPLICATION_NAME_PREFIX = "fencepost/"


@dataclass(frozen=True, slots=True)
class Place:
    """What a waiter row records about its place in line: the replica whose
    request holds it, and how long it lasts unless a retry refreshes it."""

    replica: str
    alive_ms: int


def new_replica_id() -> str:
    # Random per life: a restarted process is a new replica, so the rows of
    # its previous life can be told apart from its own.
    return secrets.token_hex(8)


class Liveness(Protocol):
    """How a backend tells which replicas are dead."""

    replica: str  # this process's id, stamped on its waiter rows

    def register(self, tx: Tx) -> None:
        """Record this replica, before it parks anyone, so that its waiters can
        be removed even if it dies before its first reap."""

    def dead_replicas(self, tx: Tx) -> list[str]:
        """Register this replica (again, if a peer judged it gone) and delete
        and return the rows of the replicas that are dead."""


# Why the database's sessions and not a heartbeat row per replica: a killed
# process's connections are closed by its kernel, so PostgreSQL ends their
# sessions at once; a replica is alive while any of its sessions (writer,
# readers, listener: each carries the replica's application_name) is. That
# reacts within one reaper round, costs no writes, and never mistakes a slow
# replica (a stalled event loop, a starved CPU) for a dead one, which a
# heartbeat that must be fresher than ~750 ms would, letting fail-fast
# callers jump a live waiter. A process that hangs keeps its sessions: its
# waiters stay until their alive_until_ms runs out, as before.
#
# A restart of PostgreSQL ends every session, and live replicas connect again
# one by one. So a replica is judged by its sessions only once it registered
# in the database's current run (db_started_us: when the server started, the
# same for every session of one run); each replica's reap registers it again
# after a restart (one write per restart, none otherwise).
_DB_STARTED_US = "(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint"
# Guarded by NOT EXISTS rather than by ON CONFLICT's WHERE, which would lock
# (write) the row at every reap.
_REGISTER = (
    f"INSERT INTO replicas (id, started_ms, db_started_us) SELECT ?, ?, {_DB_STARTED_US} "
    "WHERE NOT EXISTS (SELECT 1 FROM replicas "
    f"WHERE id = ? AND db_started_us = {_DB_STARTED_US}) "
    "ON CONFLICT (id) DO UPDATE SET db_started_us = excluded.db_started_us"
)
# Registers this replica, then deletes every other replica of this run
# without a session, provided this very session shows up with its own name
# (behind a pooler that rewrites or shares sessions nothing would, and
# nothing is judged dead). pg_stat_activity lists every session's
# application_name to every role.
_DEAD_SESSIONS = (
    f"WITH registered AS ({_REGISTER}) "
    "DELETE FROM replicas r WHERE r.id <> ? "
    f"AND r.db_started_us = {_DB_STARTED_US} "
    "AND EXISTS (SELECT 1 FROM pg_stat_activity "
    "WHERE pid = pg_backend_pid() AND application_name = ?) "
    "AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.application_name = ? || r.id) "
    "RETURNING r.id"
)


class DatabaseSessions:
    """PostgreSQL: a replica is alive while the database has a session of it."""

    def __init__(self) -> None:
        self.replica = new_replica_id()
        # Set on every connection of this process (libpq's application_name).
        self.application_name = APPLICATION_NAME_PREFIX + self.replica

    def register(self, tx: Tx) -> None:
        tx.execute(_REGISTER, (self.replica, tx.now_ms, self.replica))

    def dead_replicas(self, tx: Tx) -> list[str]:
        rows = tx.execute(
            _DEAD_SESSIONS,
            (self.replica, tx.now_ms, self.replica, self.replica, self.application_name,
             APPLICATION_NAME_PREFIX),
        )
        return [replica for (replica,) in rows.fetchall()]
