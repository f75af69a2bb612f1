"""Where a PostgreSQL store stands: which database it is connected to, and
which replication confirms its commits (SPEC §6 "Highly available
PostgreSQL", §7.9).

Tokens after a failover. A standby promoted after an asynchronous failover
may lack the last commits of the old primary, the fencing-token sequence's
last draws among them: drawing on from its copy would issue again tokens
that holders of the old primary already carry (and tickets that waiters
parked on a surviving replica still hold). So whenever a connection reaches
a database this deployment did not last write to, the sequences are
floored before that connection runs anything else:

- a database is named by its cluster's system identifier (pg_control, the
  same on a primary and all its physical standbys), its own oid (a dump
  restored into a new database gets a new one) and the cluster's current
  timeline (a promotion and a point-in-time restore each start a new one).
  The name of the database last floored is kept in the database itself
  (`meta`), so a process that starts on a promoted standby finds the old
  primary's name there, replicated before the failover, and floors too;
- the floor is the highest of the database's clock in microseconds, the
  sequence's own value, and the highest value this process read on any
  database (at each connection and every 10 s), plus NEW_DATABASE_MARGIN_US.
  A token issued before is below it unless more than the margin's worth of
  tokens were drawn since this process last read the sequence, or, for a
  process that never read the old database, the database hosts' clocks
  disagree by more than the margin (decisions.md, "Fencing across a
  failover");
- any other connection floors at the database clock alone (SPEC §7.8: a copy
  restored in place keeps its name).

Floors run in a transaction holding one advisory lock, so two replicas
flooring at once never set the sequence back; a floor never lowers it.
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

# What a token may need to clear on a database reached for the first time: one
# hour of microseconds, far beyond any clock disagreement NTP leaves, and
# 3.6e9 tokens (years of grants at this service's rates). Each failover
# moves tokens up by at most this much; 2^53 (JSON's exact integers) stays
# two centuries away.
NEW_DATABASE_MARGIN_US = 3_600 * 1_000_000
# A floor within this many of the sequence's value leaves it alone: a grant
# drawing between the floor's read and its setval could otherwise be drawn
# again (grants do not take the floor's lock), and no thousand grants fit
# in the microseconds between the two.
FLOOR_SLACK = 1_000
# The advisory lock every floor holds ('fencepost floor' in ASCII, as a
# bigint); the keys of locks and pools are hashes that may take any value,
# and sharing one with this merely makes a floor wait for a batch.
FLOOR_LOCK = 0x666C6F6F72
IDENTITY = "database_identity"  # its `meta` row
SYNC_COMMIT_LEVELS = ("on", "remote_write", "remote_apply")


class Mode(enum.StrEnum):
    """What confirms a commit before fencepost answers for it."""

    NONE = "none"  # the primary alone: no standby attached
    ASYNC = "async"  # standbys attached, none waited for: a failover may lose commits
    SYNC = "sync"  # a synchronous standby confirms every commit


@dataclass(frozen=True, slots=True)
class Replication:
    mode: Mode
    standbys: int  # standbys streaming from the primary now

    @property
    def as_json(self) -> dict[str, Any]:
        return {"mode": self.mode.value, "standbys": self.standbys}


# The sequences whose numbers must never be drawn twice: fencing tokens, and
# the tickets of parked waiters (a replica that outlives a failover keeps its
# waiters' tickets; the same number drawn again would be another waiter's
# place, and leaving or granting one would act on the other).
TOKENS = "fencing_tokens"
SEQUENCES = (TOKENS, "lock_tickets", "slot_waiters_ticket_seq")


@dataclass(frozen=True, slots=True)
class Standing:
    """What one statement read on a fresh connection or every 10 s."""

    standby: bool  # the server is in recovery: it cannot take writes
    identity: str  # "system identifier:database oid:timeline"
    recorded: str | None  # the identity the last floor recorded in `meta`
    sequences: dict[str, int]  # each of SEQUENCES' value
    clock_ms: int
    replication: Replication

    @property
    def new(self) -> bool:
        """A database this deployment did not last write to. One that no
        floor ever recorded a name in (a new store, or one from a version
        before names were recorded) is taken for the one last written to."""
        return self.recorded is not None and self.recorded != self.identity


# The timeline is the first 8 hex digits of the current WAL file's name; a
# standby has no current WAL position (and refuses writes anyway).
STANDING_SQL = """
SELECT pg_is_in_recovery(),
       (SELECT system_identifier::text FROM pg_control_system())
           || ':' || (SELECT oid FROM pg_database WHERE datname = current_database()),
       CASE WHEN pg_is_in_recovery() THEN 0
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END,
       (SELECT value FROM meta WHERE name = 'database_identity'),
       (SELECT last_value FROM fencing_tokens),
       (SELECT last_value FROM lock_tickets),
       (SELECT last_value FROM slot_waiters_ticket_seq),
       (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
       current_setting('synchronous_standby_names'),
       current_setting('synchronous_commit'),
       (SELECT count(*) FROM pg_stat_replication)
"""


def mode_of(standby_names: str, commit_level: str, standbys: int) -> Mode:
    """A commit waits for a synchronous standby when the primary names some
    and this session's commits wait for remote confirmation."""
    if standby_names.strip() and commit_level in SYNC_COMMIT_LEVELS:
        return Mode.SYNC
    return Mode.ASYNC if standbys > 0 else Mode.NONE


def standing_of(row: tuple[Any, ...]) -> Standing:
    standby, system, timeline, recorded, *values = row[:4 + len(SEQUENCES)]
    clock, names, level, standbys = row[4 + len(SEQUENCES):]
    return Standing(
        standby=bool(standby), identity=f"{system}:{int(timeline)}", recorded=recorded,
        sequences={name: int(value) for name, value in zip(SEQUENCES, values, strict=True)},
        clock_ms=int(clock),
        replication=Replication(mode_of(str(names), str(level), int(standbys)), int(standbys)),
    )


def floors_for(standing: Standing, high_water: dict[str, int]) -> dict[str, int]:
    """What each sequence is floored at on a connection that read `standing`
    (see the module's docstring): on a new database, every sequence above all
    it and this process know of, plus the margin; on the same one, the
    tokens at the clock (tickets need no clock: nothing outside the store
    holds them across a restart)."""
    clock_us = standing.clock_ms * 1000
    if not standing.new:
        return {TOKENS: clock_us}
    return {
        name: max(clock_us, value, high_water.get(name, 0)) + NEW_DATABASE_MARGIN_US
        for name, value in standing.sequences.items()
    }


def floored(standing: Standing, high_water: dict[str, int]) -> bool:
    """Whether nothing is left to floor or record for `standing`."""
    if standing.recorded != standing.identity:
        return False
    floors = floors_for(standing, high_water)
    return all(standing.sequences[name] >= floor for name, floor in floors.items())


Execute = Callable[[str, tuple[Any, ...] | None], Awaitable[list[tuple[Any, ...]]]]


async def floor_sequences(
    execute: Execute, high_water: dict[str, int]
) -> tuple[dict[str, int], Standing]:
    """Floor the sequences for a new connection (see the module's docstring)
    and record the database's name; return each floored sequence's value
    after it, and the standing read under the floors' lock. `execute` runs
    one statement on the connection and returns its rows."""
    await execute("BEGIN", None)
    try:
        await execute("SELECT pg_advisory_xact_lock(%s)", (FLOOR_LOCK,))
        # Read again under the lock: another replica may have floored since.
        (row,) = await execute(STANDING_SQL, None)
        now = standing_of(row)
        values: dict[str, int] = {}
        for name, floor in floors_for(now, high_water).items():
            # The names are ours (SEQUENCES), not input.
            ((values[name],),) = await execute(
                f"SELECT CASE WHEN last_value < %s THEN setval('{name}', %s) "
                f"ELSE last_value END FROM {name}",
                (floor - FLOOR_SLACK, floor),
            )
        if now.recorded != now.identity:
            await execute(
                "INSERT INTO meta (name, value) VALUES (%s, %s) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (IDENTITY, now.identity),
            )
        await execute("COMMIT", None)
    except Exception:
        with contextlib.suppress(Exception):  # the connection is closed after this anyway
            await execute("ROLLBACK", None)
        raise
    return values, now
