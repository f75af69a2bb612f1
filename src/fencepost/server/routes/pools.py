"""Pool routes (SPEC §4.1–§4.4): configure, acquire (with a fair wait line), renew, release."""

from __future__ import annotations

from typing import Any

import msgspec

from fencepost.core import governor as gov
from fencepost.core.proxy_headers import UNMANAGEABLE, base_url_problem
from fencepost.core.ratelimit_headers import RateLimitInfo, merge, parse_rate_limit_headers
from fencepost.core.slots import PoolConfig, Slot, Upstream
from fencepost.core.timefmt import format_at
from fencepost.errors import (
    FencepostError,
    NotFound,
    QueueTimeout,
    TooManyRequests,
    ValidationError,
)
from fencepost.server import schemas
from fencepost.server.access_log import AcquireLog
from fencepost.server.context import Call
from fencepost.server.http import json_response
from fencepost.server.listing import no_query, one_page
from fencepost.server.messages import Response
from fencepost.server.waiting import WAITER_ALIVE_MS, Outcome, Place, wait_for_grant
from fencepost.store.base import PoolView, SlotAttempt, SlotReport, Store

_FALSE_WORDS = {"0", "false", "no", "off"}


def pool_state(view: PoolView) -> schemas.PoolState:
    c, s, g = view.config, view.stats, view.governor
    return schemas.PoolState(
        name=view.name, limit=c.limit, queue_size=c.queue_size,
        queue_timeout_ms=c.queue_timeout_ms, term_ms=c.term_ms,
        renew_interval_ms=c.suggested_renew_interval_ms,
        request_timeout_ms=c.request_timeout_ms, rpm=c.rpm, adaptive=c.adaptive,
        min_limit=c.min_limit,
        upstream=None if c.upstream is None else schemas.UpstreamState(
            base_url=c.upstream.base_url, headers=c.upstream.header_names,
            timeout_ms=c.upstream.timeout_ms),
        max_body_bytes=c.max_body_bytes, cost_per_minute=c.cost_per_minute,
        in_use=view.in_use, queued=view.queued,
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
            effective_cost_per_minute=view.effective_cost_per_minute,
            cost_per_minute=view.learned_cost_per_minute,
            remaining_cost=view.remaining_cost,
            average_cost=None if view.average_cost is None else round(view.average_cost, 1),
            slow_start=c.adaptive and (g.slow_start or gov.stale(g, view.now_ms)),
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
    if body.upstream is not None:
        details.extend(upstream_problems(body.upstream))
    if details:
        raise ValidationError(details)
    return PoolConfig(
        limit=body.limit, queue_size=body.queue_size, queue_timeout_ms=body.queue_timeout_ms,
        term_ms=body.term_ms, renew_interval_ms=body.renew_interval_ms,
        request_timeout_ms=body.request_timeout_ms, rpm=body.rpm, adaptive=body.adaptive,
        min_limit=body.min_limit, upstream=_upstream(body.upstream),
        max_body_bytes=body.max_body_bytes, cost_per_minute=body.cost_per_minute,
    )


def upstream_problems(body: schemas.UpstreamBody) -> list[dict[str, str]]:
    """What is wrong with an upstream beyond its fields' types (422 details)."""
    details = []
    problem = base_url_problem(body.base_url)
    if problem is not None:
        details.append({"field": "upstream.base_url", "message": problem})
    seen: set[str] = set()
    for name in body.headers:
        lower = name.lower()
        if lower in seen:
            details.append({"field": "upstream.headers",
                            "message": f"{name} repeats a header name (names are "
                                       "case-insensitive)"})
        elif lower in UNMANAGEABLE:
            details.append({"field": "upstream.headers",
                            "message": f"{name} is a hop-by-hop or framing header, which "
                                       "the proxy sets itself"})
        seen.add(lower)
    return details


def _upstream(body: schemas.UpstreamBody | None) -> Upstream | None:
    if body is None:
        return None
    return Upstream(
        # "https://api.example.com/v1/" and ".../v1" name the same base: the
        # proxied path always brings its own "/".
        base_url=body.base_url.rstrip("/"),
        headers=tuple(body.headers.items()),
        timeout_ms=body.timeout_ms,
    )


async def put_pool(call: Call[schemas.PoolConfigBody]) -> Response:
    config = await _allowed(call, _config(call.body))
    view, created = await call.services.store.put_pool(
        call.caller.project, call.params["pool"], config)
    return json_response(201 if created else 200, pool_state(view))


async def _allowed(call: Call[Any], config: PoolConfig) -> PoolConfig:
    """`config`, unless its upstream is outside the server's --upstream-allow
    (SPEC §4.7: 422, nothing written)."""
    if config.upstream is not None:
        refusal = await call.services.upstreams.refusal(config.upstream.base_url)
        if refusal is not None:
            raise ValidationError([{"field": "upstream.base_url", "message": refusal}])
    return config


def _patched(config: PoolConfig, patch: schemas.PoolPatchBody) -> PoolConfig:
    """`config` with the fields `patch` gives, validated as a PUT would be."""
    fields: dict[str, Any] = {
        name: getattr(config, name) for name in schemas.PoolConfigBody.__struct_fields__}
    fields["upstream"] = _upstream_fields(config.upstream)
    for name in schemas.PoolPatchBody.__struct_fields__:
        value = getattr(patch, name)
        if value is msgspec.UNSET:
            continue
        if name == "upstream" and value is not None:
            value = _patched_upstream(fields["upstream"], value)
        fields[name] = value
    return _config(msgspec.convert(fields, schemas.PoolConfigBody))


def _upstream_fields(upstream: Upstream | None) -> dict[str, Any] | None:
    if upstream is None:
        return None
    return {"base_url": upstream.base_url, "headers": dict(upstream.headers),
            "timeout_ms": upstream.timeout_ms}


def _patched_upstream(
    current: dict[str, Any] | None, patch: schemas.UpstreamPatch,
) -> dict[str, Any]:
    """The upstream after `patch`; a pool without one must be given a base_url."""
    fields = dict(current or {})
    for name in schemas.UpstreamPatch.__struct_fields__:
        value = getattr(patch, name)
        if value is not msgspec.UNSET:
            fields[name] = value
    if "base_url" not in fields:
        raise ValidationError([{"field": "upstream.base_url",
                                "message": "is required: the pool has no upstream yet"}])
    return fields


async def patch_pool(call: Call[schemas.PoolPatchBody]) -> Response:
    """PATCH /v1/pools/{pool}: change only the fields given; answers like GET."""
    store, project, name = call.services.store, call.caller.project, call.params["pool"]
    current = await store.get_pool(project, name)
    if current is None:
        raise NotFound(f"No pool named {name!r}.")
    config = await _allowed(call, _patched(current.config, call.body))
    view, _ = await store.put_pool(project, name, config)
    return json_response(200, pool_state(view))


async def get_pool(call: Call[None]) -> Response:
    name = call.params["pool"]
    view = await call.services.store.get_pool(call.caller.project, name)
    if view is None:
        raise NotFound(f"No pool named {name!r}.")
    return json_response(200, pool_state(view))


async def list_pools(call: Call[None]) -> Response:
    project = call.caller.project
    return await one_page(
        call.request, call.services.lists,
        lambda prefix, after, count: call.services.store.list_pools(project, prefix, after, count),
        lambda view: view.name,
        lambda views, cursor: json_response(
            200, schemas.PoolList(pools=[pool_state(v) for v in views], next=cursor)),
    )


async def list_slots(call: Call[None]) -> Response:
    """GET /v1/pools/{pool}/slots: who holds the live slots (never a whole slot id)."""
    no_query(call.request)
    held = await call.services.store.list_slots(call.caller.project, call.params["pool"])
    return json_response(200, schemas.SlotList(slots=[
        schemas.SlotHolder(
            slot_id_prefix=s.slot_id_prefix, key_id=s.key.key_id, key_name=s.key.key_name,
            acquired_at=format_at(s.acquired_ms) or "", lease_deadline=s.lease_deadline_ms,
            request_deadline=s.request_deadline_ms,
        )
        for s in held
    ]))


async def delete_pool(call: Call[None]) -> Response:
    name = call.params["pool"]
    if not await call.services.store.delete_pool(call.caller.project, name):
        raise NotFound(f"No pool named {name!r}.")
    return json_response(200, schemas.Deleted(deleted=True))


# --- acquire -------------------------------------------------------------------


def wanted_wait(params: dict[str, str], body_wait_ms: int | None) -> tuple[int, bool]:
    """The wait asked for (the body's, when it gives one, wins over
    X-Queue-Timeout-Ms) and whether X-No-Queue is set."""
    header = params.get("x-queue-timeout-ms")
    wait_ms = 0 if header is None else int(header)
    if body_wait_ms is not None:
        wait_ms = body_wait_ms
    no_queue = params.get("x-no-queue")
    return wait_ms, no_queue is not None and no_queue.strip().lower() not in _FALSE_WORDS


def _paused_message(result: SlotAttempt) -> str | None:
    if result.paused_until_ms is None:
        return None
    return (f"The pool is paused until {format_at(result.paused_until_ms)}: the upstream "
            "reported its shared budget empty.")


def _too_many(result: SlotAttempt) -> TooManyRequests:
    full = result.in_use >= result.effective_limit
    paused = _paused_message(result)
    message = paused or (f"All {result.effective_limit} slots are in use." if full
                         else "The pool is pacing admissions to the upstream's rate.")
    extra: dict[str, Any] = {} if result.paused_until_ms is None else {
        "paused_until_at": format_at(result.paused_until_ms)}
    return TooManyRequests(
        message,
        # During a pause the answer names its end (SPEC §4.5), not the next probe.
        retry_after_ms=result.pause_left_ms or result.retry_after_ms,
        in_use=result.in_use,
        effective_limit=result.effective_limit,
        **extra,
    )


def _outcome(result: SlotAttempt, wait_s: float | None = None) -> Outcome[SlotAttempt]:
    if result.slot is not None:
        return Outcome(result)
    # Re-check when the refusal is known to end (a probe of a pause, the next
    # paced turn, a slot's hard cap), without waiting for a wake-up.
    recheck = None if result.retry_after_ms is None else result.retry_after_ms / 1000
    return Outcome(None, ticket=result.ticket, refusal=_too_many(result), recheck_s=recheck,
                   wait_s=wait_s)


async def acquire(call: Call[schemas.AcquireSlotBody | None]) -> Response:
    """POST /v1/pools/{pool}/lock/acquire: every request goes to the access log
    (the app writes the line of one that fails)."""
    svc, caller, log, pool = call.services, call.caller, call.acquire_log, call.params["pool"]
    wanted_ms, no_queue = wanted_wait(
        call.params, None if call.body is None else call.body.wait_ms)
    session_id = None if call.body is None else call.body.session_id
    cost = None if call.body is None else call.body.cost
    # The pool is not read first: the store clamps the wait to the pool's
    # configuration in the transaction that admits (and raises NotFound, the
    # 404, for an unknown pool before anything else); see SlotLine.try_once.
    line = SlotLine(svc.store, caller.project, pool, caller.key_id, wanted_ms, no_queue,
                     session_id, log, cost)
    asked_s = 0 if no_queue else max(0, wanted_ms) / 1000  # at most this; the try clamps it
    admitted = await wait_for_grant(svc.waiters, line, asked_s, call.request.gone)
    slot = admitted.slot
    assert slot is not None
    # The first characters correlate log lines; the whole ID is a capability.
    log.write("granted", 200, slot_id_prefix=slot.slot_id[:9])
    return json_response(
        200,
        # The configuration the slot was admitted under (after a wait, that of
        # the retry that admitted it: a PUT or PATCH meanwhile may have changed
        # the pool's, and the slot's deadlines follow the one it got).
        _grant_body(slot, admitted.config),
        headers=grant_headers(admitted, log.elapsed_ms),
    )


def grant_headers(admitted: SlotAttempt, queued_ms: int) -> dict[str, str]:
    """What a grant's answer says of the pool (SPEC §4.2, §4.6)."""
    headers = {
        "X-Remaining-Slots": str(max(0, admitted.effective_limit - admitted.in_use)),
        "X-Effective-Limit": str(admitted.effective_limit),
        "X-Queued-Ms": str(queued_ms),
    }
    if admitted.remaining_cost is not None:
        headers["X-Remaining-Cost"] = str(admitted.remaining_cost)
    return headers


def _grant_body(slot: Slot, config: PoolConfig) -> schemas.SlotGrant:
    return schemas.SlotGrant(
        slot_id=slot.slot_id,
        lease_deadline=slot.lease_deadline_ms,
        request_deadline=slot.request_deadline_ms,
        term_ms=config.term_ms,
        renew_interval_ms=config.suggested_renew_interval_ms,
    )


class SlotLine:
    """A pool's line in the store (waiting.Line)."""

    def __init__(
        self, store: Store, project: str, pool: str, key_id: str, wanted_ms: int,
        no_queue: bool, session_id: str | None, log: AcquireLog, cost: int | None = None,
    ) -> None:
        self._store = store
        self._cost = cost  # units of the pool's budget the call will spend (SPEC §4.6)
        self._session_id = session_id  # attach the slot to it (SPEC §3.10)
        self._project = project
        self._pool = pool
        self._key_id = key_id
        self._wanted_ms = wanted_ms  # as asked; the store clamps it
        self._no_queue = no_queue
        self._log = log
        self._wait_ms = 0  # the clamped wait, once the first try has told it

    @property
    def places(self) -> tuple[Place, ...]:
        return (("pool", self._project, self._pool),)

    async def try_once(self, wait: bool) -> Outcome[SlotAttempt]:
        alive_ms = WAITER_ALIVE_MS if wait else None
        attempt = await self._store.acquire_slot(
            self._project, self._pool, wait_ms=self._wanted_ms, no_queue=self._no_queue,
            wait_alive_ms=alive_ms, key_id=self._key_id, session_id=self._session_id,
            cost=self._cost)
        # The wait clamped to the pool's configuration (SPEC §4.2) decides how
        # long to wait, and whether a refusal is logged as a timeout.
        self._wait_ms = attempt.wait_ms
        self._log.waited = attempt.wait_ms > 0
        return _outcome(attempt, attempt.wait_ms / 1000)

    async def retry(self, ticket: int) -> Outcome[SlotAttempt]:
        return _outcome(await self._store.retry_slot_waiter(
            self._project, self._pool, ticket, WAITER_ALIVE_MS, self._key_id, self._session_id,
            self._cost))

    async def leave(self, ticket: int) -> None:
        await self._store.leave_slot_line(self._project, self._pool, ticket)

    async def hand_back(self, granted: SlotAttempt) -> None:
        if granted.slot is not None:
            await self._store.release_slot(self._project, self._pool, granted.slot.slot_id, None)

    def timed_out(self, last: Outcome[SlotAttempt]) -> FencepostError:
        refusal = last.refusal
        if refusal is not None and "paused_until_at" in refusal.extra:
            # SPEC §4.5: say so, with Retry-After at the pause's end.
            return QueueTimeout(f"Waited {self._wait_ms} ms. {refusal.message}",
                                retry_after_ms=refusal.retry_after_ms)
        return QueueTimeout(f"Waited {self._wait_ms} ms and no slot opened.")


# --- renew and release -----------------------------------------------------------


async def renew(call: Call[schemas.EmptyBody | None]) -> Response:
    slot = await call.services.store.renew_slot(
        call.caller.project, call.params["pool"], call.params["slot_id"])
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


async def release(call: Call[schemas.ReleaseSlotBody | None]) -> Response:
    store, body = call.services.store, call.body
    report = None
    if body is not None:
        report = SlotReport(
            status=body.status,
            throttled=body.throttled,
            retry_after_ms=body.retry_after_ms,
            rate=await _reported_rate(store, body),
            report_json=msgspec.json.encode(body).decode(),
            cost=body.cost,
        )
    released = await store.release_slot(
        call.caller.project, call.params["pool"], call.params["slot_id"], report)
    return json_response(200, schemas.Released(released=released))
