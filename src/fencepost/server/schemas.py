"""Request and response bodies (SPEC §3, §5) as msgspec Structs.

Requests forbid unknown fields so a typo (`ttl` for `ttl_seconds`) is a 422,
never silently ignored. The same types generate the OpenAPI schemas.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from fencepost.core.costs import MAX_COST
from fencepost.core.leases import (
    LOCK_DELAY_MAX_SECONDS,
    LOCK_SET_MAX_KEYS,
    TTL_MAX_SECONDS,
    TTL_MIN_SECONDS,
)
from fencepost.core.names import NAME_PATTERN
from fencepost.core.sessions import (
    SESSION_ID_PATTERN,
    SESSION_TTL_MAX_SECONDS,
    SESSION_TTL_MIN_SECONDS,
)
from fencepost.core.slots import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_UPSTREAM_TIMEOUT_MS,
    MAX_MAX_BODY_BYTES,
)

TtlSeconds = Annotated[
    int,
    Meta(ge=TTL_MIN_SECONDS, le=TTL_MAX_SECONDS, description="Lease length in seconds."),
]
WaitSeconds = Annotated[
    float, Meta(ge=0, le=300, description="How long to wait in line; 0 fails fast.")
]
Operation = Annotated[
    str, Meta(min_length=1, max_length=64, description="What the holder is doing (deploy, exec).")
]
At = Annotated[str, Meta(description="RFC 3339 UTC time with milliseconds and Z.")]
OnExpiry = Annotated[
    Literal["release", "keep"],
    Meta(description='What happens at expires_at: "release" frees the lock, "keep" holds it '
                     'overdue until released. A lease on a session ends with its session, so '
                     '"keep" cannot be combined with session_id.'),
]
MAX_METADATA_BYTES = 4096
Metadata = Annotated[
    dict[str, Any],
    Meta(description=f"Free-form holder details (host, pid, job URL); at most "
         f"{MAX_METADATA_BYTES} bytes as JSON, numbers within 64-bit range."),
]
# pools.py refuses any other slot ID as not found; tests/http/test_openapi_document.py
# checks that the two agree.
SLOT_ID_PATTERN = "^slot_[A-Za-z0-9_-]{16,64}$"
SessionId = Annotated[
    str,
    Meta(pattern=SESSION_ID_PATTERN,
         description="Attach to this session of the caller's (POST /v1/sessions): no expiry "
         "of its own, it follows the session's and ends with it."),
]
SessionTtl = Annotated[
    int,
    Meta(ge=SESSION_TTL_MIN_SECONDS, le=SESSION_TTL_MAX_SECONDS,
         description="Session length in seconds."),
]


class Request(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


LockMode = Annotated[
    Literal["exclusive", "shared"],
    Meta(description="`exclusive` excludes every other lease; any number of `shared` "
         "leases may be live together."),
]
LockDelaySeconds = Annotated[
    int,
    Meta(ge=0, le=LOCK_DELAY_MAX_SECONDS,
         description="After this lease ends by expiry or force release (not by its "
         "holder's release), nobody is granted the lock for this long."),
]
LockKey = Annotated[str, Meta(pattern=NAME_PATTERN, min_length=1, max_length=128)]


class AcquireLockBody(Request):
    # Required as SPEC §3.1 says, even with `session_id` (then checked and not
    # used: an attached lease's expiry is its session's), so that one schema
    # describes every acquire and a forgotten TTL is never silently accepted.
    ttl_seconds: TtlSeconds
    wait_seconds: WaitSeconds = 0.0
    operation: Operation | None = None
    metadata: Metadata | None = None
    on_expiry: OnExpiry = "release"
    lock_delay_seconds: LockDelaySeconds = 0
    mode: LockMode = "exclusive"
    session_id: SessionId | None = None


class AcquireLockSetBody(Request):
    keys: Annotated[
        list[LockKey],
        Meta(min_length=1, max_length=LOCK_SET_MAX_KEYS,
             description="The locks to take, all or none; distinct names.",
             extra_json_schema={"uniqueItems": True}),
    ]
    ttl_seconds: TtlSeconds
    wait_seconds: WaitSeconds = 0.0
    operation: Operation | None = None
    metadata: Metadata | None = None
    on_expiry: OnExpiry = "release"
    lock_delay_seconds: LockDelaySeconds = 0
    mode: LockMode = "exclusive"
    session_id: SessionId | None = None


class RenewLockBody(Request):
    ttl_seconds: TtlSeconds


class LeaseGrant(msgspec.Struct):
    key: str
    fencing_token: int
    acquired_at: At
    expires_at: At
    deadline_at: At
    operation: str | None
    on_expiry: Literal["release", "keep"]


class LockSetGrant(msgspec.Struct):
    leases: Annotated[
        list[LeaseGrant],
        Meta(description="One lease per key, in the order asked, all under the one lock token."),
    ]


class LeaseRenewal(msgspec.Struct):
    key: str
    fencing_token: int
    expires_at: At
    deadline_at: At


class Released(msgspec.Struct):
    released: bool


class LockState(msgspec.Struct):
    key: str
    held: bool
    fencing_token: int | None
    operation: str | None
    acquired_at: At | None
    expires_at: At | None
    deadline_at: At | None
    on_expiry: Literal["release", "keep"] | None
    overdue: bool
    metadata: dict[str, Any] | None
    waiters: int
    holder: KeyHolder | None
    line: list[LineWaiter]
    mode: Annotated[
        Literal["exclusive", "shared"] | None, Meta(description="Null when not held.")
    ]
    holders: Annotated[
        int,
        Meta(description="How many leases are live (several for a shared lock, whose "
             "oldest holder the other fields show)."),
    ]


class KeyHolder(msgspec.Struct):
    """The API key that took a lease or slot (null id and name: taken before
    keys were recorded). Never a secret or a lock token."""

    key_id: str | None
    key_name: str | None


class LineWaiter(msgspec.Struct):
    """One caller waiting in a lock's line, in arrival order."""

    key_id: str | None
    key_name: str | None
    since_at: At | None
    gives_up_at: At | None


class LockList(msgspec.Struct):
    locks: list[LockState]
    next: str | None


class ForceReleasedLease(msgspec.Struct):
    released: Literal[True]
    key: str
    operation: str | None
    fencing_token: int
    age_ms: int
    expires_in_ms: int
    released_count: Annotated[
        int,
        Meta(description="How many live leases ended (several for a shared lock, whose "
             "oldest lease the other fields describe)."),
    ]


class FenceCheck(msgspec.Struct):
    key: str
    token: int
    current: Annotated[
        bool, Meta(description="True exactly when `token` is the live lease's fencing token.")
    ]
    live_token: Annotated[
        int | None, Meta(description="The live lease's fencing token; null when none is live.")
    ]
    reason: Annotated[
        Literal["expired", "released", "force_released", "superseded", "session_expired",
                "session_ended", "unknown"] | None,
        Meta(description="Why a stale token is stale; null when current."),
    ]


class NothingToRelease(msgspec.Struct):
    released: Literal[False]
    key: str
    message: str
    released_count: Literal[0]


RoleName = Literal["admin", "member", "reader"]


class CreateKeyBody(Request):
    role: RoleName
    name: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    expires_in_seconds: Annotated[int, Meta(ge=1, le=315_360_000)] | None = None
    allow_ips: Annotated[
        list[Annotated[str, Meta(max_length=64)]],
        Meta(max_length=64, description="IPv4 or IPv6 addresses or CIDR networks."),
    ] | None = None
    rpm_quota: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None


class RefreshKeyBody(Request):
    expires_in_seconds: Annotated[
        int,
        Meta(ge=1, le=315_360_000,
             description="The successor's lifetime (default: the calling key's own); never "
             "longer than an admin granted the original key."),
    ] | None = None
    retire_previous: Annotated[
        bool,
        Meta(description="Retire the calling key once its successor is minted, in the same "
             "store operation: never a moment with both keys working, or neither."),
    ] = False


class KeyInfo(msgspec.Struct):
    id: str
    role: RoleName
    name: str | None
    project: str
    expires_at: At | None
    allow_ips: list[str]
    rpm_quota: int | None
    created_at: At
    revoked_at: At | None
    refreshed_from: Annotated[
        str | None, Meta(description="The key this one was minted from by a refresh.")
    ] = None
    state: Literal["active", "expired", "retired", "revoked"] = "active"


class CreatedKey(msgspec.Struct):
    id: str
    key: str
    role: RoleName
    name: str | None
    project: str
    expires_at: At | None
    allow_ips: list[str]
    rpm_quota: int | None
    created_at: At


class KeyList(msgspec.Struct):
    keys: list[KeyInfo]
    next: Annotated[
        str | None, Meta(description="Pass as `after` for the next page; null on the last.")
    ] = None


class Revoked(msgspec.Struct):
    revoked: bool


class Retired(msgspec.Struct):
    """`retired` is true when the key is retired (now or before); false for a
    revoked key, which stays revoked (`state`)."""

    id: str
    retired: bool
    state: Literal["active", "expired", "retired", "revoked"]


class WhoAmI(msgspec.Struct, omit_defaults=True):
    """`key_id` is the key's id, or `jwt:` + the token's `sub` for a caller
    from an identity provider (SPEC §5.1), which `via: "jwt"`, the token's
    name (`key_name`) and, when an application acts for that caller, the
    application's key (`app_key_id`) come with. An API key's caller gets the
    four fields of SPEC §5."""

    project: str
    key_id: str
    role: RoleName
    expires_at: At | None
    key_name: str | None = None
    via: Literal["key", "jwt"] = "key"
    app_key_id: str | None = None


class StoreReplication(msgspec.Struct):
    """What confirms the store's commits (PostgreSQL; SPEC §6): `none` (no
    standby), `async` (standbys that a failover may find behind) or `sync`."""

    mode: Literal["none", "async", "sync"]
    standbys: int


class StoreWentBack(msgspec.Struct):
    """The store wrote to a database behind one it wrote to before (SPEC
    §7.9): `after`, an older timeline or another cluster than `before` (each
    named system identifier:database oid:timeline), with no host ahead of it
    answering. Fencing tokens continue above `tokens_from`, above every one
    granted; changes acknowledged on `before` may be lost. Shown for an hour
    after the last time (`count`: times since the process started)."""

    before: str
    after: str
    at: str
    tokens_from: int
    count: int


class Health(msgspec.Struct, omit_defaults=True):
    # "ok", or "degraded" while the store serves but `went_back` says why.
    status: str
    store: str
    version: str
    # /readyz on PostgreSQL, as last read (at each connection and every 10 s).
    replication: StoreReplication | None = None
    went_back: StoreWentBack | None = None


class ErrorDetail(msgspec.Struct):
    field: str
    message: str


class ErrorInfo(msgspec.Struct):
    """Every error's `code` and `message`; other fields come with the codes that name them."""

    code: Annotated[str, Meta(pattern="^[a-z][a-z0-9]*(_[a-z0-9]+)*$")]
    message: Annotated[str, Meta(min_length=1)]
    details: Annotated[
        list[ErrorDetail], Meta(description="validation_error: each offending field.")
    ] | None = None
    retry_after_ms: Annotated[
        int, Meta(ge=0, description="When to retry; Retry-After carries it in whole seconds.")
    ] | None = None
    operation: Annotated[str, Meta(description="lock_held: the holder's operation.")] | None = None
    expires_in_ms: Annotated[
        int, Meta(description="lock_held, lease_expired: ms until the lease expires "
                  "(negative when a keep lease is overdue).")
    ] | None = None
    waiters: Annotated[int, Meta(ge=0, description="lock_held: callers in line.")] | None = None
    reason: Annotated[
        str, Meta(description="lease_lost: expired, released, force_released, superseded, "
                  "session_expired or session_ended; session_lost: session_expired or "
                  "session_ended; lock_held: lock_delay while the lock is in its lock delay; "
                  "unauthorized: why a JWT was refused (token_expired, wrong_audience, "
                  "unknown_key_id, bad_signature, algorithm_not_allowed...).")
    ] | None = None
    in_use: Annotated[int, Meta(ge=0, description="too_many_requests: slots held.")] | None = None
    effective_limit: Annotated[
        int, Meta(ge=0, description="too_many_requests: slots the pool admits now.")
    ] | None = None
    outcome: Annotated[
        Literal["unknown"],
        Meta(description="store_unavailable: the store stopped answering while the change "
             "was under way, so it may or may not have been made (retry it with the same "
             "lock token, or look)."),
    ] | None = None


class ErrorBody(msgspec.Struct):
    error: ErrorInfo


# --- pools (SPEC §4) --------------------------------------------------------

# Counts and durations callers report stay JSON-exact integers (below 2^53, as
# fencing tokens do), which also keeps them inside the stores' 64-bit columns.
MAX_REPORTED = 2**53 - 1
Count = Annotated[int, Meta(ge=0, le=MAX_REPORTED)]
# Upstream 429s one slot's holder saw: added up per pool, so bounded well below
# where a 64-bit total could overflow.
MAX_THROTTLED = 1_000_000


# Proxy mode (SPEC §4.7). A header name is an RFC 9110 token; a value is
# printable ASCII (no CR or LF: nothing can be smuggled into the upstream
# request's head).
ManagedHeaderName = Annotated[
    str, Meta(min_length=1, max_length=128, pattern="^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
]
ManagedHeaderValue = Annotated[str, Meta(max_length=8192, pattern="^[\t -~]*$")]
UpstreamHeaders = Annotated[
    dict[ManagedHeaderName, ManagedHeaderValue],
    Meta(max_length=50, description="Headers the pool adds to every proxied request (the "
         "managed credentials): write-only, GET shows their names only. Names are unique "
         "regardless of case, and none of the hop-by-hop or framing headers (Connection, "
         "Host, Content-Length, Transfer-Encoding, TE, Trailer, Upgrade, Keep-Alive, Expect, "
         "Proxy-*), which the proxy sets itself."),
]
BaseUrl = Annotated[
    str, Meta(min_length=8, max_length=2048, pattern="^[Hh][Tt][Tt][Pp][Ss]?://[^/?#@]+",
              description="http or https URL the proxied path is appended to; no query, "
              "fragment, credentials or dot segments; inside the server's --upstream-allow "
              "when it has one.")
]
UpstreamTimeoutMs = Annotated[
    int, Meta(ge=100, le=600_000,
              description="No answer (status and headers) within this: 504 upstream_timeout.")
]
MaxBodyBytes = Annotated[
    int, Meta(ge=0, le=MAX_MAX_BODY_BYTES,
              description="Largest proxied request or response body (413 / 502 beyond it).")
]
# Unit budgets (SPEC §4.6): what one call costs, and a pool's budget per minute.
Cost = Annotated[int, Meta(ge=0, le=MAX_COST, description="Units (such as tokens) of the "
                           "upstream's budget the call spends.")]
CostPerMinute = Annotated[int, Meta(ge=1, le=10**12, description="Units (such as tokens) the "
                                    "upstream allows per minute; admissions are paced so "
                                    "that their costs fit it.")]


class UpstreamBody(Request):
    base_url: BaseUrl
    headers: UpstreamHeaders = {}
    timeout_ms: UpstreamTimeoutMs = DEFAULT_UPSTREAM_TIMEOUT_MS


class UpstreamPatch(Request):
    """PATCH of a pool's upstream: the fields given change; `headers`, when
    given, replaces the whole set."""

    base_url: BaseUrl | msgspec.UnsetType = msgspec.UNSET
    headers: UpstreamHeaders | msgspec.UnsetType = msgspec.UNSET
    timeout_ms: UpstreamTimeoutMs | msgspec.UnsetType = msgspec.UNSET


class UpstreamState(msgspec.Struct):
    base_url: str
    headers: Annotated[list[str], Meta(description="Names of the managed headers (never "
                                                   "their values).")]
    timeout_ms: int


class PoolConfigBody(Request):
    limit: Annotated[int, Meta(ge=1, le=10_000)]
    queue_size: Annotated[int, Meta(ge=0, le=100_000)] = 100
    queue_timeout_ms: Annotated[int, Meta(ge=0, le=600_000)] = 30_000
    term_ms: Annotated[int, Meta(ge=1_000, le=600_000)] = 30_000
    renew_interval_ms: Annotated[
        int, Meta(ge=1, le=599_999, description="Must be less than term_ms; term_ms / 3 when "
                  "left out.")
    ] | None = None
    request_timeout_ms: Annotated[int, Meta(ge=1_000, le=86_400_000)] = 60_000
    rpm: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
    adaptive: bool = False
    min_limit: Annotated[
        int, Meta(ge=1, le=10_000, description="Floor of the learned limit; at most limit.")
    ] = 1
    upstream: UpstreamBody | None = None
    max_body_bytes: MaxBodyBytes = DEFAULT_MAX_BODY_BYTES
    cost_per_minute: CostPerMinute | None = None


class PoolPatchBody(Request):
    """PATCH: only the fields given change (SPEC §4.1); `null` clears `rpm` and
    `renew_interval_ms` (back to term_ms / 3)."""

    limit: Annotated[int, Meta(ge=1, le=10_000)] | msgspec.UnsetType = msgspec.UNSET
    queue_size: Annotated[int, Meta(ge=0, le=100_000)] | msgspec.UnsetType = msgspec.UNSET
    queue_timeout_ms: Annotated[int, Meta(ge=0, le=600_000)] | msgspec.UnsetType = msgspec.UNSET
    term_ms: Annotated[int, Meta(ge=1_000, le=600_000)] | msgspec.UnsetType = msgspec.UNSET
    renew_interval_ms: (
        Annotated[int, Meta(ge=1, le=599_999)] | None | msgspec.UnsetType
    ) = msgspec.UNSET
    request_timeout_ms: (
        Annotated[int, Meta(ge=1_000, le=86_400_000)] | msgspec.UnsetType
    ) = msgspec.UNSET
    rpm: Annotated[int, Meta(ge=1, le=1_000_000)] | None | msgspec.UnsetType = msgspec.UNSET
    adaptive: bool | msgspec.UnsetType = msgspec.UNSET
    min_limit: Annotated[int, Meta(ge=1, le=10_000)] | msgspec.UnsetType = msgspec.UNSET
    upstream: UpstreamPatch | None | msgspec.UnsetType = msgspec.UNSET
    max_body_bytes: MaxBodyBytes | msgspec.UnsetType = msgspec.UNSET
    cost_per_minute: CostPerMinute | None | msgspec.UnsetType = msgspec.UNSET


class PoolStatsBody(msgspec.Struct):
    released: int
    reclaimed: int
    statuses: dict[str, int]
    status_429: int
    throttled: int
    last_retry_after_ms: int | None
    last_reported_at: At | None


class LastHint(msgspec.Struct):
    """The last retry evidence a holder reported: `source` is `retry-after-ms`,
    `retry-after`, `report` (the release body's field) or `reset` (a budget
    reported empty, with its reset)."""

    source: str
    retry_after_ms: int
    at: At


class LearnedState(msgspec.Struct):
    """What an adaptive or rate-limited pool has learned from reported outcomes
    (SPEC §4.5), shared by every replica."""

    effective_limit: int
    effective_rpm: int | None
    window_ms: int | None
    paused_until_at: At | None
    last_hint: LastHint | None
    limit: float
    rpm: int | None
    window_reset_at: At | None
    round_trip_ms: float | None
    effective_cost_per_minute: Annotated[int, Meta(
        description="The unit budget admissions are paced by (SPEC §4.6): the configured "
        "cost_per_minute or the one the upstream's token headers state, whichever is lower; "
        "null without one.")] | None = None
    cost_per_minute: Annotated[int, Meta(
        description="The unit budget per minute the upstream's headers stated.")] | None = None
    remaining_cost: Annotated[int, Meta(
        description="Units of the minute's budget not yet spent.")] | None = None
    average_cost: Annotated[float, Meta(
        description="Running average of what a call costs: charged to calls that declare "
        "no cost.")] | None = None
    slow_start: Annotated[bool, Meta(
        description="An adaptive pool that knows nothing of its upstream yet (new, or its "
        "evidence stale): it started low and adds a slot per success, doubling each round "
        "trip, until the first throttle or its limit (SPEC §4.5).")] = False


class PoolState(msgspec.Struct):
    name: str
    limit: int
    queue_size: int
    queue_timeout_ms: int
    term_ms: int
    renew_interval_ms: int
    request_timeout_ms: int
    rpm: int | None
    adaptive: bool
    min_limit: int
    upstream: UpstreamState | None
    max_body_bytes: int
    cost_per_minute: int | None
    in_use: int
    queued: int
    effective_limit: int
    effective_rpm: int | None
    learned: LearnedState
    stats: PoolStatsBody


class PoolList(msgspec.Struct):
    pools: list[PoolState]
    next: str | None


class SlotHolder(msgspec.Struct):
    """A live slot as readers see it: only a prefix of its id (the whole id is
    its holder's capability)."""

    slot_id_prefix: str
    key_id: str | None
    key_name: str | None
    acquired_at: At
    lease_deadline: int
    request_deadline: int


class SlotList(msgspec.Struct):
    slots: list[SlotHolder]


class Deleted(msgspec.Struct):
    deleted: bool


class AcquireSlotBody(Request):
    # Any wait is clamped to the pool's queue_timeout_ms (SPEC §4.2): no upper bound.
    wait_ms: Annotated[int, Meta(ge=0)] | None = None
    session_id: SessionId | None = None
    cost: Cost | None = None


class SlotGrant(msgspec.Struct):
    slot_id: str
    lease_deadline: Annotated[int, Meta(description="Epoch milliseconds.")]
    request_deadline: Annotated[int, Meta(description="Epoch milliseconds.")]
    term_ms: int
    renew_interval_ms: int


class SlotRenewal(msgspec.Struct):
    lease_deadline: Annotated[int, Meta(description="Epoch milliseconds.")]


class EmptyBody(Request):
    pass


class RateState(Request):
    limit: Count | None = None
    remaining: Count | None = None
    reset_ms: Count | None = None
    token_limit: Count | None = None
    token_remaining: Count | None = None
    token_reset_ms: Count | None = None


HeaderName = Annotated[str, Meta(min_length=1, max_length=256)]
HeaderValue = Annotated[str, Meta(max_length=8192)]


class ReleaseSlotBody(Request):
    status: Annotated[int, Meta(ge=100, le=599)] | None = None
    throttled: Annotated[int, Meta(ge=0, le=MAX_THROTTLED)] | None = None
    retry_after_ms: Count | None = None
    rate: RateState | None = None
    headers: Annotated[dict[HeaderName, HeaderValue], Meta(max_length=256)] | None = None
    cost: Annotated[Cost, Meta(description="Units the call really spent: replaces the "
                               "estimate given at acquire (SPEC §4.6).")] | None = None


# --- sessions (SPEC §3.10) ---------------------------------------------------------


class CreateSessionBody(Request):
    ttl_seconds: SessionTtl
    name: Annotated[
        str, Meta(min_length=1, max_length=128, description="Shown to its holder only.")
    ] | None = None


class RenewSessionBody(Request):
    ttl_seconds: SessionTtl


class SessionGrant(msgspec.Struct):
    session_id: Annotated[str, Meta(description="The session's capability: keep it secret.")]
    name: str | None
    ttl_seconds: int
    expires_at: At


class SessionPool(msgspec.Struct):
    pool: str
    slots: int


class SessionState(msgspec.Struct):
    session_id: str
    name: str | None
    ttl_seconds: int
    created_at: At
    expires_at: At
    live: bool
    ended: Annotated[
        Literal["session_expired", "session_ended"] | None,
        Meta(description="Why it ended; null while live."),
    ]
    ended_at: At | None
    keys: Annotated[list[str], Meta(description="Keys of the locks it holds (the first 1000).")]
    leases: Annotated[int, Meta(description="How many leases it holds.")]
    pools: Annotated[
        list[SessionPool], Meta(description="Pools where it holds slots (the first 1000).")
    ]
    slots: Annotated[int, Meta(description="How many slots it holds.")]


class SessionEnded(msgspec.Struct):
    ended: Annotated[bool, Meta(description="False when it had already ended.")]
    leases: int
    slots: int
