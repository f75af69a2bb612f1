"""What the client returns: typed, immutable views of the server's answers.

Decoding ignores fields this client does not know, so a newer server that adds a
field does not break an older client. Times ending in `_at` are timezone-aware
UTC datetimes; fields ending in `_deadline` stay epoch milliseconds as on the wire.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

OnExpiry = Literal["release", "keep"]
LockMode = Literal["exclusive", "shared"]
Role = Literal["admin", "member", "reader"]


def epoch_ms_to_datetime(epoch_ms: int) -> datetime:
    """An epoch-milliseconds `_deadline` value as a UTC datetime."""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)


class Model(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every result type; `to_dict()` gives JSON-ready builtins."""

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready builtins, datetimes as RFC 3339 strings in the
        server's own format (UTC, milliseconds, `Z`)."""
        raw = msgspec.to_builtins(self, builtin_types=(datetime,))
        return _times_as_text(raw)  # type: ignore[no-any-return]


def format_at(moment: datetime) -> str:
    """`2026-11-29T06:43:26.123Z`, as the server writes times."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _times_as_text(value: Any) -> Any:
    if isinstance(value, datetime):
        return format_at(value)
    if isinstance(value, dict):
        return {k: _times_as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_times_as_text(v) for v in value]
    return value


class Lease(Model, frozen=True, kw_only=True):
    """A granted lock lease (SPEC §3.1). `lock_token` is the caller's proof of
    ownership: keep it to renew and release; `created` is False when the server
    answered that this token already held the lock (a retried acquire)."""

    key: str
    fencing_token: int
    acquired_at: datetime
    expires_at: datetime
    deadline_at: datetime
    operation: str | None = None
    on_expiry: OnExpiry = "release"
    lock_token: str = ""
    created: bool = True
    mode: LockMode = "exclusive"


class LeaseRenewal(Model, frozen=True, kw_only=True):
    """The answer to a renewal (SPEC §3.2): the new expiry, the unchanged token."""

    key: str
    fencing_token: int
    expires_at: datetime
    deadline_at: datetime


class LockInfo(Model, frozen=True, kw_only=True):
    """One lock as `GET /v1/locks/{key}` shows it; `held` is False (and the rest
    null) for a free lock. The lock token is never shown."""

    key: str
    held: bool
    fencing_token: int | None = None
    operation: str | None = None
    acquired_at: datetime | None = None
    expires_at: datetime | None = None
    deadline_at: datetime | None = None
    on_expiry: OnExpiry | None = None
    overdue: bool = False
    metadata: dict[str, Any] | None = None
    waiters: int = 0
    holder: KeyHolder | None = None
    line: list[Waiter] = []
    mode: LockMode | None = None
    holders: int = 0
    """How many leases are live: several for a shared lock, whose oldest holder
    the other fields show."""


class KeyHolder(Model, frozen=True, kw_only=True):
    """The API key that took a lease or slot: its id and name, never a secret.
    Both None for one taken before the server recorded keys."""

    key_id: str | None = None
    key_name: str | None = None


class Waiter(Model, frozen=True, kw_only=True):
    """One caller waiting in a lock's line (`LockInfo.line`, in arrival order)."""

    key_id: str | None = None
    key_name: str | None = None
    since_at: datetime | None = None
    gives_up_at: datetime | None = None


class LockPage(Model, frozen=True, kw_only=True):
    """One page of held locks; pass `next` as `after` for the following page."""

    locks: list[LockInfo]
    next: str | None = None


class ForceRelease(Model, frozen=True, kw_only=True):
    """The answer to a force release (SPEC §3.5). `released` is False when the lock
    was not held (still a success: no lease is live afterwards)."""

    released: bool
    key: str
    operation: str | None = None
    fencing_token: int | None = None
    age_ms: int | None = None
    expires_in_ms: int | None = None
    message: str | None = None
    released_count: int = 0
    """How many live leases ended (several for a shared lock)."""


class LockSet(Model, frozen=True, kw_only=True):
    """A lock set's grant (SPEC §3.7): one lease per key, in the order asked,
    all under one lock token. `created` is False when the token already held
    every key (a retried acquire)."""

    leases: list[Lease]
    lock_token: str = ""
    created: bool = True


class FenceCheck(Model, frozen=True, kw_only=True):
    """The answer to a fence check (SPEC §3.8). `current` is True exactly when
    `token` is the fencing token of the lock's live lease; otherwise `reason`
    says why it is stale (`expired`, `released`, `force_released`,
    `superseded`, `unknown`)."""

    key: str
    token: int
    current: bool
    live_token: int | None = None
    reason: str | None = None


class LastHint(Model, frozen=True, kw_only=True):
    """The last retry evidence a holder reported (`source`: `retry-after-ms`,
    `retry-after`, `report` or `reset`)."""

    source: str
    retry_after_ms: int
    at: datetime


class Learned(Model, frozen=True, kw_only=True):
    """What a pool learned from reported outcomes (SPEC §4.5), shared by every
    replica: its limit, its rate over the window the upstream stated, and
    whether it is paused."""

    effective_limit: int | None = None
    effective_rpm: int | None = None
    window_ms: int | None = None
    paused_until_at: datetime | None = None
    last_hint: LastHint | None = None
    # The unit budget (SPEC §4.6): the one paced by, the one the upstream's
    # headers stated, what is left of the minute's, and a call's average cost.
    effective_cost_per_minute: int | None = None
    cost_per_minute: int | None = None
    remaining_cost: int | None = None
    average_cost: float | None = None
    # An adaptive pool starting low and doubling while calls succeed (SPEC §4.5).
    slow_start: bool = False


class UpstreamInfo(Model, frozen=True, kw_only=True):
    """The upstream a pool calls in proxy mode (SPEC §4.7): the managed
    headers' names only (their values are write-only)."""

    base_url: str
    headers: list[str] = []
    timeout_ms: int | None = None


class PoolInfo(Model, frozen=True, kw_only=True):
    """A pool's configuration plus its live state (SPEC §4.1)."""

    name: str
    limit: int
    queue_size: int | None = None
    queue_timeout_ms: int | None = None
    term_ms: int | None = None
    renew_interval_ms: int | None = None
    request_timeout_ms: int | None = None
    rpm: int | None = None
    adaptive: bool = False
    min_limit: int | None = None
    upstream: UpstreamInfo | None = None
    max_body_bytes: int | None = None
    cost_per_minute: int | None = None
    in_use: int | None = None
    queued: int | None = None
    effective_limit: int | None = None
    effective_rpm: int | None = None
    learned: Learned | None = None
    stats: dict[str, Any] | None = None


class SlotHolder(Model, frozen=True, kw_only=True):
    """A live slot of a pool as readers see it (SPEC §4.1): only a prefix of its
    id (the whole id is its holder's); deadlines are epoch milliseconds."""

    slot_id_prefix: str
    key_id: str | None = None
    key_name: str | None = None
    acquired_at: datetime
    lease_deadline: int
    request_deadline: int


class SlotList(Model, frozen=True, kw_only=True):
    """`GET /v1/pools/{pool}/slots`; the client returns its `slots`."""

    slots: list[SlotHolder]


class PoolPage(Model, frozen=True, kw_only=True):
    """One page of pools; pass `next` as `after` for the following page."""

    pools: list[PoolInfo]
    next: str | None = None


class SlotGrant(Model, frozen=True, kw_only=True):
    """An admission to a pool (SPEC §4.2). Deadlines are epoch milliseconds by the
    server's clock. The last three fields come from the response headers."""

    slot_id: str
    lease_deadline: int
    request_deadline: int
    term_ms: int
    renew_interval_ms: int
    pool: str = ""
    remaining_slots: int | None = None
    effective_limit: int | None = None
    queued_ms: int | None = None
    remaining_cost: int | None = None  # units of the pool's budget left (SPEC §4.6)


class SlotRenewal(Model, frozen=True, kw_only=True):
    """The answer to a slot renewal: the new lease deadline (epoch milliseconds)."""

    lease_deadline: int


class KeyInfo(Model, frozen=True, kw_only=True):
    """An API key without its secret (SPEC §5)."""

    id: str
    role: Role
    name: str | None = None
    project: str
    expires_at: datetime | None = None
    allow_ips: list[str] = []
    rpm_quota: int | None = None
    created_at: datetime
    revoked_at: datetime | None = None
    refreshed_from: str | None = None  # the key this one was minted from
    state: str = "active"  # active, expired, retired or revoked


class CreatedKey(Model, frozen=True, kw_only=True):
    """A new API key; `key` is its secret, shown only in this answer."""

    id: str
    key: str
    role: Role
    name: str | None = None
    project: str
    expires_at: datetime | None = None
    allow_ips: list[str] = []
    rpm_quota: int | None = None
    created_at: datetime


class WhoAmI(Model, frozen=True, kw_only=True):
    """The calling key's project, ID, role and expiry (None: it never expires).
    A caller from an identity provider (`via == "jwt"`) has `key_id` `jwt:`
    + its token's sub, the token's name as `key_name`, and `app_key_id` when
    an application's key acts for it."""

    project: str
    key_id: str
    role: Role
    expires_at: datetime | None = None
    via: Literal["key", "jwt"] = "key"
    key_name: str | None = None
    app_key_id: str | None = None


class Health(Model, frozen=True, kw_only=True):
    """The server's health answer."""

    status: str
    store: str | None = None
    version: str | None = None


# --- sessions (SPEC §3.10) ---------------------------------------------------------


class SessionGrant(Model, frozen=True, kw_only=True):
    """A session as created or renewed (SPEC §3.10). `session_id` is a
    capability of the key that made it: keep it private."""

    session_id: str
    name: str | None = None
    ttl_seconds: int
    expires_at: datetime


class SessionPool(Model, frozen=True, kw_only=True):
    """A pool where a session holds slots, and how many."""

    pool: str
    slots: int


class SessionInfo(Model, frozen=True, kw_only=True):
    """A session and what it holds (`GET /v1/sessions/{id}`): `keys` lists the
    first 1000 locks, `leases` counts them all; likewise `pools` and `slots`.
    `ended` is `session_expired` or `session_ended` once it is over."""

    session_id: str
    name: str | None = None
    ttl_seconds: int
    created_at: datetime
    expires_at: datetime
    live: bool
    ended: str | None = None
    ended_at: datetime | None = None
    keys: list[str] = []
    leases: int = 0
    pools: list[SessionPool] = []
    slots: int = 0


class SessionEnd(Model, frozen=True, kw_only=True):
    """The answer to ending a session: whether this call ended it (False when it
    had already ended), and how many leases and slots ended with it."""

    ended: bool
    leases: int
    slots: int
