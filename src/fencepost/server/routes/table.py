"""Every route in one table: the app is built from it and so is the OpenAPI document,
so the two cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from fencepost.core.keys import Role
from fencepost.server import schemas
from fencepost.server.routes import keys, locks, pools, system


@dataclass(frozen=True, slots=True)
class RouteSpec:
    method: str
    path: str
    handler: Callable[..., Any]
    summary: str
    role: Role | None
    body: type | None = None
    responses: tuple[tuple[int, type | None, str], ...] = ()
    headers: tuple[tuple[str, bool, str], ...] = ()  # (name, required, description)
    query: tuple[tuple[str, str], ...] = ()  # (name, description)


LOCK_TOKEN = ("X-Lock-Token", True, "UUID chosen by the caller, kept for the lease's life.")
REQUEST_ID = ("X-Request-Id", True, "UUID correlating this request in logs.")

ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec(
        "PUT", "/v1/locks/{key}/lease", locks.acquire_route, "Acquire a lock",
        Role.MEMBER, schemas.AcquireLockBody,
        ((201, schemas.LeaseGrant, "New lease granted"),
         (200, schemas.LeaseGrant, "This token already holds the lock (retried acquire)"),
         (409, None, "lock_held")),
        (LOCK_TOKEN, REQUEST_ID),
    ),
    RouteSpec(
        "PATCH", "/v1/locks/{key}/lease", locks.renew, "Renew a lease", Role.MEMBER,
        schemas.RenewLockBody,
        ((200, schemas.LeaseRenewal, "Lease renewed"),
         (409, None, "lease_expired or lease_lost")),
        (LOCK_TOKEN, REQUEST_ID),
    ),
    RouteSpec(
        "DELETE", "/v1/locks/{key}/lease", locks.release, "Release a lease (idempotent)",
        Role.MEMBER, None, ((200, schemas.Released, "released tells whether this token held it"),),
        (LOCK_TOKEN,),
    ),
    RouteSpec(
        "GET", "/v1/locks/{key}", locks.inspect, "Inspect a lock", Role.READER, None,
        ((200, schemas.LockState, "The lock's state; the lock token is never shown"),),
    ),
    RouteSpec(
        "DELETE", "/v1/locks/{key}", locks.force_release, "Force-release a stuck lock",
        Role.ADMIN, None,
        ((200, schemas.ForceReleasedLease, "Released (or NothingToRelease when not held)"),),
    ),
    RouteSpec(
        "GET", "/v1/locks", locks.list_locks, "List held locks", Role.READER, None,
        ((200, schemas.LockList, "Held locks sorted by key"),),
        query=(("prefix", "Only keys starting with this"),
               ("limit", "Page size 1..1000 (default 100)"),
               ("after", "Cursor: the `next` of the previous page")),
    ),
    RouteSpec(
        "PUT", "/v1/pools/{pool}", pools.put_pool, "Create or replace a pool", Role.ADMIN,
        schemas.PoolConfigBody,
        ((201, schemas.PoolState, "Created"), (200, schemas.PoolState, "Updated")),
    ),
    RouteSpec(
        "PATCH", "/v1/pools/{pool}", pools.patch_pool, "Change some of a pool's configuration",
        Role.ADMIN, schemas.PoolPatchBody,
        ((200, schemas.PoolState, "Updated: only the fields given changed"),
         (404, None, "not_found"), (422, None, "validation_error")),
    ),
    RouteSpec(
        "GET", "/v1/pools/{pool}", pools.get_pool, "Inspect a pool", Role.READER, None,
        ((200, schemas.PoolState, "Configuration, live state and outcome statistics"),
         (404, None, "not_found")),
    ),
    RouteSpec(
        "DELETE", "/v1/pools/{pool}", pools.delete_pool, "Delete a pool", Role.ADMIN, None,
        ((200, schemas.Deleted, "Deleted; its slots end, its waiters get 404"),
         (404, None, "not_found")),
    ),
    RouteSpec(
        "GET", "/v1/pools", pools.list_pools, "List pools", Role.READER, None,
        ((200, schemas.PoolList, "Pools sorted by name"),),
        query=(("prefix", "Only names starting with this"),
               ("limit", "Page size 1..1000 (default 100)"),
               ("after", "Cursor: the `next` of the previous page")),
    ),
    RouteSpec(
        "POST", "/v1/pools/{pool}/lock/acquire", pools.acquire, "Acquire a slot", Role.MEMBER,
        schemas.AcquireSlotBody,
        ((200, schemas.SlotGrant, "Admitted (X-Remaining-Slots, X-Effective-Limit, X-Queued-Ms)"),
         (404, None, "not_found"), (429, None, "too_many_requests"), (504, None, "queue_timeout")),
        (("X-Queue-Timeout-Ms", False, "How long to wait in line (the body's wait_ms wins)"),
         ("X-No-Queue", False, "Fail fast even when a wait was asked for")),
    ),
    RouteSpec(
        "POST", "/v1/pools/{pool}/lock/{slot_id}/renew", pools.renew, "Renew a slot",
        Role.MEMBER, None,
        ((200, schemas.SlotRenewal, "Renewed"), (404, None, "not_found"), (409, None, "capped")),
    ),
    RouteSpec(
        "POST", "/v1/pools/{pool}/lock/{slot_id}/release", pools.release,
        "Release a slot, reporting the upstream outcome", Role.MEMBER, schemas.ReleaseSlotBody,
        ((200, schemas.Released, "released tells whether the slot was held"),
         (404, None, "not_found")),
    ),
    RouteSpec(
        "POST", "/v1/keys", keys.create_key, "Create an API key", Role.ADMIN,
        schemas.CreateKeyBody, ((201, schemas.CreatedKey, "The secret is shown only here"),),
    ),
    RouteSpec(
        "GET", "/v1/keys", keys.list_keys, "List the project's keys", Role.ADMIN, None,
        ((200, schemas.KeyList, "Keys without secrets"),),
    ),
    RouteSpec(
        "DELETE", "/v1/keys/{id}", keys.revoke_key, "Revoke a key", Role.ADMIN, None,
        ((200, schemas.Revoked, "Revoked"), (404, None, "not_found")),
    ),
    RouteSpec(
        "GET", "/v1/whoami", keys.whoami, "Who this key is", Role.READER, None,
        ((200, schemas.WhoAmI, "The key's project, ID and role"),),
    ),
    RouteSpec(
        "GET", "/healthz", system.healthz, "Health", None, None,
        ((200, schemas.Health, "The store answers"), (503, None, "The store does not answer")),
    ),
    RouteSpec(
        "GET", "/openapi.json", system.openapi, "This document", None, None,
        ((200, None, "OpenAPI 3.1 document"),),
    ),
)
