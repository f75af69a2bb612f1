"""Pool and slot statements (portable SQL, `?` placeholders); each runs inside
the batch transaction (see batch.py)."""

from __future__ import annotations

import secrets
from typing import Any

from fencepost.core import slots as rules
from fencepost.core.slots import PoolConfig, Slot
from fencepost.errors import NotFound
from fencepost.store.base import PoolStats, PoolView, SlotAttempt, SlotReport, pool_freed
from fencepost.store.batch import Tx

_CONFIG_COLUMNS = (
    "slot_limit, queue_size, queue_timeout_ms, term_ms, renew_interval_ms, "
    "request_timeout_ms, rpm, adaptive, min_limit"
)
_STATS_COLUMNS = (
    "released, reclaimed, status_1xx, status_2xx, status_3xx, status_4xx, status_5xx, "
    "status_429, throttled, last_retry_after_ms, last_reported_ms"
)
_SLOT_COLUMNS = "slot_id, pool, acquired_ms, lease_deadline_ms, request_deadline_ms"


def new_slot_id() -> str:
    # 192 random bits: a slot ID is a bearer capability within its project.
    return "slot_" + secrets.token_urlsafe(24)


def _config(row: Any) -> PoolConfig:
    return PoolConfig(
        limit=row[0], queue_size=row[1], queue_timeout_ms=row[2], term_ms=row[3],
        renew_interval_ms=row[4], request_timeout_ms=row[5], rpm=row[6],
        adaptive=bool(row[7]), min_limit=row[8],
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


def load_config(tx: Tx, project: str, pool: str) -> PoolConfig:
    row = tx.execute(
        f"SELECT {_CONFIG_COLUMNS} FROM pools WHERE project = ? AND name = ?", (project, pool)
    ).fetchone()
    if row is None:
        raise NotFound(f"No pool named {pool!r}.")
    return _config(row)


def in_use(tx: Tx, project: str, pool: str) -> int:
    row = tx.execute(
        "SELECT COUNT(*) FROM slots WHERE project = ? AND pool = ? AND lease_deadline_ms > ?",
        (project, pool, tx.now_ms),
    ).fetchone()
    return int(row[0])


def waiters(tx: Tx, project: str, pool: str, before_ticket: int | None = None) -> int:
    row = tx.execute(
        "SELECT COUNT(*) FROM slot_waiters WHERE project = ? AND pool = ? "
        "AND alive_until_ms > ? AND ticket < ?",
        (project, pool, tx.now_ms, before_ticket if before_ticket is not None else 2**62),
    ).fetchone()
    return int(row[0])


def view(tx: Tx, project: str, pool: str) -> PoolView | None:
    row = tx.execute(
        f"SELECT {_CONFIG_COLUMNS}, {_STATS_COLUMNS} FROM pools WHERE project = ? AND name = ?",
        (project, pool),
    ).fetchone()
    if row is None:
        return None
    config = _config(row[:9])
    return PoolView(
        name=pool,
        config=config,
        in_use=in_use(tx, project, pool),
        queued=waiters(tx, project, pool),
        effective_limit=rules.effective_limit(config),
        stats=_stats(row[9:]),
        now_ms=tx.now_ms,
    )


def put(tx: Tx, project: str, pool: str, config: PoolConfig) -> tuple[PoolView, bool]:
    values = (
        config.limit, config.queue_size, config.queue_timeout_ms, config.term_ms,
        config.renew_interval_ms, config.request_timeout_ms, config.rpm, int(config.adaptive),
        config.min_limit,
    )
    # Contract: replacing a configuration keeps the pool's slots and statistics;
    # a raised limit may admit waiters at once, so all of them re-check.
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
    gone = tx.execute(
        "DELETE FROM pools WHERE project = ? AND name = ?", (project, pool)
    ).rowcount
    if not gone:
        return False
    tx.execute("DELETE FROM slots WHERE project = ? AND pool = ?", (project, pool))
    tx.execute("DELETE FROM slot_waiters WHERE project = ? AND pool = ?", (project, pool))
    # Every waiter re-checks, finds the pool gone and answers 404.
    tx.events.append(pool_freed(project, pool, wake_all=True))
    return True


def _refusal(tx: Tx, project: str, pool: str, config: PoolConfig, used: int) -> SlotAttempt:
    deadlines = [
        row[0]
        for row in tx.execute(
            "SELECT request_deadline_ms FROM slots WHERE project = ? AND pool = ? "
            "AND lease_deadline_ms > ?",
            (project, pool, tx.now_ms),
        ).fetchall()
    ]
    return SlotAttempt(
        None, None, used, rules.effective_limit(config),
        rules.retry_after_ms(deadlines, tx.now_ms),
    )


def _admit(tx: Tx, project: str, pool: str, config: PoolConfig, used: int) -> SlotAttempt:
    slot = rules.new_slot(new_slot_id(), pool, config, tx.now_ms)
    tx.execute(
        f"INSERT INTO slots (project, {_SLOT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
        (project, slot.slot_id, pool, slot.acquired_ms, slot.lease_deadline_ms,
         slot.request_deadline_ms),
    )
    return SlotAttempt(slot, None, used + 1, rules.effective_limit(config))


def acquire(tx: Tx, project: str, pool: str, wait_alive_ms: int | None) -> SlotAttempt:
    # Contract: counting live slots and inserting the new one happen in one
    # transaction, so no more than `limit` slots are ever live (SPEC §7.5).
    config = load_config(tx, project, pool)
    used = in_use(tx, project, pool)
    queued = waiters(tx, project, pool)
    if rules.may_admit(config, used, queued):
        return _admit(tx, project, pool, config, used)
    refusal = _refusal(tx, project, pool, config, used)
    if wait_alive_ms is None or queued >= config.queue_size:
        return refusal
    ticket = _join_line(tx, project, pool, wait_alive_ms)
    return SlotAttempt(None, ticket, used, refusal.effective_limit, refusal.retry_after_ms)


def _join_line(tx: Tx, project: str, pool: str, alive_ms: int) -> int:
    row = tx.execute(
        "INSERT INTO slot_waiters (project, pool, alive_until_ms) VALUES (?, ?, ?) "
        "RETURNING ticket",
        (project, pool, tx.now_ms + alive_ms),
    ).fetchone()
    return int(row[0])


def retry_waiter(tx: Tx, project: str, pool: str, ticket: int, alive_ms: int) -> SlotAttempt:
    config = load_config(tx, project, pool)  # NotFound once the pool is deleted
    refreshed = tx.execute(
        "UPDATE slot_waiters SET alive_until_ms = ? WHERE ticket = ?",
        (tx.now_ms + alive_ms, ticket),
    ).rowcount
    if not refreshed:  # dropped as dead (e.g. a stalled loop): rejoin at the back
        ticket = _join_line(tx, project, pool, alive_ms)
    used = in_use(tx, project, pool)
    if rules.may_admit(config, used, waiters(tx, project, pool, before_ticket=ticket)):
        tx.execute("DELETE FROM slot_waiters WHERE ticket = ?", (ticket,))
        admitted = _admit(tx, project, pool, config, used)
        if admitted.in_use < admitted.effective_limit:
            tx.events.append(pool_freed(project, pool))  # room for the next in line too
        return admitted
    refusal = _refusal(tx, project, pool, config, used)
    return SlotAttempt(None, ticket, used, refusal.effective_limit, refusal.retry_after_ms)


def leave_line(tx: Tx, project: str, pool: str, ticket: int) -> None:
    if tx.execute("DELETE FROM slot_waiters WHERE ticket = ?", (ticket,)).rowcount:
        tx.events.append(pool_freed(project, pool))


def _own_slot(tx: Tx, project: str, pool: str, slot_id: str) -> Slot | None:
    """The slot if it exists and is this project's and pool's; NotFound if it is
    someone else's; None when it is gone."""
    row = tx.execute(
        f"SELECT project, {_SLOT_COLUMNS} FROM slots WHERE slot_id = ?", (slot_id,)
    ).fetchone()
    if row is None:
        return None
    if row[0] != project or row[2] != pool:
        raise NotFound("No such slot in this pool.")
    return _slot(row[1:])


def renew(tx: Tx, project: str, pool: str, slot_id: str) -> Slot:
    config = load_config(tx, project, pool)
    renewed = rules.renew(_own_slot(tx, project, pool, slot_id), config, tx.now_ms)
    tx.execute(
        "UPDATE slots SET lease_deadline_ms = ? WHERE slot_id = ?",
        (renewed.lease_deadline_ms, slot_id),
    )
    return renewed


def release(tx: Tx, project: str, pool: str, slot_id: str, report: SlotReport | None) -> bool:
    load_config(tx, project, pool)
    slot = _own_slot(tx, project, pool, slot_id)
    if slot is None:
        return False
    tx.execute("DELETE FROM slots WHERE slot_id = ?", (slot_id,))
    if not rules.is_live(slot, tx.now_ms):
        # Already past its deadline: it was not held any more, only not yet reaped.
        _count_reclaimed(tx, project, pool, 1)
        return False
    _record_release(tx, project, pool, report)
    tx.events.append(pool_freed(project, pool))
    return True


def _record_release(tx: Tx, project: str, pool: str, report: SlotReport | None) -> None:
    # Counted once per slot (a repeated release finds no slot), so statistics
    # are not inflated by retries.
    status_column = None
    if report is not None and report.status is not None:
        status_column = f"status_{rules.status_class(report.status)}"
    sets = ["released = released + 1"]
    args: list[Any] = []
    if status_column is not None:
        sets.append(f"{status_column} = {status_column} + 1")
        if report is not None and report.status == 429:
            sets.append("status_429 = status_429 + 1")
    if report is not None:
        sets.append("throttled = throttled + ?")
        args.append(report.throttled or 0)
        if report.retry_after_ms is not None:
            sets.append("last_retry_after_ms = ?")
            args.append(report.retry_after_ms)
        sets.append("last_report = ?")
        args.append(report.report_json)
        sets.append("last_reported_ms = ?")
        args.append(tx.now_ms)
    tx.execute(
        f"UPDATE pools SET {', '.join(sets)} WHERE project = ? AND name = ?",
        (*args, project, pool),
    )


def _count_reclaimed(tx: Tx, project: str, pool: str, count: int) -> None:
    tx.execute(
        "UPDATE pools SET reclaimed = reclaimed + ? WHERE project = ? AND name = ?",
        (count, project, pool),
    )


def reap(tx: Tx) -> int:
    """Reclaim slots past their lease deadline and drop dead waiters."""
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
    return len(dead)
