"""Pool and slot rules (SPEC §4), as pure functions of state and `now` (epoch ms)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fencepost.errors import Capped, NotFound

# Proxy mode (SPEC §4.7): the largest body a proxied request or answer may
# carry by default, and the most a pool may allow.
DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024
MAX_MAX_BODY_BYTES = 1024 * 1024 * 1024
DEFAULT_UPSTREAM_TIMEOUT_MS = 60_000


@dataclass(frozen=True, slots=True)
class Upstream:
    """The upstream a pool calls in proxy mode. `headers` are the managed
    credentials: write-only (SPEC §4.7), so their values stay out of `repr`
    (a log line or a traceback that prints a config shows only the names)."""

    base_url: str
    headers: tuple[tuple[str, str], ...] = ()
    timeout_ms: int = DEFAULT_UPSTREAM_TIMEOUT_MS

    @property
    def header_names(self) -> list[str]:
        return [name for name, _ in self.headers]

    def __repr__(self) -> str:
        return (f"Upstream(base_url={self.base_url!r}, headers={self.header_names!r}, "
                f"timeout_ms={self.timeout_ms})")


@dataclass(frozen=True, slots=True)
class PoolConfig:
    limit: int
    queue_size: int = 100
    queue_timeout_ms: int = 30_000
    term_ms: int = 30_000
    renew_interval_ms: int | None = None  # None: term_ms // 3
    request_timeout_ms: int = 60_000
    rpm: int | None = None
    adaptive: bool = False
    min_limit: int = 1
    upstream: Upstream | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    cost_per_minute: int | None = None  # units (tokens) per minute (SPEC §4.6)

    @property
    def suggested_renew_interval_ms(self) -> int:
        return self.renew_interval_ms if self.renew_interval_ms is not None else self.term_ms // 3


@dataclass(frozen=True, slots=True)
class Slot:
    slot_id: str
    pool: str
    acquired_ms: int
    lease_deadline_ms: int
    request_deadline_ms: int
    # The session it is attached to (SPEC §3.10): its lease deadline is kept
    # equal to the session's expiry, capped by its request deadline.
    session_id: str | None = None


def is_live(slot: Slot, now_ms: int) -> bool:
    # lease_deadline never passes request_deadline, so one comparison covers both.
    return now_ms < slot.lease_deadline_ms


def new_slot(slot_id: str, pool: str, config: PoolConfig, now_ms: int) -> Slot:
    request_deadline = now_ms + config.request_timeout_ms
    return Slot(
        slot_id=slot_id,
        pool=pool,
        acquired_ms=now_ms,
        lease_deadline_ms=min(now_ms + config.term_ms, request_deadline),
        request_deadline_ms=request_deadline,
    )


def may_admit(limit: int, in_use: int, waiters_ahead: int) -> bool:
    """A slot is given only while below the (effective) limit and to the head of the line."""
    return in_use < limit and waiters_ahead == 0


def clamp_wait_ms(config: PoolConfig, wanted_ms: int, no_queue: bool) -> int:
    """The wait an acquire may actually spend in line (0: fail fast)."""
    if no_queue or config.queue_size == 0:
        return 0
    return max(0, min(wanted_ms, config.queue_timeout_ms))


def renew(slot: Slot | None, config: PoolConfig, now_ms: int) -> Slot:
    """Extend a slot by one term, never past its request deadline. A slot
    attached to a session follows the session instead: renewing it is allowed
    and changes nothing (renew the session)."""
    if slot is None or not is_live(slot, now_ms):
        raise NotFound("No such slot: it was released or reclaimed.")
    if slot.lease_deadline_ms >= slot.request_deadline_ms:
        raise Capped()
    if slot.session_id is not None:
        return slot
    deadline = min(now_ms + config.term_ms, slot.request_deadline_ms)
    return Slot(slot.slot_id, slot.pool, slot.acquired_ms, deadline, slot.request_deadline_ms)


def retry_after_ms(
    live_request_deadlines: list[int], now_ms: int, typical_hold_ms: float | None = None
) -> int | None:
    """When to try again: the typical time a slot is held, when the pool has
    learned it from releases, else when a slot is sure to free (the earliest
    hard cap among held slots; renewals cannot pass it). None when nothing is
    held (the refusal is the queue)."""
    if not live_request_deadlines:
        return None
    certain = max(1, min(live_request_deadlines) - now_ms)
    if typical_hold_ms is None:
        return certain
    return max(1, min(certain, math.ceil(typical_hold_ms)))


def status_class(status: int) -> str:
    return f"{status // 100}xx"


# --- pacing (SPEC §4.5) --------------------------------------------------------------
# GCRA (ITU-T I.371): one theoretical arrival time per pool spaces admissions at
# the rate's interval, with PACE_BURST admissions of tolerance: no log of
# admissions to count, and an exact time until the next one conforms.

PACE_BURST = 2  # admissions a paced pool may make back to back


def pace_wait_ms(tat_ms: float, interval_ms: float | None, now_ms: int) -> int | None:
    """GCRA: ms until one more admission conforms (None: now), given the
    theoretical arrival time of the next one."""
    if interval_ms is None:
        return None
    allowed_from = tat_ms - interval_ms * (PACE_BURST - 1)
    return None if now_ms >= allowed_from else max(1, math.ceil(allowed_from - now_ms))


def paced(tat_ms: float, interval_ms: float, now_ms: int) -> float:
    """The theoretical arrival time after one more admission."""
    return max(tat_ms, float(now_ms)) + interval_ms
