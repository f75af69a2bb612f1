"""Pool and slot statements (portable SQL, `?` placeholders); each runs inside
the batch transaction of an operation that declared the pool's key (`key_of`,
see batch.py): holding it makes count-then-admit atomic, and admissions to
different pools commit concurrently.

Acquire, renew and release are step operations (batch.py). Their common case
is decided by guarded statements sent without reading the pool first: the
writer remembers each pool as it last read or wrote it (`KnownPools`), with
the pool's admission version, a random number drawn anew by every write of
the pool's configuration or governor (`_new_version`). An acquire of a pool
remembered as neither paced nor paused inserts its slot only while the row
still has that version, fewer live slots than the limit the rules computed
from the remembered state, and nobody alive in line; a renewal extends the
slot by the remembered term under the same version; a release counts itself
in an update of the pool guarded by the caller's live slot, then deletes the
slot. Otherwise the general case reads the pool and decides as before.

An acquire also clamps the wait its caller asked for (`Wanted`) by the
configuration it decided with, remembered or read, and answers with both: the
route reads nothing before it (SPEC §4.2's clamping, and the grant's term).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple

from fencepost.core import costs
from fencepost.core import governor as gov
from fencepost.core import slots as rules
from fencepost.core.costs import CostState
from fencepost.core.governor import GovernorState, Hint, Outcome
from fencepost.core.sessions import attached_expiry_ms
from fencepost.core.slots import PoolConfig, Slot, Upstream
from fencepost.errors import Capped, NotFound
from fencepost.events import Ended, Granted, PoolChanged
from fencepost.store.base import PoolStats, PoolView, SlotAttempt, SlotReport, pool_freed
from fencepost.store.batch import (
    UNDECIDED,
    Cursor,
    Key,
    Keys,
    Refused,
    Step,
    Tx,
    Undecided,
    refused_before_writing,
)
from fencepost.store.sql.bounded import delete_oldest_claimed
from fencepost.store.sql.known_leases import Known
from fencepost.store.sql.replicas import Place
from fencepost.store.sql.rows import columns, width
from fencepost.store.together import Together, unnest

KIND = "pool"


def key_of(project: str, pool: str) -> Keys:
    """The keys an operation on one pool (or its slots) touches."""
    return (Key(KIND, project, pool),)


class _ConfigRow(NamedTuple):
    """A pool's configuration columns (see rows.py)."""

    slot_limit: int
    queue_size: int
    queue_timeout_ms: int
    term_ms: int
    renew_interval_ms: int | None
    request_timeout_ms: int
    rpm: int | None
    adaptive: int
    min_limit: int
    upstream_json: str | None  # proxy mode (SPEC §4.7); see upstream_json()
    max_body_bytes: int
    cost_per_minute: int | None  # a unit budget (SPEC §4.6)


class _GovernorRow(NamedTuple):
    """What a pool's governor learned (GovernorState, as stored)."""

    gov_limit: float | None
    gov_plateau: float | None
    gov_last_decrease_ms: int
    gov_hold_ms: float | None
    paused_until_ms: int
    learned_rpm: int | None
    window_reset_ms: int | None
    gov_window_ms: int | None
    paused_since_ms: int
    probe_gap_ms: int
    next_probe_ms: int
    gov_ok_hold_ms: float | None
    gov_base_hold_ms: float | None
    last_success_ms: int
    hinted_streak: int
    hint_source: str | None
    hint_retry_after_ms: int | None
    hint_at_ms: int | None
    probe_since_ms: int
    gov_probe_hold_ms: float | None
    latency_bound: int
    last_throttle_ms: int
    pause_reporter: str | None
    pause_claim_ms: int
    gov_slow_start: int


class _StatsRow(NamedTuple):
    """A pool's statistics columns."""

    released: int
    reclaimed: int
    status_1xx: int
    status_2xx: int
    status_3xx: int
    status_4xx: int
    status_5xx: int
    status_429: int
    throttled: int
    last_retry_after_ms: int | None
    last_reported_ms: int | None


class _SlotRow(NamedTuple):
    """A `slots` row's columns (those of Slot)."""

    slot_id: str
    pool: str
    acquired_ms: int
    lease_deadline_ms: int
    request_deadline_ms: int
    session_id: str | None  # attached to this session (SPEC §3.10)


_CONFIG_COLUMNS = columns(_ConfigRow)
# A pool row as read: its configuration, its governor, then its pacing clock
# (GCRA: when the next paced admission is due), its admission version and its
# unit budget's state (core/costs.py); counts may follow.
_POOL_COLUMNS = (f"{_CONFIG_COLUMNS}, {columns(_GovernorRow)}, pace_tat_ms, admission_version, "
                 "cost_tat_ms, avg_cost, learned_cost_per_minute")
_AFTER_CONFIG = width(_ConfigRow)
_AFTER_GOVERNOR = _AFTER_CONFIG + width(_GovernorRow)
_AFTER_POOL = _AFTER_GOVERNOR + 5
_STATS_COLUMNS = columns(_StatsRow)
_SLOT_COLUMNS = columns(_SlotRow)
_AFTER_SLOT = width(_SlotRow)


@dataclass(frozen=True, slots=True)
class _Pool:
    """A pool's configuration and what it has learned, read together."""

    config: PoolConfig
    governor: GovernorState
    pace_tat_ms: float = 0.0  # GCRA: when the next paced admission is due
    # Names the configuration and governor above (not the pacing clock, which
    # only a paced pool reads); see the module docstring.
    version: int = 0
    costs: CostState = CostState()  # the unit budget's clock and average (SPEC §4.6)

    @property
    def learns_rate(self) -> bool:
        # Pools that opted in (adaptive, or given a rate) learn from reports.
        return self.config.adaptive or self.config.rpm is not None

    def limit_at(self, now_ms: int) -> int:
        """The slots admitted at once now (a stale adaptive pool starts again low)."""
        c = self.config
        return gov.effective_limit(self.governor, c.limit, c.min_limit, c.adaptive, now_ms)

    @property
    def rpm(self) -> int | None:
        return gov.effective_rpm(self.config.rpm, self.governor) if self.learns_rate else None

    @property
    def pace_interval_ms(self) -> float | None:
        if not self.learns_rate:
            return None
        return gov.pace_interval_ms(self.config.rpm, self.governor)

    @property
    def cost_budget(self) -> float | None:
        """Units per minute to pace by: the configured budget, or one learned
        from the upstream's headers (by a pool that learns, as rates are)."""
        learned = self.costs if self.learns_rate else CostState()
        return costs.per_minute(self.config.cost_per_minute, learned)

    def paused(self, now_ms: int) -> bool:
        # A pause learned while the pool was adaptive or rated ends with that.
        return self.learns_rate and gov.pause_remaining_ms(self.governor, now_ms) is not None

    def admits_by_count(self, now_ms: int) -> bool:
        """Whether only the live slots and the line decide an admission now:
        no pacing to keep, no pause (nor its probes)."""
        return (self.pace_interval_ms is None and self.cost_budget is None
                and not self.paused(now_ms))


# Each pool as this process last read or wrote it (see the module docstring).
KnownPools = Known[tuple[str, str], _Pool]


def _new_version() -> int:
    # 62 random bits: a version never comes back, even from a rolled-back batch.
    return secrets.randbits(62)


def _remember(known: KnownPools | None, project: str, pool: str, state: _Pool) -> None:
    if known is not None:
        known.put((project, pool), state)


def new_slot_id() -> str:
    # 192 random bits: a slot ID is a bearer capability within its project.
    return "slot_" + secrets.token_urlsafe(24)


def _config(r: _ConfigRow) -> PoolConfig:
    return PoolConfig(
        limit=r.slot_limit, queue_size=r.queue_size, queue_timeout_ms=r.queue_timeout_ms,
        term_ms=r.term_ms, renew_interval_ms=r.renew_interval_ms,
        request_timeout_ms=r.request_timeout_ms, rpm=r.rpm, adaptive=bool(r.adaptive),
        min_limit=r.min_limit, upstream=upstream_of(r.upstream_json),
        max_body_bytes=r.max_body_bytes, cost_per_minute=r.cost_per_minute,
    )


def upstream_json(upstream: Upstream | None) -> str | None:
    """An upstream as stored: JSON with its headers as pairs (order and case kept)."""
    if upstream is None:
        return None
    return json.dumps({
        "base_url": upstream.base_url,
        "headers": [list(pair) for pair in upstream.headers],
        "timeout_ms": upstream.timeout_ms,
    })


def upstream_of(text: str | None) -> Upstream | None:
    if text is None:
        return None
    data = json.loads(text)
    return Upstream(
        base_url=data["base_url"],
        headers=tuple((str(name), str(value)) for name, value in data["headers"]),
        timeout_ms=int(data["timeout_ms"]),
    )


def _governor(r: _GovernorRow, config: PoolConfig) -> GovernorState:
    hint = None
    if r.hint_source is not None:
        # A hint's three columns are written together (see _governor_values).
        assert r.hint_retry_after_ms is not None and r.hint_at_ms is not None
        hint = Hint(
            source=r.hint_source, retry_after_ms=int(r.hint_retry_after_ms),
            at_ms=int(r.hint_at_ms),
        )
    if r.gov_limit is None and config.adaptive:
        # Nothing learned yet: slow start (SPEC §4.5), until the first save
        # keeps what it becomes.
        return gov.starting(config.limit, config.min_limit)
    return GovernorState(
        limit=float(r.gov_limit) if r.gov_limit is not None else float(config.limit),
        plateau=r.gov_plateau,
        last_decrease_ms=r.gov_last_decrease_ms,
        hold_ms=r.gov_hold_ms,
        paused_until_ms=r.paused_until_ms,
        learned_rpm=r.learned_rpm,
        window_reset_ms=r.window_reset_ms,
        window_ms=r.gov_window_ms,
        paused_since_ms=r.paused_since_ms,
        probe_gap_ms=r.probe_gap_ms,
        next_probe_ms=r.next_probe_ms,
        ok_hold_ms=r.gov_ok_hold_ms,
        base_hold_ms=r.gov_base_hold_ms,
        last_success_ms=r.last_success_ms,
        hinted_streak=r.hinted_streak,
        last_hint=hint,
        probe_since_ms=r.probe_since_ms,
        probe_hold_ms=r.gov_probe_hold_ms,
        latency_bound=bool(r.latency_bound),
        last_throttle_ms=r.last_throttle_ms,
        pause_reporter=r.pause_reporter,
        pause_claim_ms=r.pause_claim_ms,
        slow_start=bool(r.gov_slow_start),
    )


def _governor_values(g: GovernorState) -> tuple[Any, ...]:
    """`g` as stored, in _GovernorRow's order."""
    hint = g.last_hint
    return (
        g.limit, g.plateau, g.last_decrease_ms, g.hold_ms, g.paused_until_ms, g.learned_rpm,
        g.window_reset_ms, g.window_ms, g.paused_since_ms, g.probe_gap_ms, g.next_probe_ms,
        g.ok_hold_ms, g.base_hold_ms, g.last_success_ms, g.hinted_streak,
        hint and hint.source, hint and hint.retry_after_ms, hint and hint.at_ms,
        g.probe_since_ms, g.probe_hold_ms, int(g.latency_bound), g.last_throttle_ms,
        g.pause_reporter, g.pause_claim_ms, int(g.slow_start),
    )


_SAVE_GOVERNOR = (
    f"UPDATE pools SET {', '.join(f + ' = ?' for f in _GovernorRow._fields)}, "
    "admission_version = ? WHERE project = ? AND name = ?"
)


def _save_governor(
    tx: Tx, known: KnownPools, project: str, pool: str, state: _Pool, g: GovernorState
) -> None:
    """Save what the governor of `state` (the pool as it stands) learned."""
    version = _new_version()
    tx.execute(_SAVE_GOVERNOR, (*_governor_values(g), version, project, pool))
    known.put((project, pool), replace(state, governor=g, version=version))


def _stats(r: _StatsRow) -> PoolStats:
    return PoolStats(
        released=r.released,
        reclaimed=r.reclaimed,
        statuses={
            "1xx": r.status_1xx, "2xx": r.status_2xx, "3xx": r.status_3xx,
            "4xx": r.status_4xx, "5xx": r.status_5xx,
        },
        status_429=r.status_429,
        throttled=r.throttled,
        last_retry_after_ms=r.last_retry_after_ms,
        last_reported_ms=r.last_reported_ms,
    )


def _slot(row: Any) -> Slot:
    """The slot of a row that starts with the slot columns."""
    r = _SlotRow._make(row[:_AFTER_SLOT])
    return Slot(r.slot_id, r.pool, r.acquired_ms, r.lease_deadline_ms, r.request_deadline_ms,
                r.session_id)


def _pool(row: Any, pool: str) -> _Pool:
    """The pool of a row that starts with _POOL_COLUMNS; NotFound without a row."""
    if row is None:
        raise NotFound(f"No pool named {pool!r}.")
    config = _config(_ConfigRow._make(row[:_AFTER_CONFIG]))
    governor = _governor(_GovernorRow._make(row[_AFTER_CONFIG:_AFTER_GOVERNOR]), config)
    pace_tat_ms, version, cost_tat, average, learned = row[_AFTER_GOVERNOR:_AFTER_POOL]
    cost_state = CostState(float(cost_tat), None if average is None else float(average),
                           learned)
    return _Pool(config, governor, float(pace_tat_ms), int(version), cost_state)


_LOAD_WITH_COUNTS = (
    f"SELECT {_POOL_COLUMNS}, held.live, "
    "(SELECT COUNT(*) FROM slot_waiters w WHERE w.project = ? AND w.pool = ? "
    "AND w.alive_until_ms > ? AND w.ticket < ?), held.first_cap "
    "FROM pools, (SELECT COUNT(*) AS live, MIN(s.request_deadline_ms) AS first_cap "
    "FROM slots s WHERE s.project = ? AND s.pool = ? AND s.lease_deadline_ms > ?) held "
    "WHERE project = ? AND name = ?"
)


class _Counts(NamedTuple):
    """A pool's live slots and waiters, as load_with_counts reads them."""

    used: int  # live slots
    ahead: int  # live waiters ahead of the ticket (all of them, for none)
    # The earliest hard cap (request deadline) among the live slots: a slot
    # is sure to free by then, which a refusal's Retry-After may say.
    first_cap_ms: int | None


def load_with_counts(
    tx: Tx, known: KnownPools | None, project: str, pool: str, before_ticket: int | None = None
) -> tuple[_Pool, _Counts]:
    """The pool (remembered in `known`, if given), its live slots and its live
    waiters ahead of `before_ticket` (all of them when None), in one statement."""
    return _counted(known, project, pool, _send_counts(tx, project, pool, before_ticket))


def _send_counts(tx: Tx, project: str, pool: str, before_ticket: int | None) -> Cursor:
    ahead = before_ticket if before_ticket is not None else 2**62
    return tx.execute(
        _LOAD_WITH_COUNTS,
        (project, pool, tx.now_ms, ahead, project, pool, tx.now_ms, project, pool),
    )


def _counted(
    known: KnownPools | None, project: str, pool: str, sent: Cursor
) -> tuple[_Pool, _Counts]:
    """load_with_counts' answer, from its statement's cursor."""
    row = sent.fetchone()
    state = _pool(row, pool)
    _remember(known, project, pool, state)
    used, ahead, first_cap = row[_AFTER_POOL:]
    return state, _Counts(int(used), int(ahead), None if first_cap is None else int(first_cap))


def view(tx: Tx, project: str, pool: str, known: KnownPools | None = None) -> PoolView | None:
    try:
        state, counts = load_with_counts(tx, known, project, pool)
    except NotFound:
        return None
    row = tx.execute(
        f"SELECT {_STATS_COLUMNS} FROM pools WHERE project = ? AND name = ?", (project, pool)
    ).fetchone()
    return PoolView(
        name=pool,
        config=state.config,
        in_use=counts.used,
        queued=counts.ahead,
        effective_limit=state.limit_at(tx.now_ms),
        stats=_stats(_StatsRow._make(row)),
        now_ms=tx.now_ms,
        governor=state.governor,
        effective_rpm=state.rpm,
        effective_cost_per_minute=_whole(state.cost_budget),
        remaining_cost=costs.remaining(state.costs, state.cost_budget, tx.now_ms),
        average_cost=state.costs.average,
        learned_cost_per_minute=state.costs.learned_per_minute if state.learns_rate else None,
    )


def _whole(budget: float | None) -> int | None:
    return None if budget is None else int(budget)


def put(
    tx: Tx, known: KnownPools, project: str, pool: str, config: PoolConfig
) -> tuple[PoolView, bool]:
    values = (
        config.limit, config.queue_size, config.queue_timeout_ms, config.term_ms,
        config.renew_interval_ms, config.request_timeout_ms, config.rpm, int(config.adaptive),
        config.min_limit, upstream_json(config.upstream), config.max_body_bytes,
        config.cost_per_minute,
    )
    version = _new_version()
    # Contract: replacing a configuration keeps the pool's slots, statistics and
    # learned state (clamped by the new bounds when read); a raised limit may
    # admit waiters at once, so all of them re-check.
    updated = tx.execute(
        "UPDATE pools SET slot_limit = ?, queue_size = ?, queue_timeout_ms = ?, term_ms = ?, "
        "renew_interval_ms = ?, request_timeout_ms = ?, rpm = ?, adaptive = ?, min_limit = ?, "
        "upstream_json = ?, max_body_bytes = ?, cost_per_minute = ?, updated_ms = ?, "
        "admission_version = ? "
        "WHERE project = ? AND name = ?",
        (*values, tx.now_ms, version, project, pool),
    ).rowcount
    if not updated:
        tx.execute(
            f"INSERT INTO pools (project, name, {_CONFIG_COLUMNS}, created_ms, updated_ms, "
            "admission_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (project, pool, *values, tx.now_ms, tx.now_ms, version),
        )
    tx.events.append(pool_freed(project, pool, wake_all=True))
    tx.events.append(PoolChanged("changed" if updated else "created", project, pool, tx.origin))
    result = view(tx, project, pool, known)
    assert result is not None
    return result, not updated


def list_views(tx: Tx, project: str, prefix: str, after: str | None, limit: int) -> list[PoolView]:
    rows = tx.execute(
        "SELECT name FROM pools WHERE project = ? AND name >= ? AND name < ? AND name > ? "
        "ORDER BY name LIMIT ?",
        (project, prefix, prefix + "\U0010ffff", after or "", limit),
    ).fetchall()
    return [v for (name,) in rows if (v := view(tx, project, name)) is not None]


def delete(tx: Tx, known: KnownPools, project: str, pool: str) -> bool:
    gone = tx.execute("DELETE FROM pools WHERE project = ? AND name = ?", (project, pool)).rowcount
    if not gone:
        return False
    known.forget((project, pool))  # only memory: a pool made again has a new version
    tx.execute("DELETE FROM slots WHERE project = ? AND pool = ?", (project, pool))
    tx.execute("DELETE FROM slot_waiters WHERE project = ? AND pool = ?", (project, pool))
    # Every waiter re-checks, finds the pool gone and answers 404.
    tx.events.append(pool_freed(project, pool, wake_all=True))
    tx.events.append(PoolChanged("deleted", project, pool, tx.origin))
    return True


# --- admission ---------------------------------------------------------------


def _admit(
    tx: Tx, known: KnownPools, project: str, pool: str, state: _Pool, used: int,
    cost: int | None,
) -> SlotAttempt:
    now = tx.now_ms
    slot = rules.new_slot(new_slot_id(), pool, state.config, now)
    charged = costs.charge(cost, state.costs)
    tx.execute(
        f"INSERT INTO slots (project, {_SLOT_COLUMNS}, cost) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (project, slot.slot_id, pool, slot.acquired_ms, slot.lease_deadline_ms,
         slot.request_deadline_ms, slot.session_id, charged),
    )
    interval = state.pace_interval_ms
    if interval is not None:
        tx.execute(
            "UPDATE pools SET pace_tat_ms = ? WHERE project = ? AND name = ?",
            (rules.paced(state.pace_tat_ms, interval, now), project, pool),
        )
    budget = state.cost_budget
    spent = costs.admitted(state.costs, charged, cost is not None, budget, now)
    if spent != state.costs:
        tx.execute(
            "UPDATE pools SET cost_tat_ms = ?, avg_cost = ? WHERE project = ? AND name = ?",
            (spent.tat_ms, spent.average, project, pool),
        )
        _remember(known, project, pool, replace(state, costs=spent))
    tx.events.append(Granted("slot", project, pool, None, tx.origin))
    if state.learns_rate and gov.probe_wait_ms(state.governor, now) is not None:
        # Admitted during a pause: this call is a probe; space out the next one.
        _save_governor(tx, known, project, pool, replace(state, costs=spent),
                       gov.after_probe(state.governor, now))
    return SlotAttempt(slot, None, used + 1, state.limit_at(now), state.config,
                       remaining_cost=costs.remaining(spent, budget, now))


def _try_admit(
    tx: Tx, known: KnownPools, project: str, pool: str, state: _Pool, counts: _Counts,
    cost: int | None = None,
) -> SlotAttempt:
    """Admit, or a refusal saying when to try again (from what was read with
    the counts: a refusal reads nothing more)."""
    now = tx.now_ms
    used, waiters_ahead = counts.used, counts.ahead
    g = state.governor
    paused = state.paused(now)
    paused_until = g.paused_until_ms if paused else None
    interval = state.pace_interval_ms
    probe_ms = gov.probe_wait_ms(g, now) if paused else None
    budget = state.cost_budget
    waits = (probe_ms, rules.pace_wait_ms(state.pace_tat_ms, interval, now),
             costs.wait_ms(state.costs, budget, now))
    blocked_ms = max((w for w in waits if w), default=None)
    limit = state.limit_at(now)
    if blocked_ms is None and rules.may_admit(limit, used, waiters_ahead):
        return _admit(tx, known, project, pool, state, used, cost)
    if blocked_ms is None:
        caps = [] if counts.first_cap_ms is None else [counts.first_cap_ms]
        blocked_ms = rules.retry_after_ms(caps, now, g.hold_ms)
    elif waiters_ahead and (interval is not None or budget is not None):
        # Each waiter ahead takes one paced turn (and its share of the unit
        # budget) first: re-checking all at the next turn would be a stampede
        # of which only the head can win.
        turn = max(interval or 0.0, costs.charge(None, state.costs) * (
            costs.unit_ms(budget) if budget is not None else 0.0))
        blocked_ms += int(waiters_ahead * turn)
    left = None if paused_until is None else max(1, paused_until - now)
    return SlotAttempt(
        None, None, used, limit, state.config, blocked_ms, paused_until, left)


class Wanted(NamedTuple):
    """The wait an acquire asked for (SPEC §4.2), before the pool clamps it,
    and the cost it declared (SPEC §4.6)."""

    wait_ms: int
    no_queue: bool  # X-No-Queue: fail fast whatever the wait
    cost: int | None = None

    def clamped(self, config: PoolConfig) -> int:
        return rules.clamp_wait_ms(config, self.wait_ms, self.no_queue)


def require(tx: Tx, project: str, pool: str) -> None:
    """NotFound unless the pool exists."""
    if tx.execute(
        "SELECT 1 FROM pools WHERE project = ? AND name = ?", (project, pool)
    ).fetchone() is None:
        raise NotFound(f"No pool named {pool!r}.")


def acquire(
    tx: Tx, known: KnownPools, project: str, pool: str, wanted: Wanted, place: Place | None
) -> SlotAttempt | Refused:
    """The general case of an acquire: read the pool and its counts, then admit,
    refuse, or (with a place, and a wait the pool's configuration allows) join
    the line. An unknown pool is Refused (NotFound)."""
    # Contract: counting live slots and inserting the new one happen in one
    # transaction, so no more than `limit` slots are ever live (SPEC §7.5).
    # The pool is this operation's first read, and its callers wrote nothing
    # before (the common case's guarded insert inserted nothing).
    placed: Cursor | None = None
    if place is not None and wanted.wait_ms > 0 and not wanted.no_queue:
        # A caller that may wait is mostly refused here (a pool with room and
        # an empty line admitted it in the common case): its place in line
        # goes out with the reads (one round trip on PostgreSQL, not two).
        # The reads come first, so they do not count it.
        with tx.sending():
            read = _send_counts(tx, project, pool, None)
            placed = _send_join(tx, project, pool, place)
        loaded = refused_before_writing(lambda: _counted(known, project, pool, read), NotFound)
    else:
        loaded = refused_before_writing(
            lambda: load_with_counts(tx, known, project, pool), NotFound)
    if isinstance(loaded, Refused):
        return loaded  # no pool: the guarded join inserted nothing either
    state, counts = loaded
    wait_ms = wanted.clamped(state.config)
    attempt = replace(_try_admit(tx, known, project, pool, state, counts, wanted.cost),
                      wait_ms=wait_ms)
    ticket = None if placed is None else _ticket_of(placed)
    waits = attempt.slot is None and ticket is not None and wait_ms > 0
    if ticket is not None and not waits:
        # Admitted after all: its place was never seen outside this transaction.
        tx.execute("DELETE FROM slot_waiters WHERE ticket = ?", (ticket,))
    return replace(attempt, ticket=ticket) if waits else attempt


# A place in line for a caller that may wait, where the pool lets it wait
# (SPEC §4.2): the pool exists, takes waiters (queue_size and queue_timeout_ms
# above 0; the caller asked for a wait and no X-No-Queue) and has room in its
# queue, judged in the statement on the rows the counts read (the batch
# holds the pool's key): a refusal for a full queue or an unknown pool writes
# nothing.
_JOIN_IF_ROOM_IN_QUEUE = (
    "INSERT INTO slot_waiters (project, pool, alive_until_ms, replica) "
    "SELECT ?, ?, ?, ? FROM pools p WHERE p.project = ? AND p.name = ? "
    "AND p.queue_timeout_ms > 0 AND p.queue_size > (SELECT COUNT(*) FROM slot_waiters w "
    "WHERE w.project = ? AND w.pool = ? AND w.alive_until_ms > ?) RETURNING ticket"
)


def _send_join(tx: Tx, project: str, pool: str, place: Place) -> Cursor:
    now = tx.now_ms
    return tx.execute(_JOIN_IF_ROOM_IN_QUEUE, (
        project, pool, now + place.alive_ms, place.replica, project, pool, project, pool, now,
    ))


def _ticket_of(placed: Cursor) -> int | None:
    row = placed.fetchone()
    return None if row is None else int(row[0])


# The common case of an acquire in one statement: the slot goes in only while
# the pool is still the one remembered (its admission version), has fewer live
# slots than the limit the rules computed from it, and nobody alive in line (a
# newcomer never overtakes a waiter). The batch holds the pool's key, so the
# count and the insert are one atomic decision (SPEC §7.5).
_ADMIT_IF_ROOM = (
    f"INSERT INTO slots (project, {_SLOT_COLUMNS}, key_id) "
    "SELECT ?, ?, ?, ?, ?, ?, NULL, ? FROM pools p "
    "WHERE p.project = ? AND p.name = ? AND p.admission_version = ? "
    "AND (SELECT COUNT(*) FROM slots s WHERE s.project = ? AND s.pool = ? "
    "AND s.lease_deadline_ms > ?) < ? "
    "AND NOT EXISTS (SELECT 1 FROM slot_waiters w WHERE w.project = ? AND w.pool = ? "
    "AND w.alive_until_ms > ?)"
)
_LIVE_SLOTS = (
    "SELECT COUNT(*) FROM slots WHERE project = ? AND pool = ? AND lease_deadline_ms > ?"
)


_ADMIT_PARAMS = (
    ("project", "text"), ("slot_id", "text"), ("pool", "text"), ("acquired_ms", "bigint"),
    ("lease_deadline_ms", "bigint"), ("request_deadline_ms", "bigint"), ("key_id", "text"),
    ("version", "bigint"), ("now", "bigint"), ("lim", "bigint"),
)
# The common case of the acquires of one batch (PostgreSQL), in one statement:
# _ADMIT_IF_ROOM's test for each, where the room is counted once per pool and
# the acquires of one pool are admitted in batch order up to it (the first
# `limit - live` of them), which is what sending each in its turn decides.
# The live slots are counted at the pool's earliest clock reading in the
# batch: a slot that dies between two readings counts as live for the later
# acquire, which can only send it to the general case, never past the limit.
# Each admitted one's row gives the live slots it leaves (those before it
# and itself). Every test looks up its pool by index (OFFSET 0: not a join).
_ADMIT_IN_ORDER = Together(None, (
    f"WITH x AS (SELECT * FROM {unnest(_ADMIT_PARAMS)}), "
    "r AS (SELECT x.*, row_number() OVER (PARTITION BY x.project, x.pool ORDER BY x.n) AS place "
    "FROM x), "
    "room AS (SELECT c.project, c.pool, (SELECT COUNT(*) FROM slots s WHERE s.project = c.project "
    "AND s.pool = c.pool AND s.lease_deadline_ms > c.since OFFSET 0) AS live "
    "FROM (SELECT project, pool, MIN(now) AS since FROM x GROUP BY project, pool) c), "
    f"admitted AS (INSERT INTO slots (project, {_SLOT_COLUMNS}, key_id) "
    "SELECT r.project, r.slot_id, r.pool, r.acquired_ms, r.lease_deadline_ms, "
    "r.request_deadline_ms, NULL, r.key_id FROM r JOIN room ON room.project = r.project "
    "AND room.pool = r.pool WHERE r.place <= r.lim - room.live "
    "AND EXISTS (SELECT 1 FROM pools p WHERE p.project = r.project AND p.name = r.pool "
    "AND p.admission_version = r.version OFFSET 0) "
    "AND NOT EXISTS (SELECT 1 FROM slot_waiters w WHERE w.project = r.project "
    "AND w.pool = r.pool AND w.alive_until_ms > r.now OFFSET 0) RETURNING slot_id) "
    "SELECT r.n, room.live + r.place FROM admitted JOIN r ON r.slot_id = admitted.slot_id "
    "JOIN room ON room.project = r.project AND room.pool = r.pool"
), shares_keys=True)


def acquire_step(
    tx: Tx, known: KnownPools, project: str, pool: str, key_id: str | None, wanted: Wanted,
    otherwise: Callable[[], SlotAttempt | Refused],
) -> Step[SlotAttempt | Refused]:
    """A step operation (see batch.py): first the common case, a guarded insert
    of the slot the rules admit to the remembered pool (stamped with the
    holder's `key_id`, as slot_holders.py records it), followed by a count of
    the live slots it leaves (a read, in the same pipeline); then, if the
    slot did not go in, `otherwise` (the general case)."""
    now = tx.now_ms
    remembered = known.get((project, pool))
    sent: tuple[Cursor, Cursor | None] | None = None
    # A declared cost goes to the general case: the pool's average learns from it.
    if remembered is not None and wanted.cost is None and remembered.admits_by_count(now):
        state = remembered
        slot = rules.new_slot(new_slot_id(), pool, state.config, now)
        if tx.gathers(_ADMIT_IN_ORDER):
            sent = (tx.send(_ADMIT_IN_ORDER, (
                project, slot.slot_id, pool, slot.acquired_ms, slot.lease_deadline_ms,
                slot.request_deadline_ms, key_id, state.version, now, state.limit_at(now),
            )), None)
        else:
            sent = (
                tx.execute(_ADMIT_IF_ROOM, (
                    project, slot.slot_id, pool, slot.acquired_ms, slot.lease_deadline_ms,
                    slot.request_deadline_ms, key_id, project, pool, state.version,
                    project, pool, now, state.limit_at(now), project, pool, now,
                )),
                tx.execute(_LIVE_SLOTS, (project, pool, now)),
            )

    def answer() -> SlotAttempt | Undecided:
        if sent is None:
            return UNDECIDED
        inserted, counted = sent
        if counted is None:  # gathered: its row is the count, if it went in
            row = inserted.fetchone()
            if row is None:
                return UNDECIDED
            (in_use,) = row
        elif not inserted.rowcount:
            return UNDECIDED
        else:
            (in_use,) = counted.fetchone()
        tx.events.append(Granted("slot", project, pool, None, tx.origin))
        # The version guard proved the remembered configuration current: the
        # wait and the grant's fields come from it, as the general case's would.
        return SlotAttempt(slot, None, int(in_use), state.limit_at(now), state.config,
                           wait_ms=wanted.clamped(state.config))

    return Step(answer, otherwise)


def _join_line(tx: Tx, project: str, pool: str, place: Place) -> int:
    (ticket,) = tx.execute(
        "INSERT INTO slot_waiters (project, pool, alive_until_ms, replica) VALUES (?, ?, ?, ?) "
        "RETURNING ticket",
        (project, pool, tx.now_ms + place.alive_ms, place.replica),
    ).fetchone()
    return int(ticket)


def retry_waiter(
    tx: Tx, known: KnownPools, project: str, pool: str, ticket: int, place: Place,
    cost: int | None = None,
) -> SlotAttempt:
    # The refresh of its place and the read it is decided on go out together
    # (one round trip on PostgreSQL): the read counts the waiters ahead of the
    # ticket, which the refresh of its own place leaves as they are.
    with tx.sending():
        refresh = tx.execute(
            "UPDATE slot_waiters SET alive_until_ms = ? WHERE ticket = ?",
            (tx.now_ms + place.alive_ms, ticket),
        )
        read = _send_counts(tx, project, pool, ticket)
    # NotFound once the pool is deleted, raised (not Refused): the waiter's
    # row was written above, and only the batch's rollback undoes it. Rare: a
    # deleted pool's waiters each come back once, to this answer.
    # The attempt carries the configuration read here, the one a slot admitted
    # now is admitted under (a PUT or PATCH may have changed it since the wait
    # began): the grant reports it.
    counted = _counted(known, project, pool, read)
    if not refresh.rowcount:  # dropped as dead (e.g. a stalled loop): rejoin at the back
        ticket = _join_line(tx, project, pool, place)
        counted = load_with_counts(tx, known, project, pool, ticket)
    state, counts = counted
    attempt = _try_admit(tx, known, project, pool, state, counts, cost)
    if attempt.slot is None:
        return replace(attempt, ticket=ticket)
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
    f"SELECT {_POOL_COLUMNS}, {columns(_SlotRow, 's')}, s.project "
    "FROM pools p LEFT JOIN slots s ON s.slot_id = ? WHERE p.project = ? AND p.name = ?"
)


def _own_slot(project: str, pool: str, row: Any) -> Slot | None:
    """The slot of a row of slot columns and the slot's project, if it exists
    and is this project's and pool's; NotFound if it is someone else's; None
    when it is gone."""
    (owner,) = row[_AFTER_SLOT:]
    if owner is None:
        return None
    slot = _slot(row)
    if owner != project or slot.pool != pool:
        raise NotFound("No such slot in this pool.")
    return slot


def _load_with_slot(
    tx: Tx, known: KnownPools, project: str, pool: str, slot_id: str
) -> tuple[_Pool, Slot | None]:
    row = tx.execute(_POOL_AND_SLOT, (slot_id, project, pool)).fetchone()
    state = _pool(row, pool)  # NotFound without the pool
    _remember(known, project, pool, state)
    return state, _own_slot(project, pool, row[_AFTER_POOL:])


# The common case of a renewal in one statement: the caller's live slot, not
# attached to a session and not capped, whose request deadline is at least a
# term away (so rules.renew extends it by exactly one term), of the pool as
# remembered (the term is the remembered configuration's).
_RENEW_PARAMS = (
    ("deadline", "bigint"), ("slot_id", "text"), ("project", "text"), ("pool", "text"),
    ("now", "bigint"), ("cap", "bigint"), ("p_project", "text"), ("p_pool", "text"),
    ("version", "bigint"),
)
# The same for every renewal of a batch, whatever pools and slots they name
# (each moves its own slot's row; the pool is only read): one statement on
# PostgreSQL. A slot named twice is extended once, the other renewal going
# to the general case.
_RENEW_BY_TERM = Together((
    "UPDATE slots SET lease_deadline_ms = ? "
    "WHERE slot_id = ? AND project = ? AND pool = ? AND session_id IS NULL "
    "AND lease_deadline_ms > ? AND lease_deadline_ms < request_deadline_ms "
    "AND request_deadline_ms >= ? "
    "AND EXISTS (SELECT 1 FROM pools WHERE project = ? AND name = ? AND admission_version = ?) "
    f"RETURNING {_SLOT_COLUMNS}"
), (
    "UPDATE slots s SET lease_deadline_ms = x.deadline "
    f"FROM {unnest(_RENEW_PARAMS)} "
    "WHERE s.slot_id = x.slot_id AND s.project = x.project AND s.pool = x.pool "
    "AND s.session_id IS NULL AND s.lease_deadline_ms > x.now "
    "AND s.lease_deadline_ms < s.request_deadline_ms AND s.request_deadline_ms >= x.cap "
    "AND EXISTS (SELECT 1 FROM pools p WHERE p.project = x.p_project AND p.name = x.p_pool "
    "AND p.admission_version = x.version OFFSET 0) "
    f"RETURNING x.n, {columns(_SlotRow, 's')}"
), shares_keys=True)


def renew(
    tx: Tx, known: KnownPools, project: str, pool: str, slot_id: str
) -> Step[Slot | Refused]:
    """A step operation: first a guarded extension by the remembered pool's
    term, then, if it did not apply, the pool and the slot decide; an unknown
    pool or slot (NotFound) or a slot at its request deadline (Capped) is
    Refused."""
    remembered = known.get((project, pool))
    sent: Cursor | None = None
    if remembered is not None:
        deadline = tx.now_ms + remembered.config.term_ms
        sent = tx.send(_RENEW_BY_TERM, (
            deadline, slot_id, project, pool, tx.now_ms, deadline,
            project, pool, remembered.version,
        ))

    def answer() -> Slot | Undecided:
        row = None if sent is None else sent.fetchone()
        return UNDECIDED if row is None else _slot(row)

    def decide() -> Slot:
        state, slot = _load_with_slot(tx, known, project, pool, slot_id)
        return rules.renew(slot, state.config, tx.now_ms)

    def otherwise() -> Slot | Refused:
        # Nothing written before the pool and the slot decide: the guarded
        # extension, when sent, matched no row (else `answer` decided).
        renewed = refused_before_writing(decide, NotFound, Capped)
        if isinstance(renewed, Refused):
            return renewed
        tx.execute(
            "UPDATE slots SET lease_deadline_ms = ? WHERE slot_id = ?",
            (renewed.lease_deadline_ms, slot_id),
        )
        return renewed

    return Step(answer, otherwise)


_RELEASE_PARAMS = (("slot_id", "text"), ("project", "text"), ("pool", "text"), ("now", "bigint"))
# The releases without a report of one batch (PostgreSQL), in one statement:
# each deletes its slot, and each pool counts the live ones deleted as
# released (a dead one is counted as reclaimed by its answer), as the update
# and delete of each release in turn do. A slot named twice is deleted once.
_RELEASE_UNREPORTED = Together(None, (
    f"WITH x AS (SELECT * FROM {unnest(_RELEASE_PARAMS)}), "
    "gone AS (DELETE FROM slots s USING x WHERE s.slot_id = x.slot_id "
    "AND s.project = x.project AND s.pool = x.pool "
    f"RETURNING x.n, s.project, x.now, {columns(_SlotRow, 's')}), "
    "counted AS (UPDATE pools p SET released = p.released + c.live FROM ("
    "SELECT project, pool, COUNT(*) AS live FROM gone WHERE lease_deadline_ms > now "
    "GROUP BY project, pool) c WHERE p.project = c.project AND p.name = c.pool) "
    f"SELECT n, {_SLOT_COLUMNS} FROM gone"
), shares_keys=True)


def release(
    tx: Tx, known: KnownPools, project: str, pool: str, slot_id: str, report: SlotReport | None
) -> Step[bool | Refused]:
    """A step operation decided by its first statements in the common case: the
    release is counted (with the report's statistics) if the caller's slot is
    live, then the slot is deleted. What the governor learns from a report is
    written after (`answer`), from the pool as the count returned it; a dead
    slot deleted here is counted as reclaimed there too. Counted once per slot
    (a repeated release finds no slot), so statistics are not inflated by
    retries. A slot of another pool or project, or an unknown pool, is
    Refused (NotFound)."""
    now = tx.now_ms
    counted: Cursor | None = None
    if report is None and tx.gathers(_RELEASE_UNREPORTED):
        deleted = tx.send(_RELEASE_UNREPORTED, (slot_id, project, pool, now))
    else:
        sets, args = _release_counts(report, now)
        counted = tx.execute(
            f"UPDATE pools SET {sets} WHERE project = ? AND name = ? AND EXISTS (SELECT 1 "
            "FROM slots WHERE slot_id = ? AND project = ? AND pool = ? AND lease_deadline_ms > ?)"
            + ("" if report is None else f" RETURNING {_POOL_COLUMNS}"),
            (*args, project, pool, slot_id, project, pool, now),
        )
        # A report's slot says whose it was: the governor weighs each holder's
        # evidence on its own (one holder alone pauses a pool briefly).
        deleted = tx.execute(
            f"DELETE FROM slots WHERE slot_id = ? AND project = ? AND pool = ? "
            f"RETURNING {_SLOT_COLUMNS}{'' if report is None else ', key_id, cost'}",
            (slot_id, project, pool),
        )

    def answer() -> bool | Undecided:
        row = deleted.fetchone()
        if row is None:  # changed nothing: gone, someone else's, or no such pool
            return UNDECIDED
        slot = _slot(row)
        if not rules.is_live(slot, now):
            # Already past its deadline: it was not held any more, only not yet reaped.
            _count_reclaimed(tx, project, pool, 1)
            return False
        # The slot was live, so the count applied (unless its pool is gone: it
        # cannot be, as deleting a pool deletes its slots with it). Raised, not
        # Refused: the slot was deleted above, and only a rollback undoes it.
        if report is None:
            if counted is not None and not counted.rowcount:
                raise NotFound(f"No pool named {pool!r}.")
        else:
            assert counted is not None  # a report is never gathered
            state = _pool(counted.fetchone(), pool)
            _remember(known, project, pool, state)
            reporter, charged = row[-2:]
            state = _settle_cost(tx, known, project, pool, state, report, charged or 0)
            _learn(tx, known, project, pool, state, report, now - slot.acquired_ms, reporter)
        tx.events.append(pool_freed(project, pool))
        held_ms = now - slot.acquired_ms
        tx.events.append(Ended("slot", project, pool, "released", held_ms, tx.origin))
        return True

    def otherwise() -> bool | Refused:
        # Neither first statement wrote: the count's guard and the delete
        # look for the same slot, and the delete found none. Only reads here.
        found = refused_before_writing(
            lambda: _load_with_slot(tx, known, project, pool, slot_id), NotFound
        )
        return found if isinstance(found, Refused) else False  # else simply gone

    return Step(answer, otherwise)


def _settle_cost(
    tx: Tx, known: KnownPools, project: str, pool: str, state: _Pool, report: SlotReport,
    charged: int,
) -> _Pool:
    """What a report says of the unit budget (SPEC §4.6): the real cost of the
    call (the clock and the average settle the difference from its charge),
    and, for a pool that learns, the budget the upstream states and what is
    left of it. The pool as it stands after."""
    settled = state.costs
    if report.cost is not None:
        settled = costs.released(settled, charged, report.cost, state.cost_budget)
    rate = report.rate
    if state.learns_rate and rate is not None and (
            rate.token_limit is not None or rate.token_remaining is not None):
        settled = costs.learned(settled, rate.token_limit, rate.token_remaining,
                                state.config.cost_per_minute, tx.now_ms)
    if settled == state.costs:
        return state
    version = state.version
    if settled.learned_per_minute != state.costs.learned_per_minute:
        # The budget paced by changed: a remembered pool's fast path must not
        # admit by count alone any more (see the module docstring).
        version = _new_version()
    tx.execute(
        "UPDATE pools SET cost_tat_ms = ?, avg_cost = ?, learned_cost_per_minute = ?, "
        "admission_version = ? WHERE project = ? AND name = ?",
        (settled.tat_ms, settled.average, settled.learned_per_minute, version, project, pool),
    )
    after = replace(state, costs=settled, version=version)
    known.put((project, pool), after)
    if settled.tat_ms < state.costs.tat_ms:
        tx.events.append(pool_freed(project, pool))  # spent less than charged: room sooner
    return after


def _learn(
    tx: Tx, known: KnownPools, project: str, pool: str, state: _Pool, report: SlotReport,
    hold_ms: int, reporter: str | None,
) -> None:
    """Feed the reported outcome of `reporter`'s slot to the governor; its new
    state is shared by every server through this row."""
    outcome = Outcome(
        status=report.status,
        throttled=report.throttled or 0,
        retry_after_ms=report.retry_after_ms,
        rate=report.rate,
        hold_ms=hold_ms,
        reporter=reporter,
    )
    learned = gov.on_report(
        state.governor, outcome, tx.now_ms, configured=state.config.limit,
        min_limit=state.config.min_limit, adaptive=state.config.adaptive,
        learns_rate=state.learns_rate,
    )
    if learned == state.governor:
        return
    _save_governor(tx, known, project, pool, state, learned)
    resumed = gov.pause_remaining_ms(state.governor, tx.now_ms) is not None and (
        gov.pause_remaining_ms(learned, tx.now_ms) is None)
    if learned.limit > state.governor.limit or resumed:
        tx.events.append(pool_freed(project, pool))


def _release_counts(report: SlotReport | None, now_ms: int) -> tuple[str, list[Any]]:
    """The SET list (and its arguments) that counts one release and what its
    report says."""
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
        # The body's hint, else one that came in the reported headers.
        hint = report.retry_after_ms
        if hint is None and report.rate is not None:
            hint = report.rate.retry_after_ms
        if hint is not None:
            sets.append("last_retry_after_ms = ?")
            args.append(hint)
        sets += ["last_report = ?", "last_reported_ms = ?"]
        args += [report.report_json, now_ms]
    return ", ".join(sets), args


def _count_reclaimed(
    tx: Tx, project: str, pool: str, count: int, reason: str = "reclaimed"
) -> None:
    tx.execute(
        "UPDATE pools SET reclaimed = reclaimed + ? WHERE project = ? AND name = ?",
        (count, project, pool),
    )
    tx.events.append(Ended("slot", project, pool, reason, None, tx.origin, count))


def reap(tx: Tx, bound: int) -> tuple[int, bool]:
    """Reclaim slots past their lease deadline and drop dead waiters, at most
    `bound` of each; return how many slots were reclaimed, and whether a bound
    was reached (more may be left for the next pass)."""
    dead, more = delete_oldest_claimed(
        tx, KIND, "slots", "slot_id", "pool", "lease_deadline_ms", tx.now_ms, bound,
        "project, pool, session_id, lease_deadline_ms, request_deadline_ms",
    )
    per_pool: dict[tuple[str, str, str], int] = {}
    for project, pool, session_id, lease_deadline, request_deadline in dead:
        # An attached slot's deadline is its session's until its own cap.
        timed_out = session_id is not None and lease_deadline < request_deadline
        where = (project, pool, "session_expired" if timed_out else "reclaimed")
        per_pool[where] = per_pool.get(where, 0) + 1
    for (project, pool, reason), count in per_pool.items():
        _count_reclaimed(tx, project, pool, count, reason)
        tx.events.append(pool_freed(project, pool))
    gone, more_waiters = delete_oldest_claimed(
        tx, KIND, "slot_waiters", "ticket", "pool", "alive_until_ms", tx.now_ms, bound,
        "project, pool",
    )
    for project, pool in {(p, n) for p, n in gone}:
        tx.events.append(pool_freed(project, pool))
    return len(dead), more or more_waiters


# --- sessions (SPEC §3.10) --------------------------------------------------------


def attach(tx: Tx, attempt: SlotAttempt, session_id: str, session_expires_ms: int) -> SlotAttempt:
    """Attach the slot the attempt admitted (if any) to a session: its lease
    deadline becomes the session's expiry, never past its request deadline."""
    slot = attempt.slot
    if slot is None:
        return attempt
    deadline = attached_expiry_ms(session_expires_ms, slot.request_deadline_ms)
    tx.execute(
        "UPDATE slots SET session_id = ?, lease_deadline_ms = ? WHERE slot_id = ?",
        (session_id, deadline, slot.slot_id),
    )
    return replace(attempt, slot=replace(slot, lease_deadline_ms=deadline, session_id=session_id))


def follow_session(tx: Tx, session_id: str, expires_ms: int) -> None:
    """Keep every live attached slot's lease deadline equal to its session's
    expiry (capped by its request deadline), as the session is renewed."""
    tx.execute(
        "UPDATE slots SET lease_deadline_ms = "
        "CASE WHEN request_deadline_ms < ? THEN request_deadline_ms ELSE ? END "
        "WHERE session_id = ? AND lease_deadline_ms > ?",
        (expires_ms, expires_ms, session_id, tx.now_ms),
    )


def end_attached(tx: Tx, session_id: str) -> int:
    """End every slot attached to a session its holder ended; return how many
    were live. They count as released (the holder ended them) without a report."""
    gone = tx.execute(
        "DELETE FROM slots WHERE session_id = ? "
        "RETURNING project, pool, acquired_ms, lease_deadline_ms",
        (session_id,),
    ).fetchall()
    live = 0
    for project, pool, acquired_ms, lease_deadline_ms in gone:
        if lease_deadline_ms <= tx.now_ms:  # dead already, not yet reaped
            _count_reclaimed(tx, project, pool, 1)
            continue
        live += 1
        tx.execute(
            "UPDATE pools SET released = released + 1 WHERE project = ? AND name = ?",
            (project, pool),
        )
        held_ms = tx.now_ms - acquired_ms
        tx.events.append(Ended("slot", project, pool, "session_ended", held_ms, tx.origin))
        tx.events.append(pool_freed(project, pool))
    return live


def held_by_session(tx: Tx, session_id: str, limit: int) -> list[tuple[str, int]]:
    """The pools where a session holds live slots, with how many, by pool name."""
    rows = tx.execute(
        "SELECT pool, COUNT(*) FROM slots WHERE session_id = ? AND lease_deadline_ms > ? "
        "GROUP BY pool ORDER BY pool LIMIT ?",
        (session_id, tx.now_ms, limit),
    ).fetchall()
    return [(row[0], int(row[1])) for row in rows]
