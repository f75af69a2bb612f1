"""Where a PostgreSQL store stands: which database it is connected to, and
which replication confirms its commits (SPEC §6 "Highly available
PostgreSQL", §7.9).

Tokens after a failover. A standby promoted after an asynchronous failover
may lack the last commits of the old primary, the fencing-token sequence's
last draws among them: drawing on from its copy would issue again tokens
that holders of the old primary already carry (and tickets that waiters
parked on a surviving replica still hold). And a primary frozen while another
was promoted (a paused VM, a stalled disk) may wake up still taking writes,
its sequence as far behind as the promoted one is ahead. So every connection
this process opens is judged (`change_of`) against the database this process
last wrote to, before it runs anything else:

- a database is named by its cluster's system identifier (pg_control, the
  same on a primary and all its physical standbys), its own oid (a dump
  restored into a new database gets a new one) and the cluster's current
  timeline (a promotion and a point-in-time restore each start a new one).
  The name of the database last floored is kept in the database itself
  (`meta`), so a process that starts on a promoted standby finds the old
  primary's name there, replicated before the failover, and floors too;
- SAME: the database this process last wrote to, its token sequence not
  behind any token this process has seen: tokens floored at the database's
  clock alone (SPEC §7.8: a copy restored in place keeps its name);
- NEW: another name, not behind (a promoted standby, a new timeline, a
  restore into a new database): every sequence floored at the highest of the
  database's clock in microseconds, the sequence's own value, and the highest
  value this process has seen (every sequence read at each connection and
  every 10 s, and every token it granted), plus NEW_DATABASE_MARGIN_US. A token
  issued before is below it unless more than the margin's worth of tokens
  were drawn since this process last read the sequence, or, for a process
  that never read the old database, the database hosts' clocks disagree by
  more than the margin (decisions.md, "Fencing across a failover");
- BACK: a database behind one this process wrote to: another cluster (system
  identifier), an older timeline of the same one (a deposed primary that
  woke up, or a leader that took its key back and had the promoted members
  rewound to it), or the same name with its tokens below ones this process
  has seen. The store prefers any other host of a multi-host URL that is not
  behind (postgresql.py); written to only when none answers, floored like a
  NEW one, and never silently: an error in the log, an event, a metric and
  /readyz.

Floors run in a transaction holding one advisory lock, so two replicas
flooring at once never set the sequence back; a floor never lowers it.
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass, field
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
# How long /readyz shows that the store went back (SPEC §7.9) after the last
# time it did: long enough for any probe or person to see it; the metric and
# the log keep it for good.
WENT_BACK_SHOWN_MS = 3_600_000
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
        """A database this deployment did not last write to, by the name the
        last floor recorded in it. One that no floor ever recorded a name in
        (a new store, or one from a version before names were recorded) is
        taken for the one last written to."""
        return self.recorded is not None and self.recorded != self.identity

    @property
    def system(self) -> str:
        """The cluster's system identifier (the same on all its members)."""
        return system_of(self.identity)

    @property
    def timeline(self) -> int:
        return timeline_of(self.identity)


def system_of(identity: str) -> str:
    return identity.split(":", 1)[0]


def timeline_of(identity: str) -> int:
    return int(identity.rsplit(":", 1)[1])


class Change(enum.StrEnum):
    """How a database reached by a connection relates to the one this
    process last wrote to (see the module's docstring)."""

    SAME = "same"
    NEW = "new"
    BACK = "went_back"


@dataclass(slots=True)
class Written:
    """What this process has written to: the database it last wrote to, and
    the newest timeline it wrote to on each cluster (by system identifier)."""

    last: str | None = None
    timelines: dict[str, int] = field(default_factory=dict)

    def record(self, identity: str) -> None:
        self.last = identity
        system, timeline = system_of(identity), timeline_of(identity)
        self.timelines[system] = max(self.timelines.get(system, 0), timeline)


@dataclass(frozen=True, slots=True)
class WentBack:
    """The last time this process wrote to a database behind one it wrote to
    before (`before`), for /readyz: `after` is that database, `at_ms` when
    (epoch ms), `tokens_from` where its tokens continue, `count` how many
    times in this process's life."""

    before: str
    after: str
    at_ms: int
    tokens_from: int
    count: int


def change_of(standing: Standing, written: Written, high_water: dict[str, int]) -> Change:
    """Judge a database reached by a connection (see the module's docstring).
    A process's first connection has only the database's own record of the
    name last floored to go by."""
    if written.last is None:
        return Change.NEW if standing.new else Change.SAME
    if standing.identity == written.last and not standing.new:
        behind = standing.sequences[TOKENS] < high_water.get(TOKENS, 0)
        return Change.BACK if behind else Change.SAME
    if standing.system != system_of(written.last) or \
            standing.timeline < written.timelines.get(standing.system, 0):
        return Change.BACK
    return Change.NEW


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


def floors_for(
    standing: Standing, high_water: dict[str, int], change: Change
) -> dict[str, int]:
    """What each sequence is floored at on a connection that read `standing`
    (see the module's docstring): on a database NEW or BACK, every sequence
    above all it and this process know of, plus the margin; on the SAME one,
    the tokens at the clock (tickets need no clock: nothing outside the store
    holds them across a restart)."""
    clock_us = standing.clock_ms * 1000
    if change is Change.SAME:
        return {TOKENS: clock_us}
    if change is Change.NEW and standing.recorded == standing.identity:
        # Another replica floored this database since it changed: its own
        # values carry that replica's margin already, and this process's
        # high water needs one of its own.
        return {
            name: max(clock_us, high_water.get(name, 0)) + NEW_DATABASE_MARGIN_US
            for name in standing.sequences
        }
    return {
        name: max(clock_us, value, high_water.get(name, 0)) + NEW_DATABASE_MARGIN_US
        for name, value in standing.sequences.items()
    }


def floored(standing: Standing, high_water: dict[str, int], change: Change) -> bool:
    """Whether nothing is left to floor or record for `standing`."""
    if standing.recorded != standing.identity:
        return False
    floors = floors_for(standing, high_water, change)
    return all(standing.sequences[name] >= floor for name, floor in floors.items())


Execute = Callable[[str, tuple[Any, ...] | None], Awaitable[list[tuple[Any, ...]]]]


async def floor_sequences(
    execute: Execute, high_water: dict[str, int], change: Change
) -> tuple[dict[str, int], Standing]:
    """Floor the sequences for a new connection to a database judged `change`
    (see the module's docstring) and record the database's name; return each
    floored sequence's value after it, and the standing read under the
    floors' lock. `execute` runs one statement on the connection and returns
    its rows."""
    await execute("BEGIN", None)
    try:
        await execute("SELECT pg_advisory_xact_lock(%s)", (FLOOR_LOCK,))
        # Read again under the lock: another replica may have floored since.
        (row,) = await execute(STANDING_SQL, None)
        now = standing_of(row)
        values: dict[str, int] = {}
        for name, floor in floors_for(now, high_water, change).items():
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
