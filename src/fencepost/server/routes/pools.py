"""Pool routes (SPEC §4.1–§4.4): configure, acquire (with a fair wait line), renew, release."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from fencepost.core import slots as rules
from fencepost.core.keys import Role
from fencepost.core.ratelimit_headers import RateLimitInfo, merge, parse_rate_limit_headers
from fencepost.core.slots import PoolConfig, Slot
from fencepost.core.timefmt import format_at
from fencepost.errors import (
    FencepostError,
    InvalidRequest,
    NotFound,
    QueueTimeout,
    TooManyRequests,
    ValidationError,
)
from fencepost.server import schemas
from fencepost.server.attempts import AttemptLog, get_or_wait
from fencepost.server.context import endpoint, path_name, services
from fencepost.server.http import json_response
from fencepost.server.listing import list_query, no_query, page
from fencepost.server.messages import Request, Response
from fencepost.server.validation import decode_body
from fencepost.server.waiting import WAITER_ALIVE_MS, Attempt, ClientGone
from fencepost.store.base import PoolView, SlotAttempt, SlotReport, Store

_SLOT_ID = re.compile(r"slot_[A-Za-z0-9_-]{16,64}")
_FALSE_WORDS = {"0", "false", "no", "off"}


def pool_state(view: PoolView) -> schemas.PoolState:
    c, s, g = view.config, view.stats, view.governor
    return schemas.PoolState(
        name=view.name, limit=c.limit, queue_size=c.queue_size,
        queue_timeout_ms=c.queue_timeout_ms, term_ms=c.term_ms,
        renew_interval_ms=c.suggested_renew_interval_ms,
        request_timeout_ms=c.request_timeout_ms, rpm=c.rpm, adaptive=c.adaptive,
        min_limit=c.min_limit, in_use=view.in_use, queued=view.queued,
        effective_limit=view.effective_limit,
        effective_rpm=view.effective_rpm,
        learned=schemas.LearnedState(
            effective_limit=view.effective_limit,
            effective_rpm=view.effective_rpm,
            window_ms=g.window_ms if g.learned_rpm is not None else None,
            paused_until_at=format_at(g.paused_until_ms) if g.paused_until_ms > view.now_ms
            else None,
            last_hint=None if g.last_hint is None else schemas.LastHint(
                source=g.last_hint.source, retry_after_ms=g.last_hint.retry_after_ms,
                at=format_at(g.last_hint.at_ms) or ""),
            limit=round(g.limit, 3),
            rpm=g.learned_rpm,
            window_reset_at=format_at(g.window_reset_ms),
            round_trip_ms=None if g.hold_ms is None else round(g.hold_ms, 1),
        ),
        stats=schemas.PoolStatsBody(
            released=s.released, reclaimed=s.reclaimed, statuses=s.statuses,
            status_429=s.status_429, throttled=s.throttled,
            last_retry_after_ms=s.last_retry_after_ms,
            last_reported_at=format_at(s.last_reported_ms),
        ),
    )


def _config(body: schemas.PoolConfigBody) -> PoolConfig:
    """The configuration a valid body describes; 422 naming the fields otherwise."""
    details = []
    if body.renew_interval_ms is not None and body.renew_interval_ms >= body.term_ms:
        details.append({"field": "renew_interval_ms", "message": "must be less than term_ms"})
    if body.min_limit > body.limit:
        details.append({"field": "min_limit", "message": "must not exceed limit"})
    if details:
        raise ValidationError(details)
    return PoolConfig(
        limit=body.limit, queue_size=body.queue_size, queue_timeout_ms=body.queue_timeout_ms,
        term_ms=body.term_ms, renew_interval_ms=body.renew_interval_ms,
        request_timeout_ms=body.request_timeout_ms, rpm=body.rpm, adaptive=body.adaptive,
        min_limit=body.min_limit,
    )


@endpoint
async def put_pool(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.ADMIN)
    name = path_name(request, "pool")
    config = _config(decode_body(request.body, schemas.PoolConfigBody))
    view, created = await svc.store.put_pool(principal.project, name, config)
    return json_response(201 if created else 200, pool_state(view))


def _patched(config: PoolConfig, patch: schemas.PoolPatchBody) -> PoolConfig:
    """`config` with the fields `patch` gives, validated as a PUT would be."""
    fields = {name: getattr(config, name) for name in schemas.PoolConfigBody.__struct_fields__}
    for name in schemas.PoolPatchBody.__struct_fields__:
        value = getattr(patch, name)
        if value is not msgspec.UNSET:
            fields[name] = value
    return _config(msgspec.convert(fields, schemas.PoolConfigBody))


@endpoint
async def patch_pool(request: Request) -> Response:
    """PATCH /v1/pools/{pool}: change only the fields given; answers like GET."""
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.ADMIN)
    name = path_name(request, "pool")
    patch = decode_body(request.body, schemas.PoolPatchBody)
    current = await svc.store.get_pool(principal.project, name)
    if current is None:
        raise NotFound(f"No pool named {name!r}.")
    view, _ = await svc.store.put_pool(principal.project, name, _patched(current.config, patch))
    return json_response(200, pool_state(view))


@endpoint
async def get_pool(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.READER)
    name = path_name(request, "pool")
    view = await svc.store.get_pool(principal.project, name)
    if view is None:
        raise NotFound(f"No pool named {name!r}.")
    return json_response(200, pool_state(view))


@endpoint
async def list_pools(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.READER)
    prefix, after, limit = list_query(request)
    fetched = await svc.store.list_pools(principal.project, prefix, after, limit + 1)
    views, cursor = page(fetched, limit, lambda v: v.name)
    return json_response(200, schemas.PoolList(pools=[pool_state(v) for v in views], next=cursor))


@endpoint
async def list_slots(request: Request) -> Response:
    """GET /v1/pools/{pool}/slots: who holds the live slots (never a whole slot id)."""
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.READER)
    name = path_name(request, "pool")
    no_query(request)
    held = await svc.store.list_slots(principal.project, name)
    return json_response(200, schemas.SlotList(slots=[
        schemas.SlotHolder(
            slot_id_prefix=s.slot_id_prefix, key_id=s.key.key_id, key_name=s.key.key_name,
            acquired_at=format_at(s.acquired_ms) or "", lease_deadline=s.lease_deadline_ms,
            request_deadline=s.request_deadline_ms,
        )
        for s in held
    ]))


@endpoint
async def delete_pool(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.ADMIN)
    name = path_name(request, "pool")
    if not await svc.store.delete_pool(principal.project, name):
        raise NotFound(f"No pool named {name!r}.")
    return json_response(200, schemas.Deleted(deleted=True))


# --- acquire -------------------------------------------------------------------


def _wanted_wait_ms(request: Request, body: bytes) -> tuple[int, bool]:
    """The wait asked for (body wins over X-Queue-Timeout-Ms) and whether X-No-Queue is set."""
    header = request.headers.get("x-queue-timeout-ms")
    wait_ms = 0
    if header is not None:
        header = header.strip()
        if not (header.isascii() and header.isdigit()) or len(header) > 12:
            raise InvalidRequest(
                "X-Queue-Timeout-Ms must be a whole number of milliseconds.",
                details=[{"field": "X-Queue-Timeout-Ms", "message": "not a number"}],
            )
        wait_ms = int(header)
    if body.strip():
        parsed = decode_body(body, schemas.AcquireSlotBody)
        if parsed.wait_ms is not None:
            wait_ms = parsed.wait_ms
    no_queue = request.headers.get("x-no-queue")
    return wait_ms, no_queue is not None and no_queue.strip().lower() not in _FALSE_WORDS


def _paused_message(attempt: SlotAttempt) -> str | None:
    if attempt.paused_until_ms is None:
        return None
    return (f"The pool is paused until {format_at(attempt.paused_until_ms)}: the upstream "
            "reported its shared budget empty.")


def _too_many(attempt: SlotAttempt) -> TooManyRequests:
    full = attempt.in_use >= attempt.effective_limit
    paused = _paused_message(attempt)
    message = paused or (f"All {attempt.effective_limit} slots are in use." if full
                         else "The pool is pacing admissions to the upstream's rate.")
    extra: dict[str, Any] = {} if attempt.paused_until_ms is None else {
        "paused_until_at": format_at(attempt.paused_until_ms)}
    return TooManyRequests(
        message,
        # During a pause the answer names its end (SPEC §4.5), not the next probe.
        retry_after_ms=attempt.pause_left_ms or attempt.retry_after_ms,
        in_use=attempt.in_use,
        effective_limit=attempt.effective_limit,
        **extra,
    )


def _attempt(result: SlotAttempt) -> Attempt[SlotAttempt]:
    if result.slot is not None:
        return Attempt(result)
    # Re-check when the refusal is known to end (a probe of a pause, the next
    # paced turn, a slot's hard cap), without waiting for the periodic re-check.
    recheck = None if result.retry_after_ms is None else result.retry_after_ms / 1000
    return Attempt(None, result.ticket, _too_many(result), recheck)


async def acquire(request: Request) -> Response:
    """POST /v1/pools/{pool}/lock/acquire: every attempt goes to the access log."""
    svc = services(request)
    log = AttemptLog(request, "pool.acquire", "pool", "pool")
    try:
        principal = await svc.auth.authenticate(request, Role.MEMBER)
        log.fields.update(project=principal.project, key_id=principal.key_id)
        pool = path_name(request, "pool")
        wanted_ms, no_queue = _wanted_wait_ms(request, request.body)
        view = await svc.store.get_pool(principal.project, pool)
        if view is None:
            raise NotFound(f"No pool named {pool!r}.")
        wait_ms = rules.clamp_wait_ms(view.config, wanted_ms, no_queue)
        log.waited = wait_ms > 0
        admitted = await _acquire(request, principal.project, pool, wait_ms, principal.key_id)
    except ClientGone as gone:
        log.failed(gone)
        return Response(status_code=499)
    except FencepostError as error:
        log.failed(error)
        raise
    slot = admitted.slot
    assert slot is not None
    # The first characters correlate log lines; the whole ID is a capability.
    log.write("granted", 200, slot_id_prefix=slot.slot_id[:9])
    return json_response(
        200,
        _grant_body(slot, view.config),
        headers={
            "X-Remaining-Slots": str(max(0, admitted.effective_limit - admitted.in_use)),
            "X-Effective-Limit": str(admitted.effective_limit),
            "X-Queued-Ms": str(log.elapsed_ms),
        },
    )


def _grant_body(slot: Slot, config: PoolConfig) -> schemas.SlotGrant:
    return schemas.SlotGrant(
        slot_id=slot.slot_id,
        lease_deadline=slot.lease_deadline_ms,
        request_deadline=slot.request_deadline_ms,
        term_ms=config.term_ms,
        renew_interval_ms=config.suggested_renew_interval_ms,
    )


async def _acquire(
    request: Request, project: str, pool: str, wait_ms: int, key_id: str
) -> SlotAttempt:
    store = services(request).store
    wait_alive_ms = WAITER_ALIVE_MS if wait_ms > 0 else None
    first = _attempt(
        await store.acquire_slot(project, pool, wait_alive_ms=wait_alive_ms, key_id=key_id)
    )

    async def retry(ticket: int) -> Attempt[SlotAttempt]:
        return _attempt(
            await store.retry_slot_waiter(project, pool, ticket, WAITER_ALIVE_MS, key_id)
        )

    async def leave(ticket: int) -> None:
        await store.leave_slot_line(project, pool, ticket)

    def timed_out(attempt: Attempt[SlotAttempt]) -> FencepostError:
        refusal = attempt.refusal
        if refusal is not None and "paused_until_at" in refusal.extra:
            # SPEC §4.5: say so, with Retry-After at the pause's end.
            return QueueTimeout(f"Waited {wait_ms} ms. {refusal.message}",
                                retry_after_ms=refusal.retry_after_ms)
        return QueueTimeout(f"Waited {wait_ms} ms and no slot opened.")

    async def hand_back(admitted: SlotAttempt) -> None:
        if admitted.slot is not None:
            await store.release_slot(project, pool, admitted.slot.slot_id, None)

    return await get_or_wait(
        request, [("pool", project, pool)], first, retry, leave, wait_ms / 1000, timed_out,
        hand_back,
    )


# --- renew and release -----------------------------------------------------------


def _slot_id(request: Request) -> str:
    slot_id = str(request.path_params["slot_id"])
    if _SLOT_ID.fullmatch(slot_id) is None:
        raise NotFound("No such slot.")
    return slot_id


@endpoint
async def renew(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.MEMBER)
    pool = path_name(request, "pool")
    body = request.body
    if body.strip():
        decode_body(body, schemas.EmptyBody)  # renewal takes no fields
    slot = await svc.store.renew_slot(principal.project, pool, _slot_id(request))
    return json_response(200, schemas.SlotRenewal(lease_deadline=slot.lease_deadline_ms))


async def _reported_rate(store: Store, body: schemas.ReleaseSlotBody) -> RateLimitInfo | None:
    """The upstream's rate-limit state: `rate` fields win over parsed `headers`."""
    explicit = None
    if body.rate is not None:
        r = body.rate
        explicit = RateLimitInfo(
            request_limit=r.limit, request_remaining=r.remaining, request_reset_ms=r.reset_ms,
            token_limit=r.token_limit, token_remaining=r.token_remaining,
            token_reset_ms=r.token_reset_ms,
        )
    parsed = parse_rate_limit_headers(body.headers or {}, await store.now_ms())
    merged = merge(explicit, parsed)
    return None if merged.is_empty() else merged


@endpoint
async def release(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.MEMBER)
    pool = path_name(request, "pool")
    body = request.body
    report = None
    if body.strip():
        parsed = decode_body(body, schemas.ReleaseSlotBody)
        report = SlotReport(
            status=parsed.status,
            throttled=parsed.throttled,
            retry_after_ms=parsed.retry_after_ms,
            rate=await _reported_rate(svc.store, parsed),
            report_json=msgspec.json.encode(parsed).decode(),
        )
    released = await svc.store.release_slot(principal.project, pool, _slot_id(request), report)
    return json_response(200, schemas.Released(released=released))

