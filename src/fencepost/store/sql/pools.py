"""Pool and slot statements (portable SQL, `?` placeholders); each runs inside
the batch transaction (see batch.py), which makes count-then-admit atomic."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from fencepost.core import governor as gov
from fencepost.core import slots as rules
from fencepost.core.governor import GovernorState, Outcome
from fencepost.core.slots import PoolConfig, Slot
from fencepost.errors import NotFound
from fencepost.events import Ended, Granted, PoolChanged
from fencepost.store.base import PoolStats, PoolView, SlotAttempt, SlotReport, pool_freed
from fencepost.store.batch import Tx
from fencepost.store.sql.replicas import Place

_CONFIG_COLUMNS = (
    "slot_limit, queue_size, queue_timeout_ms, term_ms, renew_interval_ms, "
    "request_timeout_ms, rpm, adaptive, min_limit"
)
_GOVERNOR_COLUMNS = (
    "gov_limit, gov_plateau, gov_last_decrease_ms, gov_hold_ms, paused_until_ms, "
    "learned_rpm, window_reset_ms"
)
_STATS_COLUMNS = (
    "released, reclaimed, status_1xx, status_2xx, status_3xx, status_4xx, status_5xx, "
    "status_429, throttled, last_retry_after_ms, last_reported_ms"
)
_SLOT_COLUMNS = "slot_id, pool, acquired_ms, lease_deadline_ms, request_deadline_ms"
RPM_WINDOW_MS = 60_000


@dataclass(frozen=True, slots=True)
class _Pool:
    """A pool's configuration and what it has learned, read together."""

    config: PoolConfig
    governor: GovernorState

    @property
    def learns_rate(self) -> bool:
        # Pools that opted in (adaptive, or given a rate) learn from reports.
        return self.config.adaptive or self.config.rpm is not None

    @property
    def limit(self) -> int:
        c = self.config
        return gov.effective_limit(self.governor, c.limit, c.min_limit, c.adaptive)

    @property
    def rpm(self) -> int | None:
        return gov.effective_rpm(self.config.rpm, self.governor) if self.learns_rate else None


def new_slot_id() -> str:
    # 192 random bits: a slot ID is a bearer capability within its project.
    return "slot_" + secrets.token_urlsafe(24)


def _config(row: Any) -> PoolConfig:
    return PoolConfig(
        limit=row[0], queue_size=row[1], queue_timeout_ms=row[2], term_ms=row[3],
        renew_interval_ms=row[4], request_timeout_ms=row[5], rpm=row[6],
        adaptive=bool(row[7]), min_limit=row[8],
    )


def _governor(row: Any, config: PoolConfig) -> GovernorState:
    return GovernorState(
        limit=float(row[0]) if row[0] is not None else float(config.limit),
        plateau=row[1],
        last_decrease_ms=row[2],
        hold_ms=row[3],
        paused_until_ms=row[4],
        learned_rpm=row[5],
        window_reset_ms=row[6],
    )


def _stats(row: Any) -> PoolStats:
    return PoolStats(
        released=row[0],
        reclaimed=row[1],
        statuses={"1xx": row[2], "2xx": row[3], "3xx": row[4], "4xx": row[5], "5xx": row[6]},
        status_429=row[7],
        throttled=row[8],
        last_retry_after_ms=row[9],
        last_reported_ms=row[10],
    )


def _slot(row: Any) -> Slot:
    return Slot(row[0], row[1], row[2], row[3], row[4])


def _pool(row: Any, pool: str) -> _Pool:
    if row is None:
        raise NotFound(f"No pool named {pool!r}.")
    config = _config(row[:9])
    return _Pool(config, _governor(row[9:16], config))


_LOAD_WITH_COUNTS = (
    f"SELECT {_CONFIG_COLUMNS}, {_GOVERNOR_COLUMNS}, "
    "(SELECT COUNT(*) FROM slots s WHERE s.project = ? AND s.pool = ? "
    "AND s.lease_deadline_ms > ?), "
    "(SELECT COUNT(*) FROM slot_waiters w WHERE w.project = ? AND w.pool = ? "
    "AND w.alive_until_ms > ? AND w.ticket < ?) "
    "FROM pools WHERE project = ? AND name = ?"
)


def load_with_counts(
    tx: Tx, project: str, pool: str, before_ticket: int | None = None
) -> tuple[_Pool, int, int]:
    """The pool, its live slots and its live waiters ahead of `before_ticket`
    (all of them when None), in one statement."""
    ahead = before_ticket if before_ticket is not None else 2**62
    row = tx.execute(
        _LOAD_WITH_COUNTS,
        (project, pool, tx.now_ms, project, pool, tx.now_ms, ahead, project, pool),
    ).fetchone()
    return _pool(row, pool), int(row[16]), int(row[17])


def view(tx: Tx, project: str, pool: str) -> PoolView | None:
    try:
        state, used, queued = load_with_counts(tx, project, pool)
    except NotFound:
        return None
    row = tx.execute(
        f"SELECT {_STATS_COLUMNS} FROM pools WHERE project = ? AND name = ?", (project, pool)
    ).fetchone()
    return PoolView(
        name=pool,
        config=state.config,
        in_use=used,
        queued=queued,
        effective_limit=state.limit,
        stats=_stats(row),
        now_ms=tx.now_ms,
        governor=state.governor,
        effective_rpm=state.rpm,
    )


def put(tx: Tx, project: str, pool: str, config: PoolConfig) -> tuple[PoolView, bool]:
    values = (
        config.limit, config.queue_size, config.queue_timeout_ms, config.term_ms,
        config.renew_interval_ms, config.request_timeout_ms, config.rpm, int(config.adaptive),
        config.min_limit,
    )
    # Contract: replacing a configuration keeps the pool's slots, statistics and
    # learned state (clamped by the new bounds when read); a raised limit may
    # admit waiters at once, so all of them re-check.
    updated = tx.execute(
        "UPDATE pools SET slot_limit = ?, queue_size = ?, queue_timeout_ms = ?, term_ms = ?, "
        "renew_interval_ms = ?, request_timeout_ms = ?, rpm = ?, adaptive = ?, min_limit = ?, "
        "updated_ms = ? WHERE project = ? AND name = ?",
        (*values, tx.now_ms, project, pool),
    ).rowcount
    if not updated:
        tx.execute(
            f"INSERT INTO pools (project, name, {_CONFIG_COLUMNS}, created_ms, updated_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (project, pool, *values, tx.now_ms, tx.now_ms),
        )
    tx.events.append(pool_freed(project, pool, wake_all=True))
    tx.events.append(PoolChanged("changed" if updated else "created", project, pool, tx.origin))
    result = view(tx, project, pool)
    assert result is not None
    return result, not updated


def list_views(tx: Tx, project: str, prefix: str, after: str | None, limit: int) -> list[PoolView]:
    rows = tx.execute(
        "SELECT name FROM pools WHERE project = ? AND name >= ? AND name < ? AND name > ? "
        "ORDER BY name LIMIT ?",
        (project, prefix, prefix + "\U0010ffff", after or "", limit),
    ).fetchall()
    return [v for (name,) in rows if (v := view(tx, project, name)) is not None]


def delete(tx: Tx, project: str, pool: str) -> bool:
    gone = tx.execute("DELETE FROM pools WHERE project = ? AND name = ?", (project, pool)).rowcount
    if not gone:
        return False
    tx.execute("DELETE FROM slots WHERE project = ? AND pool = ?", (project, pool))
    tx.execute("DELETE FROM slot_waiters WHERE project = ? AND pool = ?", (project, pool))
    tx.execute("DELETE FROM pool_admissions WHERE project = ? AND pool = ?", (project, pool))
    # Every waiter re-checks, finds the pool gone and answers 404.
    tx.events.append(pool_freed(project, pool, wake_all=True))
    tx.events.append(PoolChanged("deleted", project, pool, tx.origin))
    return True


# --- admission ---------------------------------------------------------------


def _rate_wait_ms(tx: Tx, project: str, pool: str, state: _Pool) -> int | None:
    """How long until the pool may admit again by its pause and its rate."""
    waits = [gov.pause_remaining_ms(state.governor, tx.now_ms)]
    rpm = state.rpm
    if rpm is not None:
        row = tx.execute(
            "SELECT COUNT(*), MIN(admitted_ms) FROM pool_admissions "
            "WHERE project = ? AND pool = ? AND admitted_ms > ?",
            (project, pool, tx.now_ms - RPM_WINDOW_MS),
        ).fetchone()
        waits.append(gov.rpm_wait_ms(int(row[0]), row[1], rpm, tx.now_ms))
    found = [w for w in waits if w is not None]
    return max(found) if found else None


def _admit(tx: Tx, project: str, pool: str, state: _Pool, used: int) -> SlotAttempt:
    slot = rules.new_slot(new_slot_id(), pool, state.config, tx.now_ms)
    tx.execute(
        f"INSERT INTO slots (project, {_SLOT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
        (project, slot.slot_id, pool, slot.acquired_ms, slot.lease_deadline_ms,
         slot.request_deadline_ms),
    )
    if state.rpm is not None:
        tx.execute(
            "INSERT INTO pool_admissions (project, pool, admitted_ms) VALUES (?, ?, ?)",
            (project, pool, tx.now_ms),
        )
    tx.events.append(Granted("slot", project, pool, None, tx.origin))
    return SlotAttempt(slot, None, used + 1, state.limit)


def _try_admit(
    tx: Tx, project: str, pool: str, state: _Pool, used: int, waiters_ahead: int
) -> SlotAttempt:
    """Admit, or a refusal saying when to try again."""
    blocked_ms = _rate_wait_ms(tx, project, pool, state)
    if blocked_ms is None and rules.may_admit(state.limit, used, waiters_ahead):
        return _admit(tx, project, pool, state, used)
    if blocked_ms is None:
        deadlines = [
            row[0]
            for row in tx.execute(
                "SELECT request_deadline_ms FROM slots WHERE project = ? AND pool = ? "
                "AND lease_deadline_ms > ?",
                (project, pool, tx.now_ms),
            ).fetchall()
        ]
        blocked_ms = rules.retry_after_ms(deadlines, tx.now_ms, state.governor.hold_ms)
    return SlotAttempt(None, None, used, state.limit, blocked_ms)


def acquire(tx: Tx, project: str, pool: str, place: Place | None) -> SlotAttempt:
    # Contract: counting live slots and inserting the new one happen in one
    # transaction, so no more than `limit` slots are ever live (SPEC §7.5).
    state, used, queued = load_with_counts(tx, project, pool)
    attempt = _try_admit(tx, project, pool, state, used, queued)
    if attempt.slot is not None or place is None or queued >= state.config.queue_size:
        return attempt
    ticket = _join_line(tx, project, pool, place)
    return SlotAttempt(None, ticket, attempt.in_use, attempt.effective_limit,
                       attempt.retry_after_ms)


def _join_line(tx: Tx, project: str, pool: str, place: Place) -> int:
    row = tx.execute(
        "INSERT INTO slot_waiters (project, pool, alive_until_ms, replica) VALUES (?, ?, ?, ?) "
        "RETURNING ticket",
        (project, pool, tx.now_ms + place.alive_ms, place.replica),
    ).fetchone()
    return int(row[0])


def retry_waiter(tx: Tx, project: str, pool: str, ticket: int, place: Place) -> SlotAttempt:
    refreshed = tx.execute(
        "UPDATE slot_waiters SET alive_until_ms = ? WHERE ticket = ?",
        (tx.now_ms + place.alive_ms, ticket),
    ).rowcount
    if not refreshed:  # dropped as dead (e.g. a stalled loop): rejoin at the back
        ticket = _join_line(tx, project, pool, place)
    # NotFound once the pool is deleted; raising undoes this operation's writes.
    state, used, ahead = load_with_counts(tx, project, pool, ticket)
    attempt = _try_admit(tx, project, pool, state, used, ahead)
    if attempt.slot is None:
        return SlotAttempt(None, ticket, attempt.in_use, attempt.effective_limit,
                           attempt.retry_after_ms)
    tx.execute("DELETE FROM slot_waiters WHERE ticket = ?", (ticket,))
    if attempt.in_use < attempt.effective_limit:
        tx.events.append(pool_freed(project, pool))  # room for the next in line too
    return attempt


def leave_line(tx: Tx, project: str, pool: str, ticket: int) -> None:
    if tx.execute("DELETE FROM slot_waiters WHERE ticket = ?", (ticket,)).rowcount:
        tx.events.append(pool_freed(project, pool))


def drop_waiters_of(tx: Tx, replica: str) -> None:
    """Remove a dead replica's waiters from every pool's line; the next in
    each line may go now."""
    gone = tx.execute(
        "DELETE FROM slot_waiters WHERE replica = ? RETURNING project, pool", (replica,)
    ).fetchall()
    for project, pool in {(p, n) for p, n in gone}:
        tx.events.append(pool_freed(project, pool))


# --- renew and release -----------------------------------------------------------


_POOL_AND_SLOT = (
    f"SELECT {_CONFIG_COLUMNS}, {_GOVERNOR_COLUMNS}, s.project, "
    f"{', '.join('s.' + c for c in _SLOT_COLUMNS.split(', '))} "
    "FROM pools p LEFT JOIN slots s ON s.slot_id = ? WHERE p.project = ? AND p.name = ?"
)


def _own_slot(project: str, pool: str, row: Any) -> Slot | None:
    """The slot if it exists and is this project's and pool's; NotFound if it is
    someone else's; None when it is gone."""
    if row[0] is None:
        return None
    if row[0] != project or row[2] != pool:
        raise NotFound("No such slot in this pool.")
    return _slot(row[1:])


def _load_with_slot(tx: Tx, project: str, pool: str, slot_id: str) -> tuple[_Pool, Slot | None]:
    row = tx.execute(_POOL_AND_SLOT, (slot_id, project, pool)).fetchone()
    state = _pool(row, pool)  # NotFound without the pool
    return state, _own_slot(project, pool, row[16:])


def renew(tx: Tx, project: str, pool: str, slot_id: str) -> Slot:
    state, slot = _load_with_slot(tx, project, pool, slot_id)
    renewed = rules.renew(slot, state.config, tx.now_ms)
    tx.execute(
        "UPDATE slots SET lease_deadline_ms = ? WHERE slot_id = ?",
        (renewed.lease_deadline_ms, slot_id),
    )
    return renewed


def release(tx: Tx, project: str, pool: str, slot_id: str, report: SlotReport | None) -> bool:
    row = tx.execute(
        f"DELETE FROM slots WHERE slot_id = ? AND project = ? AND pool = ? "
        f"RETURNING {_SLOT_COLUMNS}",
        (slot_id, project, pool),
    ).fetchone()
    if row is None:  # gone, or another project's or pool's (NotFound), or no such pool
        _load_with_slot(tx, project, pool, slot_id)
        return False
    slot = _slot(row)
    if not rules.is_live(slot, tx.now_ms):
        # Already past its deadline: it was not held any more, only not yet reaped.
        _count_reclaimed(tx, project, pool, 1)
        return False
    state = _record_release(tx, project, pool, report)
    if report is not None:
        _learn(tx, project, pool, state, report, tx.now_ms - slot.acquired_ms)
    tx.events.append(pool_freed(project, pool))
    held_ms = tx.now_ms - slot.acquired_ms
    tx.events.append(Ended("slot", project, pool, "released", held_ms, tx.origin))
    return True


def _learn(
    tx: Tx, project: str, pool: str, state: _Pool, report: SlotReport, hold_ms: int
) -> None:
    """Feed the reported outcome to the governor; its new state is shared by every
    server through this row."""
    outcome = Outcome(
        status=report.status,
        throttled=report.throttled or 0,
        retry_after_ms=report.retry_after_ms,
        rate=report.rate,
        hold_ms=hold_ms,
    )
    learned = gov.on_report(
        state.governor, outcome, tx.now_ms, configured=state.config.limit,
        min_limit=state.config.min_limit, adaptive=state.config.adaptive,
        learns_rate=state.learns_rate,
    )
    if learned == state.governor:
        return
    tx.execute(
        "UPDATE pools SET gov_limit = ?, gov_plateau = ?, gov_last_decrease_ms = ?, "
        "gov_hold_ms = ?, paused_until_ms = ?, learned_rpm = ?, window_reset_ms = ? "
        "WHERE project = ? AND name = ?",
        (learned.limit, learned.plateau, learned.last_decrease_ms, learned.hold_ms,
         learned.paused_until_ms, learned.learned_rpm, learned.window_reset_ms, project, pool),
    )
    if learned.limit > state.governor.limit or learned.paused_until_ms < tx.now_ms:
        tx.events.append(pool_freed(project, pool))


def _record_release(tx: Tx, project: str, pool: str, report: SlotReport | None) -> _Pool:
    """Count the release; return the pool as it stands (what the governor learns
    from). Counted once per slot (a repeated release finds no slot), so
    statistics are not inflated by retries."""
    sets = ["released = released + 1"]
    args: list[Any] = []
    if report is not None:
        if report.status is not None:
            column = f"status_{rules.status_class(report.status)}"
            sets.append(f"{column} = {column} + 1")
            if report.status == 429:
                sets.append("status_429 = status_429 + 1")
        sets.append("throttled = throttled + ?")
        args.append(report.throttled or 0)
        if report.retry_after_ms is not None:
            sets.append("last_retry_after_ms = ?")
            args.append(report.retry_after_ms)
        sets += ["last_report = ?", "last_reported_ms = ?"]
        args += [report.report_json, tx.now_ms]
    row = tx.execute(
        f"UPDATE pools SET {', '.join(sets)} WHERE project = ? AND name = ? "
        f"RETURNING {_CONFIG_COLUMNS}, {_GOVERNOR_COLUMNS}",
        (*args, project, pool),
    ).fetchone()
    return _pool(row, pool)


def _count_reclaimed(tx: Tx, project: str, pool: str, count: int) -> None:
    tx.execute(
        "UPDATE pools SET reclaimed = reclaimed + ? WHERE project = ? AND name = ?",
        (count, project, pool),
    )
    tx.events.append(Ended("slot", project, pool, "reclaimed", None, tx.origin, count))


def reap(tx: Tx) -> int:
    """Reclaim slots past their lease deadline, drop dead waiters, forget
    admissions older than the rate window, and wake pools whose pause ended."""
    dead = tx.execute(
        "DELETE FROM slots WHERE lease_deadline_ms <= ? RETURNING project, pool",
        (tx.now_ms,),
    ).fetchall()
    per_pool: dict[tuple[str, str], int] = {}
    for project, pool in dead:
        per_pool[(project, pool)] = per_pool.get((project, pool), 0) + 1
    for (project, pool), count in per_pool.items():
        _count_reclaimed(tx, project, pool, count)
        tx.events.append(pool_freed(project, pool))
    gone = tx.execute(
        "DELETE FROM slot_waiters WHERE alive_until_ms <= ? RETURNING project, pool",
        (tx.now_ms,),
    ).fetchall()
    for project, pool in {(p, n) for p, n in gone}:
        tx.events.append(pool_freed(project, pool))
    tx.execute("DELETE FROM pool_admissions WHERE admitted_ms <= ?", (tx.now_ms - RPM_WINDOW_MS,))
    return len(dead)
