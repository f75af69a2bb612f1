"""Lock routes (SPEC §3): acquire (one lock, or a lock set), renew, release,
inspect, list, force release, fence check."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from fencepost.core import leases as rules
from fencepost.core.keys import Role
from fencepost.core.leases import (
    AcquireRequest,
    Busy,
    Granted,
    Lease,
    Mode,
    OnExpiry,
    SetGranted,
)
from fencepost.core.timefmt import format_at
from fencepost.errors import FencepostError, LeaseExpired, LeaseLost
from fencepost.events import Lost, current_origin
from fencepost.server import schemas
from fencepost.server.attempts import AttemptLog, get_or_wait
from fencepost.server.context import endpoint, path_name, request_id, services
from fencepost.server.fence_query import fence_token
from fencepost.server.http import json_response, required_uuid_header
from fencepost.server.listing import list_query, no_query, page
from fencepost.server.messages import Request, Response
from fencepost.server.validation import decode_body, invalid_field
from fencepost.server.waiting import WAITER_ALIVE_MS, Attempt, ClientGone
from fencepost.store.base import ForceReleaser, KeyRef, LockView


def grant_body(lease: Lease) -> schemas.LeaseGrant:
    return schemas.LeaseGrant(
        key=lease.key,
        fencing_token=lease.fencing_token,
        acquired_at=format_at(lease.acquired_ms) or "",
        expires_at=format_at(lease.expires_ms) or "",
        deadline_at=format_at(lease.deadline_ms) or "",
        operation=lease.operation,
        on_expiry=lease.on_expiry.value,
    )


def key_holder(key: KeyRef) -> schemas.KeyHolder:
    return schemas.KeyHolder(key_id=key.key_id, key_name=key.key_name)


def _line(view: LockView) -> list[schemas.LineWaiter]:
    return [
        schemas.LineWaiter(
            key_id=w.key.key_id, key_name=w.key.key_name,
            since_at=format_at(w.since_ms), gives_up_at=format_at(w.gives_up_ms),
        )
        for w in view.line
    ]


def lock_state(view: LockView) -> schemas.LockState:
    lease = view.lease
    if lease is None:
        return schemas.LockState(
            key=view.key, held=False, fencing_token=None, operation=None, acquired_at=None,
            expires_at=None, deadline_at=None, on_expiry=None, overdue=False, metadata=None,
            waiters=view.waiters, holder=None, line=_line(view), mode=None, holders=0,
        )
    return schemas.LockState(
        key=view.key,
        held=True,
        fencing_token=lease.fencing_token,
        operation=lease.operation,
        acquired_at=format_at(lease.acquired_ms),
        expires_at=format_at(lease.expires_ms),
        deadline_at=format_at(lease.deadline_ms),
        on_expiry=lease.on_expiry.value,
        overdue=rules.is_overdue(lease, view.now_ms),
        metadata=None if lease.metadata_json is None else msgspec.json.decode(lease.metadata_json),
        waiters=view.waiters,
        holder=key_holder(view.holder or KeyRef(lease.key_id, None)),
        line=_line(view),
        mode=lease.mode.value,
        holders=view.holders,
    )


def _metadata_json(metadata: dict[str, Any] | None) -> str | None:
    if metadata is None:
        return None
    encoded = msgspec.json.encode(metadata)
    if len(encoded) > schemas.MAX_METADATA_BYTES:
        limit = schemas.MAX_METADATA_BYTES
        raise invalid_field("metadata", f"must be at most {limit} bytes as JSON")
    return encoded.decode()


def _wanted(
    body: schemas.AcquireLockBody | schemas.AcquireLockSetBody, token: str, key_id: str
) -> AcquireRequest:
    return AcquireRequest(
        lock_token=token,
        ttl_seconds=body.ttl_seconds,
        operation=body.operation,
        metadata_json=_metadata_json(body.metadata),
        on_expiry=OnExpiry(body.on_expiry),
        key_id=key_id,
        wait_ms=round(body.wait_seconds * 1000),
        lock_delay_seconds=body.lock_delay_seconds,
        mode=Mode(body.mode),
    )


async def acquire(request: Request) -> Response:
    """PUT /v1/locks/{key}/lease: every attempt is written to the access log."""
    return await _serve_acquire(request, one_key=True)


async def acquire_set(request: Request) -> Response:
    """POST /v1/lock-sets (SPEC §3.7): all the keys under one lock token, or
    none. A waiting set parks on every key's line and wakes when any frees."""
    return await _serve_acquire(request, one_key=False)


async def _serve_acquire(request: Request, *, one_key: bool) -> Response:
    svc = services(request)
    log = AttemptLog(request, "lock.acquire" if one_key else "lock_set.acquire", "lock", "key")
    try:
        principal = await svc.auth.authenticate(request, Role.MEMBER)
        log.fields.update(project=principal.project, key_id=principal.key_id)
        key = path_name(request, "key") if one_key else ""
        token = required_uuid_header(request, "x-lock-token")
        required_uuid_header(request, "x-request-id")
        body: schemas.AcquireLockBody | schemas.AcquireLockSetBody
        if one_key:
            body = decode_body(request.body, schemas.AcquireLockBody)
        else:
            body = decode_body(request.body, schemas.AcquireLockSetBody)
            log.fields["lock"] = ",".join(_distinct_keys(body.keys))[:200]
        wanted = _wanted(body, token, principal.key_id)
        log.waited = body.wait_seconds > 0
        if isinstance(body, schemas.AcquireLockSetBody):
            granted = await _acquire_set(
                request, principal.project, body.keys, wanted, body.wait_seconds
            )
            leases, created = granted.leases, granted.created
        else:
            one = await _acquire(request, principal.project, key, wanted, body.wait_seconds)
            leases, created = (one.lease,), one.created
    except ClientGone as gone:
        log.failed(gone)
        return Response(status_code=499)
    except FencepostError as error:
        log.failed(error)
        raise
    status = 201 if created else 200
    tokens = [lease.fencing_token for lease in leases]
    log.write("granted" if created else "existing", status,
              fencing_token=tokens[0] if one_key else tokens, mode=wanted.mode.value)
    if one_key:
        return json_response(status, grant_body(leases[0]))
    return json_response(status, schemas.LockSetGrant(leases=[grant_body(x) for x in leases]))


async def _acquire(
    request: Request, project: str, key: str, wanted: AcquireRequest, wait_s: float
) -> Granted:
    store = services(request).store
    wait_alive_ms = WAITER_ALIVE_MS if wait_s > 0 else None
    result = await store.acquire_lock(project, key, wanted, wait_alive_ms=wait_alive_ms)
    first: Attempt[Granted] = _attempt(result.outcome, result.ticket)

    async def retry(ticket: int) -> Attempt[Granted]:
        again = await store.retry_waiter(project, key, wanted, ticket, WAITER_ALIVE_MS)
        return _attempt(again.outcome, again.ticket)

    async def leave(ticket: int) -> None:
        await store.leave_line(project, key, ticket)

    async def hand_back(granted: Granted) -> None:
        if granted.created:
            await store.release_lock(project, key, wanted.lock_token)

    return await get_or_wait(
        request, [("lock", project, key)], first, retry, leave, wait_s, _held, hand_back
    )


def _distinct_keys(keys: list[str]) -> list[str]:
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise invalid_field("keys", f"must be distinct names ({key!r} is repeated)")
        seen.add(key)
    return keys


async def _acquire_set(
    request: Request, project: str, keys: list[str], wanted: AcquireRequest, wait_s: float
) -> SetGranted:
    store = services(request).store
    wait_alive_ms = WAITER_ALIVE_MS if wait_s > 0 else None
    result = await store.acquire_lock_set(project, keys, wanted, wait_alive_ms=wait_alive_ms)
    first: Attempt[SetGranted] = _attempt(result.outcome, result.ticket)

    async def retry(ticket: int) -> Attempt[SetGranted]:
        again = await store.retry_set_waiter(project, keys, wanted, ticket, WAITER_ALIVE_MS)
        return _attempt(again.outcome, again.ticket)

    async def leave(ticket: int) -> None:
        await store.leave_line(project, keys[0], ticket)

    async def hand_back(granted: SetGranted) -> None:
        if granted.created:
            for key in keys:
                await store.release_lock(project, key, wanted.lock_token)

    lines = [("lock", project, key) for key in keys]
    return await get_or_wait(request, lines, first, retry, leave, wait_s, _held, hand_back)


acquire_set_route = endpoint(acquire_set)


G = TypeVar("G", Granted, SetGranted)


def _attempt(outcome: G | Busy, ticket: int | None) -> Attempt[G]:
    if not isinstance(outcome, Busy):
        return Attempt(outcome)
    # A lock delay ends by itself: a waiter re-checks then (a timer), besides
    # the wake-up the reaper sends when it clears the delay.
    ends_in_ms = outcome.ends_in_ms
    recheck_s = None if ends_in_ms is None else max(ends_in_ms / 1000, 0.005)
    return Attempt(None, ticket, outcome.to_error(), recheck_s)


def _held(attempt: Attempt[Any]) -> FencepostError:
    assert attempt.refusal is not None
    return attempt.refusal


acquire_route = endpoint(acquire)


@endpoint
async def renew(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.MEMBER)
    key = path_name(request, "key")
    token = required_uuid_header(request, "x-lock-token")
    required_uuid_header(request, "x-request-id")
    body = decode_body(request.body, schemas.RenewLockBody)
    try:
        lease = await svc.store.renew_lock(principal.project, key, token, body.ttl_seconds)
    except (LeaseLost, LeaseExpired) as lost:
        reason = lost.extra.get("reason")
        svc.events.emit(Lost(principal.project, key, lost.code,
                             None if reason is None else str(reason), current_origin()))
        raise
    return json_response(
        200,
        schemas.LeaseRenewal(
            key=lease.key,
            fencing_token=lease.fencing_token,
            expires_at=format_at(lease.expires_ms) or "",
            deadline_at=format_at(lease.deadline_ms) or "",
        ),
    )


@endpoint
async def release(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.MEMBER)
    key = path_name(request, "key")
    token = required_uuid_header(request, "x-lock-token")
    released = await svc.store.release_lock(principal.project, key, token)
    return json_response(200, schemas.Released(released=released))


@endpoint
async def inspect(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.READER)
    key = path_name(request, "key")
    no_query(request)
    view = await svc.store.get_lock(principal.project, key)
    return json_response(200, lock_state(view))


@endpoint
async def fence_check(request: Request) -> Response:
    """GET /v1/locks/{key}/fence?token=N: for a resource that cannot keep the
    highest token itself (SPEC §3.8); always 200 for a well-formed request."""
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.READER)
    key = path_name(request, "key")
    token = fence_token(request)
    verdict = await svc.store.fence_check(principal.project, key, token)
    return json_response(
        200,
        schemas.FenceCheck(
            key=key, token=token, current=verdict.current, live_token=verdict.live_token,
            reason=verdict.reason,  # type: ignore[arg-type]
        ),
    )


@endpoint
async def list_locks(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.READER)
    prefix, after, limit = list_query(request)
    fetched = await svc.store.list_locks(principal.project, prefix, after, limit + 1)
    views, cursor = page(fetched, limit, lambda v: v.key)
    return json_response(200, schemas.LockList(locks=[lock_state(v) for v in views], next=cursor))


@endpoint
async def force_release(request: Request) -> Response:
    """DELETE /v1/locks/{key}: always 200 for an admin or the lease's owner;
    afterwards no lease is live."""
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.MEMBER)
    key = path_name(request, "key")
    by = ForceReleaser(principal.key_id, is_admin=principal.role >= Role.ADMIN)
    result = await svc.store.force_release(principal.project, key, by)
    lease = result.lease
    svc.access_log.write(
        "lock.force_release",
        released=lease is not None,
        project=principal.project,
        key_id=principal.key_id,
        lock=key,
        request_id=request_id(request),
        fencing_token=None if lease is None else lease.fencing_token,
        operation=None if lease is None else lease.operation,
        released_count=result.released_count,
    )
    if lease is None:
        return json_response(
            200,
            schemas.NothingToRelease(
                released=False, key=key, message="The lock was not held; nothing to release.",
                released_count=0,
            ),
        )
    return json_response(
        200,
        schemas.ForceReleasedLease(
            released=True,
            key=key,
            operation=lease.operation,
            fencing_token=lease.fencing_token,
            age_ms=result.now_ms - lease.acquired_ms,
            expires_in_ms=lease.expires_ms - result.now_ms,
            released_count=result.released_count,
        ),
    )
