"""Every route in one table: the app dispatches from it and the OpenAPI document is
built from it, so the two cannot drift apart. Each entry says what the route takes
(the role its key needs, path and header parameters with the constraints the app
checks, the body Struct the app decodes, query parameters the handler reads) and
what it answers (its successes and the errors it raises itself; the errors every
route of its kind can give are added by server/openapi.py). The app does the
checks before the handler runs, in this order: key and role, path parameters,
headers, body (server/app.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from fencepost.core.keys import Role
from fencepost.core.names import NAME_PATTERN
from fencepost.core.sessions import SESSION_ID_PATTERN
from fencepost.errors import (
    Capped,
    FencepostError,
    Forbidden,
    InvalidRequest,
    LeaseExpired,
    LeaseLost,
    LockHeld,
    NotFound,
    PayloadTooLarge,
    QueueTimeout,
    SessionExpired,
    SessionLost,
    ShuttingDown,
    StoreNotReplicated,
    StoreUnavailable,
    TooManyRequests,
    TooManySessions,
    Unauthorized,
    UpstreamTimeout,
    UpstreamUnavailable,
    ValidationError,
)
from fencepost.server import schemas
from fencepost.server.access_log import AcquireLogged
from fencepost.server.context import Call
from fencepost.server.listing import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT
from fencepost.server.messages import Response, StreamingResponse
from fencepost.server.params import Param
from fencepost.server.routes import docs, keys, locks, pools, proxy, sessions, system, ui

Handler = Callable[[Call[Any]], Awaitable["Response | StreamingResponse"]]


@dataclass(frozen=True, slots=True)
class RouteSpec:
    method: str
    path: str
    handler: Handler
    operation_id: str
    summary: str
    role: Role | None
    body: type | None = None
    body_optional: bool = False  # an empty body is accepted too
    # (status, body Struct or a tuple of them when either may come, description);
    # `dict` is any JSON object, `str` text of one of `text_types`
    responses: tuple[tuple[int, type | tuple[type, ...] | None, str], ...] = ()
    text_types: tuple[str, ...] = ("text/html",)  # what a `str` answer may be
    errors: tuple[type[FencepostError], ...] = ()  # raised by this route itself
    params: tuple[Param, ...] = ()  # header and query parameters
    response_headers: tuple[str, ...] = ()  # sent with the 2xx answer
    logged: AcquireLogged | None = None  # one access-log line per request, however it ends
    # Bodies pass through as they are, both ways (proxy mode): any media type,
    # never decoded by the app.
    passthrough: bool = False

    @property
    def path_params(self) -> tuple[Param, ...]:
        names = [part[1:-1] for part in self.path.split("/") if part.startswith("{")]
        return tuple(PATH_PARAMS[name] for name in names)


_NAME = {"type": "string", "pattern": NAME_PATTERN, "minLength": 1, "maxLength": 128}
# Lock keys and pool names break the rule with a 422; a slot or key ID that cannot
# be one is simply not found (404), so the server never says which IDs exist.
PATH_PARAMS = {
    "key": Param("key", "path", _NAME, "The lock's name.", True, ValidationError),
    "pool": Param("pool", "path", _NAME, "The pool's name.", True, ValidationError),
    "slot_id": Param(
        "slot_id", "path", {"type": "string", "pattern": schemas.SLOT_ID_PATTERN},
        "The slot_id from the acquire answer.", True, NotFound, "No such slot.",
    ),
    "session_id": Param(
        "session_id", "path", {"type": "string", "pattern": SESSION_ID_PATTERN},
        "The session_id from POST /v1/sessions.", True, NotFound, "No such session.",
    ),
    "id": Param(
        "id", "path", {"type": "string", "minLength": 1, "maxLength": 64},
        "The key's id (as in GET /v1/keys).", True, NotFound,
        "This project has no key with that ID.",
    ),
    # Proxy mode's path on the upstream (SPEC §4.7): any number of segments,
    # checked by the route itself (no "." or ".." segment, nothing the URL
    # cannot carry).
    "path": Param(
        "path", "path", {"type": "string", "maxLength": 8192},
        "The path the upstream gets after its base_url (slashes included).", True,
        InvalidRequest, "The proxied path is too long.",
    ),
    "asset": Param(
        "asset", "path", {"type": "string", "enum": sorted(ui.ASSETS)},
        "One of the console's static files.", True, NotFound, "No such file in the console.",
    ),
}
_UUID = {"type": "string", "format": "uuid"}
LOCK_TOKEN = Param(
    "X-Lock-Token", "header", _UUID,
    "A UUID the caller chose for this lease and keeps for its life.", True, InvalidRequest,
)
REQUEST_ID = Param(
    "X-Request-Id", "header", _UUID,
    "A UUID for this request; a retry reuses it. Echoed in the response and the access log.",
    True, InvalidRequest,
)
PROXY_QUEUE_TIMEOUT = Param(
    "X-Queue-Timeout-Ms", "header",
    {"type": "integer", "minimum": 0, "maximum": 999_999_999_999},
    "How long to wait in line for a slot, in ms; clamped to the pool's queue_timeout_ms.",
    refused_with=InvalidRequest,
    refusal="X-Queue-Timeout-Ms must be a whole number of milliseconds.",
)
PROXY_COST = Param(
    "X-Cost", "header", {"type": "integer", "minimum": 0, "maximum": 1_000_000_000},
    "Units (such as tokens) of the pool's budget the call will spend (SPEC §4.6); "
    "without it, the pool's running average.",
    refused_with=InvalidRequest, refusal="X-Cost must be a whole number of units.",
)
PROXY_NO_QUEUE = Param(
    "X-No-Queue", "header", {"type": "string"},
    "Fail fast even when a wait was asked for (unless 0, false, no or off).",
)
# The methods proxy mode passes on (SPEC §4.7); HEAD comes with GET. Others
# (CONNECT, TRACE, WebDAV's) are 405.
PROXY_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
LIST_QUERY = (
    Param("prefix", "query",
          {"type": "string", "maxLength": 128, "pattern": "^[A-Za-z0-9._:-]*$"},
          "Only names starting with this.", refused_with=ValidationError),
    Param("limit", "query",
          {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT,
           "default": DEFAULT_LIST_LIMIT},
          "Page size.", refused_with=ValidationError),
    Param("after", "query", {"type": "string", "pattern": f"^({NAME_PATTERN[1:-1]})?$"},
          "Cursor: the `next` of the previous page.", refused_with=ValidationError),
)

ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec(
        "PUT", "/v1/locks/{key}/lease", locks.acquire, "acquireLock", "Acquire a lock",
        Role.MEMBER, schemas.AcquireLockBody,
        responses=((201, schemas.LeaseGrant, "New lease granted."),
                   (200, schemas.LeaseGrant,
                    "This lock token already holds the lock (a retried acquire): "
                    "the lease is unchanged.")),
        errors=(LockHeld, NotFound, SessionLost, ShuttingDown),
        params=(LOCK_TOKEN, REQUEST_ID),
        logged=AcquireLogged("lock.acquire", "lock", "key"),
    ),
    RouteSpec(
        "POST", "/v1/lock-sets", locks.acquire_set, "acquireLockSet",
        "Acquire several locks at once, all or none", Role.MEMBER, schemas.AcquireLockSetBody,
        responses=((201, schemas.LockSetGrant, "Every key granted, under the one lock token."),
                   (200, schemas.LockSetGrant,
                    "This lock token already holds every key (a retried acquire): "
                    "the leases are unchanged.")),
        errors=(LockHeld, NotFound, SessionLost, ShuttingDown),
        params=(LOCK_TOKEN, REQUEST_ID),
        # The keys are in the body: the handler names them in the line.
        logged=AcquireLogged("lock_set.acquire", "lock", "keys"),
    ),
    RouteSpec(
        "PATCH", "/v1/locks/{key}/lease", locks.renew, "renewLease", "Renew a lease",
        Role.MEMBER, schemas.RenewLockBody,
        responses=((200, schemas.LeaseRenewal, "Lease renewed."),),
        errors=(LeaseExpired, LeaseLost),
        params=(LOCK_TOKEN, REQUEST_ID),
    ),
    RouteSpec(
        "DELETE", "/v1/locks/{key}/lease", locks.release, "releaseLease",
        "Release a lease (idempotent)", Role.MEMBER,
        responses=((200, schemas.Released, "`released` tells whether this token held it."),),
        params=(LOCK_TOKEN,),
    ),
    RouteSpec(
        "GET", "/v1/locks/{key}", locks.inspect, "getLock", "Inspect a lock", Role.READER,
        responses=((200, schemas.LockState, "The lock's state; the lock token is never shown."),),
    ),
    RouteSpec(
        "DELETE", "/v1/locks/{key}", locks.force_release, "forceReleaseLock",
        "Force-release a stuck lock (an admin: any lock; a member: a lease its own key took)",
        Role.MEMBER,
        responses=((200, (schemas.ForceReleasedLease, schemas.NothingToRelease),
                    "Released, or not held (also a success: afterwards no lease is live)."),),
    ),
    RouteSpec(
        "GET", "/v1/locks/{key}/fence", locks.fence_check, "checkFence",
        "Check a fencing token against the lock's live lease", Role.READER,
        responses=((200, schemas.FenceCheck,
                    "Whether the token is current, and why not (always 200 when well-formed)."),),
        params=(
            Param("token", "query", {"type": "integer", "minimum": 0, "maximum": 2**53 - 1},
                  "The fencing token to check (given once).", True, ValidationError),
        ),
    ),
    RouteSpec(
        "GET", "/v1/locks", locks.list_locks, "listLocks", "List held locks", Role.READER,
        responses=((200, schemas.LockList, "Held locks sorted by key."),),
        params=LIST_QUERY,
    ),
    RouteSpec(
        "PUT", "/v1/pools/{pool}", pools.put_pool, "putPool", "Create or replace a pool",
        Role.ADMIN, schemas.PoolConfigBody,
        responses=((201, schemas.PoolState, "Created."), (200, schemas.PoolState, "Replaced.")),
    ),
    RouteSpec(
        "PATCH", "/v1/pools/{pool}", pools.patch_pool, "patchPool",
        "Change some of a pool's configuration", Role.ADMIN, schemas.PoolPatchBody,
        responses=((200, schemas.PoolState, "Updated: only the fields given changed."),),
        errors=(NotFound,),
    ),
    RouteSpec(
        "GET", "/v1/pools/{pool}", pools.get_pool, "getPool", "Inspect a pool", Role.READER,
        responses=((200, schemas.PoolState,
                    "Configuration, live state and outcome statistics."),),
        errors=(NotFound,),
    ),
    RouteSpec(
        "GET", "/v1/pools/{pool}/slots", pools.list_slots, "listSlots",
        "Who holds a pool's live slots", Role.READER,
        responses=((200, schemas.SlotList,
                    "Live slots, oldest first; only a prefix of each slot id."),),
        errors=(NotFound,),
    ),
    RouteSpec(
        "DELETE", "/v1/pools/{pool}", pools.delete_pool, "deletePool", "Delete a pool",
        Role.ADMIN,
        responses=((200, schemas.Deleted, "Deleted; its slots end, its waiters get 404."),),
        errors=(NotFound,),
    ),
    RouteSpec(
        "GET", "/v1/pools", pools.list_pools, "listPools", "List pools", Role.READER,
        responses=((200, schemas.PoolList, "Pools sorted by name."),),
        params=LIST_QUERY,
    ),
    RouteSpec(
        "POST", "/v1/pools/{pool}/lock/acquire", pools.acquire, "acquireSlot",
        "Acquire a slot", Role.MEMBER, schemas.AcquireSlotBody, body_optional=True,
        responses=((200, schemas.SlotGrant, "Admitted."),),
        errors=(NotFound, SessionLost, TooManyRequests, QueueTimeout, ShuttingDown),
        params=(
            Param("X-Queue-Timeout-Ms", "header",
                  {"type": "integer", "minimum": 0, "maximum": 999_999_999_999},
                  "How long to wait in line, in ms (the body's wait_ms wins); clamped to "
                  "the pool's queue_timeout_ms.", refused_with=InvalidRequest,
                  refusal="X-Queue-Timeout-Ms must be a whole number of milliseconds."),
            PROXY_NO_QUEUE,
        ),
        response_headers=("X-Remaining-Slots", "X-Effective-Limit", "X-Queued-Ms",
                          "X-Remaining-Cost"),
        logged=AcquireLogged("pool.acquire", "pool", "pool"),
    ),
    *(RouteSpec(
        method, "/v1/pools/{pool}/proxy/{path}", proxy.forward, f"proxy{method.title()}",
        f"Call the pool's upstream ({method}) through a slot", Role.MEMBER,
        responses=((200, None, "The upstream's answer, streamed as it sent it (any status)."),),
        errors=(NotFound, TooManyRequests, QueueTimeout, ShuttingDown, UpstreamUnavailable,
                UpstreamTimeout, PayloadTooLarge, InvalidRequest),
        params=(PROXY_QUEUE_TIMEOUT, PROXY_NO_QUEUE, PROXY_COST),
        response_headers=("X-Effective-Limit", "X-Queued-Ms", "X-Remaining-Cost"),
        logged=AcquireLogged("pool.proxy", "pool", "pool"), passthrough=True,
    ) for method in PROXY_METHODS),
    RouteSpec(
        "POST", "/v1/pools/{pool}/lock/{slot_id}/renew", pools.renew, "renewSlot",
        "Renew a slot", Role.MEMBER, schemas.EmptyBody, body_optional=True,
        responses=((200, schemas.SlotRenewal, "Renewed."),),
        errors=(NotFound, Capped),
    ),
    RouteSpec(
        "POST", "/v1/pools/{pool}/lock/{slot_id}/release", pools.release, "releaseSlot",
        "Release a slot, reporting the upstream outcome", Role.MEMBER,
        schemas.ReleaseSlotBody, body_optional=True,
        responses=((200, schemas.Released,
                    "`released` tells whether the slot was held (idempotent)."),),
        errors=(NotFound,),
    ),
    RouteSpec(
        "POST", "/v1/sessions", sessions.create, "createSession",
        "Start a session: one heartbeat for many leases and slots", Role.MEMBER,
        schemas.CreateSessionBody,
        responses=((201, schemas.SessionGrant,
                    "Started; it belongs to the calling key (and keys refreshed from it)."),),
        errors=(TooManySessions,),
    ),
    RouteSpec(
        "PATCH", "/v1/sessions/{session_id}", sessions.renew, "renewSession",
        "Renew a session, and with it every lease and slot attached", Role.MEMBER,
        schemas.RenewSessionBody,
        responses=((200, schemas.SessionGrant, "Renewed: its expiry is now + ttl_seconds."),),
        errors=(NotFound, SessionExpired, SessionLost),
    ),
    RouteSpec(
        "DELETE", "/v1/sessions/{session_id}", sessions.end, "endSession",
        "End a session, and every lease and slot attached", Role.MEMBER,
        responses=((200, schemas.SessionEnded,
                    "Ended (`ended` false when it had already ended), with how many leases "
                    "and slots ended with it."),),
        errors=(NotFound,),
    ),
    RouteSpec(
        "GET", "/v1/sessions/{session_id}", sessions.inspect, "getSession",
        "Inspect a session and what it holds", Role.READER,
        responses=((200, schemas.SessionState, "The session, the locks and pools it holds."),),
        errors=(NotFound,),
    ),
    RouteSpec(
        "POST", "/v1/keys", keys.create_key, "createKey", "Create an API key", Role.ADMIN,
        schemas.CreateKeyBody,
        responses=((201, schemas.CreatedKey, "Created; the secret is shown only here."),),
    ),
    RouteSpec(
        "POST", "/v1/keys/refresh", keys.refresh_key, "refreshKey",
        "Mint a successor of the calling key (any role; the caller's key keeps working)",
        Role.READER, schemas.RefreshKeyBody, body_optional=True,
        responses=((201, schemas.CreatedKey,
                    "The successor; its secret is shown only here. Revoking the calling "
                    "key (or any key it was refreshed from) revokes it too."),),
    ),
    RouteSpec(
        "GET", "/v1/keys", keys.list_keys, "listKeys", "List the project's keys", Role.ADMIN,
        responses=((200, schemas.KeyList, "Keys without secrets."),),
    ),
    RouteSpec(
        "DELETE", "/v1/keys/{id}", keys.revoke_key, "revokeKey", "Revoke a key", Role.ADMIN,
        responses=((200, schemas.Revoked, "Revoked."),),
        errors=(NotFound,),
    ),
    RouteSpec(
        "POST", "/v1/keys/{id}/retire", keys.retire_key, "retireKey",
        "Retire a key: it stops working, the keys refreshed from it do not (an admin of "
        "the project, or the key itself)", Role.READER,
        responses=((200, schemas.Retired, "Retired (now or before), or revoked already."),),
        errors=(Forbidden, NotFound),
    ),
    RouteSpec(
        "GET", "/v1/whoami", keys.whoami, "whoAmI", "Who this key is", Role.READER,
        responses=((200, schemas.WhoAmI, "The key's project, ID, role and expiry."),),
    ),
    RouteSpec(
        "GET", "/livez", system.livez, "getLiveness",
        "Liveness: the process serves (never asks the store)", None,
        responses=((200, schemas.Health, "The process serves."),),
    ),
    RouteSpec(
        "GET", "/readyz", system.readyz, "getReadiness",
        "Readiness: the store answers and takes writes", None,
        responses=((200, schemas.Health, "Ready."),),
        errors=(StoreUnavailable, StoreNotReplicated, ShuttingDown),
    ),
    RouteSpec(
        "GET", "/healthz", system.healthz, "getHealth", "Readiness (the old name of /readyz)",
        None,
        responses=((200, schemas.Health, "Ready."),),
        errors=(StoreUnavailable, StoreNotReplicated, ShuttingDown),
    ),
    RouteSpec(
        "GET", "/metrics", system.metrics, "getMetrics",
        "Prometheus metrics (no key unless the server was given --metrics-key)", None,
        responses=((200, bytes, "The Prometheus text exposition (format 0.0.4)."),),
        errors=(Unauthorized,),
    ),
    RouteSpec(
        "GET", "/openapi.json", system.openapi, "getOpenApiDocument", "This document", None,
        responses=((200, dict, "The OpenAPI 3.1 document."),),
    ),
    RouteSpec(
        "GET", "/docs", docs.api_docs, "getApiReference", "This reference as a web page", None,
        responses=((200, str, "The API reference as one HTML page (no scripts)."),),
    ),
    RouteSpec(
        "GET", "/ui", ui.page, "getConsole", "The web console", None,
        responses=((200, str, "The console's page; it asks for an API key and calls this "
                    "API with it from the browser."),),
        response_headers=ui.SECURITY_HEADER_NAMES,
    ),
    RouteSpec(
        "GET", "/ui/{asset}", ui.asset, "getConsoleAsset", "A static file of the web console",
        None,
        responses=((200, str, "The file: the console's script or style sheet."),),
        errors=(NotFound,),
        text_types=tuple(sorted({t.split(";")[0] for t in ui.ASSETS.values()})),
        response_headers=ui.SECURITY_HEADER_NAMES,
    ),
)
