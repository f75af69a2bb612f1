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
from fencepost.server.context import Call
from fencepost.server.fence_query import fence_token
from fencepost.server.http import json_response
from fencepost.server.listing import no_query, one_page
from fencepost.server.messages import Response
from fencepost.server.validation import invalid_field
from fencepost.server.waiting import WAITER_ALIVE_MS, Outcome, Place, wait_for_grant
from fencepost.store.base import ForceReleaser, KeyRef, LockView, Store

G = TypeVar("G", Granted, SetGranted)


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


def _lease_ttl(body: schemas.AcquireLockBody | schemas.AcquireLockSetBody) -> int:
    """The lease's own TTL (with a session it is not used: the lease's expiry
    is the session's)."""
    if body.session_id is not None and body.on_expiry != OnExpiry.RELEASE.value:
        # A lease that outlives its session would defeat the session's purpose.
        raise invalid_field("on_expiry", "a lease attached to a session ends with it: "
                            "only \"release\" may be combined with session_id")
    return body.ttl_seconds


def _wanted(
    call: Call[schemas.AcquireLockBody] | Call[schemas.AcquireLockSetBody],
) -> AcquireRequest:
    body = call.body
    call.acquire_log.waited = body.wait_seconds > 0
    return AcquireRequest(
        lock_token=call.params["x-lock-token"],
        ttl_seconds=_lease_ttl(body),
        operation=body.operation,
        metadata_json=_metadata_json(body.metadata),
        on_expiry=OnExpiry(body.on_expiry),
        key_id=call.caller.key_id,
        wait_ms=round(body.wait_seconds * 1000),
        lock_delay_seconds=body.lock_delay_seconds,
        mode=Mode(body.mode),
        session_id=body.session_id,
    )


async def acquire(call: Call[schemas.AcquireLockBody]) -> Response:
    """PUT /v1/locks/{key}/lease: every request is written to the access log
    (the app writes the line of one that fails)."""
    wanted = _wanted(call)
    svc = call.services
    line = _LockLine(svc.store, call.caller.project, call.params["key"], wanted)
    granted = await wait_for_grant(svc.waiters, line, call.body.wait_seconds, call.request.gone)
    status = 201 if granted.created else 200
    call.acquire_log.write("granted" if granted.created else "existing", status,
                           fencing_token=granted.lease.fencing_token, mode=wanted.mode.value)
    return json_response(status, grant_body(granted.lease))


async def acquire_set(call: Call[schemas.AcquireLockSetBody]) -> Response:
    """POST /v1/lock-sets (SPEC §3.7): all the keys under one lock token, or
    none. A waiting set parks on every key's line and wakes when any frees."""
    keys = _distinct_keys(call.body.keys)
    call.acquire_log.fields["lock"] = ",".join(keys)[:200]
    wanted = _wanted(call)
    svc = call.services
    line = _LockSetLine(svc.store, call.caller.project, keys, wanted)
    granted = await wait_for_grant(svc.waiters, line, call.body.wait_seconds, call.request.gone)
    status = 201 if granted.created else 200
    call.acquire_log.write(
        "granted" if granted.created else "existing", status,
        fencing_token=[lease.fencing_token for lease in granted.leases], mode=wanted.mode.value,
    )
    return json_response(
        status, schemas.LockSetGrant(leases=[grant_body(lease) for lease in granted.leases])
    )


def _distinct_keys(keys: list[str]) -> list[str]:
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise invalid_field("keys", f"must be distinct names ({key!r} is repeated)")
        seen.add(key)
    return keys


class _LockLine:
    """A lock's line in the store (waiting.Line)."""

    def __init__(self, store: Store, project: str, key: str, wanted: AcquireRequest) -> None:
        self._store = store
        self._project = project
        self._key = key
        self._wanted = wanted

    @property
    def places(self) -> tuple[Place, ...]:
        return (("lock", self._project, self._key),)

    async def try_once(self, wait: bool) -> Outcome[Granted]:
        alive_ms = WAITER_ALIVE_MS if wait else None
        result = await self._store.acquire_lock(
            self._project, self._key, self._wanted, wait_alive_ms=alive_ms)
        return _outcome(result.outcome, result.ticket)

    async def retry(self, ticket: int) -> Outcome[Granted]:
        result = await self._store.retry_waiter(
            self._project, self._key, self._wanted, ticket, WAITER_ALIVE_MS)
        return _outcome(result.outcome, result.ticket)

    async def leave(self, ticket: int) -> None:
        await self._store.leave_line(self._project, self._key, ticket)

    async def hand_back(self, granted: Granted) -> None:
        if granted.created:
            await self._store.release_lock(self._project, self._key, self._wanted.lock_token)

    def timed_out(self, last: Outcome[Granted]) -> FencepostError:
        assert last.refusal is not None
        return last.refusal  # still held: the wait ends as lock_held


class _LockSetLine:
    """A lock set's places, one in every key's line under one ticket (waiting.Line)."""

    def __init__(
        self, store: Store, project: str, keys: list[str], wanted: AcquireRequest
    ) -> None:
        self._store = store
        self._project = project
        self._keys = keys
        self._wanted = wanted

    @property
    def places(self) -> tuple[Place, ...]:
        return tuple(("lock", self._project, key) for key in self._keys)

    async def try_once(self, wait: bool) -> Outcome[SetGranted]:
        alive_ms = WAITER_ALIVE_MS if wait else None
        result = await self._store.acquire_lock_set(
            self._project, self._keys, self._wanted, wait_alive_ms=alive_ms)
        return _outcome(result.outcome, result.ticket)

    async def retry(self, ticket: int) -> Outcome[SetGranted]:
        result = await self._store.retry_set_waiter(
            self._project, self._keys, self._wanted, ticket, WAITER_ALIVE_MS)
        return _outcome(result.outcome, result.ticket)

    async def leave(self, ticket: int) -> None:
        await self._store.leave_set_line(self._project, list(self._keys), ticket)

    async def hand_back(self, granted: SetGranted) -> None:
        if granted.created:
            for key in self._keys:
                await self._store.release_lock(self._project, key, self._wanted.lock_token)

    def timed_out(self, last: Outcome[SetGranted]) -> FencepostError:
        assert last.refusal is not None
        return last.refusal  # a key still held: the wait ends as lock_held


def _outcome(outcome: G | Busy, ticket: int | None) -> Outcome[G]:
    if not isinstance(outcome, Busy):
        return Outcome(outcome)
    # A lock delay ends by itself: a waiter re-checks then (a timer), besides
    # the wake-up the reaper sends when it clears the delay.
    ends_in_ms = outcome.ends_in_ms
    recheck_s = None if ends_in_ms is None else max(ends_in_ms / 1000, 0.005)
    # A lease in the way that expires frees the lock at that instant: the
    # line's first waiter re-checks then (waiting.py), not at the next reap.
    frees_in_ms = outcome.frees_in_ms
    frees_in_s = None if frees_in_ms is None else max(frees_in_ms / 1000, 0.005)
    return Outcome(None, ticket=ticket, refusal=outcome.to_error(), recheck_s=recheck_s,
                   frees_in_s=frees_in_s)


async def renew(call: Call[schemas.RenewLockBody]) -> Response:
    svc, caller, key = call.services, call.caller, call.params["key"]
    try:
        lease = await svc.store.renew_lock(
            caller.project, key, call.params["x-lock-token"], call.body.ttl_seconds)
    except (LeaseLost, LeaseExpired) as lost:
        reason = lost.extra.get("reason")
        svc.events.emit(Lost(caller.project, key, lost.code,
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


async def release(call: Call[None]) -> Response:
    released = await call.services.store.release_lock(
        call.caller.project, call.params["key"], call.params["x-lock-token"])
    return json_response(200, schemas.Released(released=released))


async def inspect(call: Call[None]) -> Response:
    no_query(call.request)
    view = await call.services.store.get_lock(call.caller.project, call.params["key"])
    return json_response(200, lock_state(view))


async def fence_check(call: Call[None]) -> Response:
    """GET /v1/locks/{key}/fence?token=N: for a resource that cannot keep the
    highest token itself (SPEC §3.8); always 200 for a well-formed request."""
    key = call.params["key"]
    token = fence_token(call.request)
    verdict = await call.services.store.fence_check(call.caller.project, key, token)
    return json_response(
        200,
        schemas.FenceCheck(
            key=key, token=token, current=verdict.current, live_token=verdict.live_token,
            reason=verdict.reason,  # type: ignore[arg-type]
        ),
    )


async def list_locks(call: Call[None]) -> Response:
    project = call.caller.project
    return await one_page(
        call.request, call.services.lists,
        lambda prefix, after, count: call.services.store.list_locks(project, prefix, after, count),
        lambda view: view.key,
        lambda views, cursor: json_response(
            200, schemas.LockList(locks=[lock_state(v) for v in views], next=cursor)),
    )


async def force_release(call: Call[None]) -> Response:
    """DELETE /v1/locks/{key}: always 200 for an admin or the lease's owner;
    afterwards no lease is live."""
    svc, caller, key = call.services, call.caller, call.params["key"]
    by = ForceReleaser(caller.key_id, is_admin=caller.role >= Role.ADMIN)
    result = await svc.store.force_release(caller.project, key, by)
    lease = result.lease
    svc.access_log.write(
        "lock.force_release",
        released=lease is not None,
        project=caller.project,
        key_id=caller.key_id,
        lock=key,
        request_id=call.request_id,
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
