"""Every API call, written once as a small sans-I/O program.

Each operation is a generator: it yields the `Call`s to make, receives their
decoded answers (or has their errors thrown into it), and returns the result.
`AsyncClient` and `Client` run the same programs; neither holds request-building
or decoding logic of its own. Most programs make one call; acquiring a lock for
longer than the server's longest wait makes several.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import msgspec

from fencepost.client.calls import (
    MAX_LOCK_WAIT_S,
    Call,
    Reply,
    Step,
    Wait,
    decode_as,
    decode_flag,
    header_int,
    id_segment,
    name_segment,
    new_token,
    parse_body,
    parse_json,
)
from fencepost.client.models import (
    CreatedKey,
    FenceCheck,
    ForceRelease,
    Health,
    KeyInfo,
    Lease,
    LeaseRenewal,
    LockInfo,
    LockMode,
    LockPage,
    LockSet,
    OnExpiry,
    PoolInfo,
    PoolPage,
    Role,
    SessionEnd,
    SessionGrant,
    SessionInfo,
    SlotGrant,
    SlotHolder,
    SlotList,
    SlotRenewal,
    WhoAmI,
)
from fencepost.client.outcome import Outcome
from fencepost.client.proxying import Upstream
from fencepost.errors import LockHeld, UnexpectedResponse

T = TypeVar("T")
Op = Generator[Step, Any, T]
"""A program that yields steps (calls, sleeps) and returns a `T`."""


def _one(call: Call[T]) -> Op[T]:
    result: T = yield call
    return result


def _list_params(prefix: str | None, limit: int | None, after: str | None) -> dict[str, str]:
    params: dict[str, str] = {}
    if prefix:
        params["prefix"] = prefix
    if limit is not None:
        params["limit"] = str(limit)
    if after:
        params["after"] = after
    return params


# --- locks (SPEC §3) -----------------------------------------------------------


def acquire_call(
    key: str,
    token: str,
    *,
    ttl: int,
    wait_until: float | None,
    operation: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    on_expiry: OnExpiry = "release",
    lock_delay: int = 0,
    shared: bool = False,
    retry: bool = True,
    session_id: str | None = None,
) -> Call[Lease]:
    """The acquire request for one lock token; waits until `wait_until` (monotonic).
    With `session_id` the lease follows that session's expiry (`ttl` is sent, as
    the server asks for one, and not used)."""
    body = _acquire_body(ttl, operation, metadata, on_expiry, lock_delay, shared, session_id)
    mode: LockMode = "shared" if shared else "exclusive"

    def decode(reply: Reply) -> Lease:
        lease = parse_body(reply, Lease)
        return msgspec.structs.replace(
            lease, lock_token=token, created=reply.status == 201, mode=mode
        )

    return Call(
        "PUT", f"/v1/locks/{name_segment(key, 'key')}/lease", decode, body=body,
        headers={"X-Lock-Token": token},
        wait=None if wait_until is None else Wait(wait_until, "wait_seconds"),
        retry=retry,
    )


def _acquire_body(
    ttl: int, operation: str | None, metadata: Mapping[str, Any] | None,
    on_expiry: OnExpiry, lock_delay: int, shared: bool, session_id: str | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"ttl_seconds": ttl}
    if session_id is not None:
        body["session_id"] = session_id
    if operation is not None:
        body["operation"] = operation
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if on_expiry != "release":
        body["on_expiry"] = on_expiry
    if lock_delay:
        body["lock_delay_seconds"] = lock_delay
    if shared:
        body["mode"] = "shared"
    return body


def _in_chunks(wait: float, make: Callable[[float | None], Call[T]]) -> Op[T]:
    """Run the acquire `make(wait_until)` makes, waiting up to `wait` seconds in
    all: waits over 300 s (the server's longest) are consecutive waits."""
    deadline = time.monotonic() + wait if wait > 0 else None
    while True:
        chunk_end = None
        if deadline is not None:
            chunk_end = min(deadline, time.monotonic() + MAX_LOCK_WAIT_S)
        try:
            result: T = yield make(chunk_end)
            return result
        except LockHeld:
            if deadline is None or time.monotonic() >= deadline - 0.001:
                raise


def acquire_lock(
    key: str,
    *,
    ttl: int,
    wait: float = 0,
    operation: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    on_expiry: OnExpiry = "release",
    lock_delay: int = 0,
    shared: bool = False,
    token: str | None = None,
    session_id: str | None = None,
) -> Op[Lease]:
    """Acquire lock `key` for `ttl` seconds, waiting in line up to `wait` seconds
    (0 fails fast with `LockHeld`). Returns the `Lease`, whose `lock_token` you
    keep to renew and release. `lock_delay` (0..60 s): if this lease ends by
    expiry or force release, nobody gets the lock for that long. A retried
    request reuses the same lock token, so a lost answer never creates a second
    lease. Waits over 300 s (the server's longest) are made of consecutive
    waits. `shared=True` takes a shared (reader) lease: any number may be live
    together, none beside an exclusive one, and a reader arriving behind a
    waiting writer waits behind it. With `session_id` (see `create_session`)
    the lease has no expiry of its own: it follows the session's and ends with
    it (`ttl` is not used). You usually want `lock()` instead: it renews and
    releases for you."""
    token = token or new_token()
    return _in_chunks(wait, lambda until: acquire_call(
        key, token, ttl=ttl, wait_until=until, operation=operation,
        metadata=metadata, on_expiry=on_expiry, lock_delay=lock_delay, shared=shared,
        session_id=session_id,
    ))


def acquire_lock_set(
    keys: Sequence[str],
    *,
    ttl: int,
    wait: float = 0,
    operation: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    on_expiry: OnExpiry = "release",
    lock_delay: int = 0,
    shared: bool = False,
    token: str | None = None,
    session_id: str | None = None,
) -> Op[LockSet]:
    """Acquire every lock in `keys` (1..32 distinct names) under one lock token,
    or none (SPEC §3.7): `LockHeld` names the first busy key. Waiting takes a
    place in every key's line at once, so two sets never deadlock. Renew and
    release each key with `renew_lock` / `release_lock` and the set's
    `lock_token`. With `session_id` every lease follows that session (see
    `acquire_lock`). You usually want `lock_many()` instead."""
    token = token or new_token()
    names = [name_segment(key, "key") for key in keys]
    body = {"keys": names, **_acquire_body(ttl, operation, metadata, on_expiry, lock_delay,
                                           shared, session_id)}
    mode: LockMode = "shared" if shared else "exclusive"

    def decode(reply: Reply) -> LockSet:
        granted = parse_body(reply, LockSet)
        created = reply.status == 201
        leases = [msgspec.structs.replace(lease, lock_token=token, created=created, mode=mode)
                  for lease in granted.leases]
        return LockSet(leases=leases, lock_token=token, created=created)

    return _in_chunks(wait, lambda until: Call(
        "POST", "/v1/lock-sets", decode, body=body, headers={"X-Lock-Token": token},
        wait=None if until is None else Wait(until, "wait_seconds"),
    ))


def renew_call(key: str, token: str, ttl: int, *, retry: bool = True,
               timeout: float | None = None) -> Call[LeaseRenewal]:
    return Call(
        "PATCH", f"/v1/locks/{name_segment(key, 'key')}/lease", decode_as(LeaseRenewal),
        body={"ttl_seconds": ttl}, headers={"X-Lock-Token": token}, retry=retry,
        timeout=timeout, renews=True,
    )


def renew_lock(key: str, token: str, *, ttl: int) -> Op[LeaseRenewal]:
    """Renew the lease that `token` holds on `key`: it now expires `ttl` seconds
    from when the server handles this. Raises `LeaseLost` when the token no longer
    holds the lock, `LeaseExpired` when the renewal came too late."""
    return _one(renew_call(key, token, ttl))


def release_call(key: str, token: str) -> Call[bool]:
    return Call(
        "DELETE", f"/v1/locks/{name_segment(key, 'key')}/lease", decode_flag("released"),
        headers={"X-Lock-Token": token},
    )


def release_lock(key: str, token: str) -> Op[bool]:
    """Release the lease that `token` holds on `key`. True when it held the lock,
    False when it no longer did (idempotent: never an error)."""
    return _one(release_call(key, token))


def get_lock(key: str) -> Op[LockInfo]:
    """The state of lock `key`: holder's fencing token, operation, expiry, waiters."""
    return _one(Call("GET", f"/v1/locks/{name_segment(key, 'key')}", decode_as(LockInfo)))


def list_locks(
    *, prefix: str | None = None, limit: int | None = None, after: str | None = None
) -> Op[LockPage]:
    """One page of the project's held locks, sorted by key (`limit` 1..1000)."""
    return _one(Call("GET", "/v1/locks", decode_as(LockPage),
                     params=_list_params(prefix, limit, after)))


def force_release(key: str) -> Op[ForceRelease]:
    """Force-release lock `key` without its lock token: an admin may end any
    lease, a member one its own API key took (else `Forbidden`). Afterwards no
    lease is live and the displaced holder's next renewal fails."""
    return _one(Call("DELETE", f"/v1/locks/{name_segment(key, 'key')}",
                     decode_as(ForceRelease)))


def fence_check(key: str, token: int) -> Op[FenceCheck]:
    """Whether `token` is the fencing token of lock `key`'s live lease, for a
    resource that cannot keep the highest token itself (SPEC §3.8)."""
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise ValueError("token must be a non-negative integer (a fencing token)")
    return _one(Call("GET", f"/v1/locks/{name_segment(key, 'key')}/fence",
                     decode_as(FenceCheck), params={"token": str(token)}))


# --- pools (SPEC §4) -----------------------------------------------------------


def _pool_path(pool: str) -> str:
    return f"/v1/pools/{name_segment(pool, 'pool')}"


def set_pool(
    name: str,
    *,
    limit: int,
    queue_size: int | None = None,
    queue_timeout_ms: int | None = None,
    term_ms: int | None = None,
    renew_interval_ms: int | None = None,
    request_timeout_ms: int | None = None,
    rpm: int | None = None,
    adaptive: bool | None = None,
    min_limit: int | None = None,
    upstream: Upstream | None = None,
    max_body_bytes: int | None = None,
    cost_per_minute: int | None = None,
) -> Op[PoolInfo]:
    """Create or replace pool `name`'s configuration (admin). Fields left out take
    the server's defaults. `upstream` makes the pool callable in proxy mode
    (see `Upstream`); `cost_per_minute` gives it a unit budget (tokens per
    minute, SPEC §4.6). Returns the configuration and live state."""
    fields = {
        "limit": limit, "queue_size": queue_size, "queue_timeout_ms": queue_timeout_ms,
        "term_ms": term_ms, "renew_interval_ms": renew_interval_ms,
        "request_timeout_ms": request_timeout_ms, "rpm": rpm, "adaptive": adaptive,
        "min_limit": min_limit, "max_body_bytes": max_body_bytes,
        "cost_per_minute": cost_per_minute,
        "upstream": None if upstream is None else upstream.as_json(),
    }
    body = {k: v for k, v in fields.items() if v is not None}
    return _one(Call("PUT", _pool_path(name), decode_as(PoolInfo), body=body))


def update_pool(
    name: str,
    *,
    limit: int | None = None,
    queue_size: int | None = None,
    queue_timeout_ms: int | None = None,
    term_ms: int | None = None,
    renew_interval_ms: int | None = None,
    request_timeout_ms: int | None = None,
    rpm: int | None = None,
    adaptive: bool | None = None,
    min_limit: int | None = None,
    upstream: Upstream | None = None,
    max_body_bytes: int | None = None,
    cost_per_minute: int | None = None,
    unset: Iterable[Literal["rpm", "renew_interval_ms", "upstream", "cost_per_minute"]] = (),
) -> Op[PoolInfo]:
    """Change only the given fields of pool `name`'s configuration (admin; PATCH);
    `unset` clears `rpm` (no rate), `renew_interval_ms` (back to term / 3),
    `upstream` (no proxy mode) or `cost_per_minute` (no configured unit budget).
    An `upstream` changes only the parts it gives (its `headers`, when given,
    replace the whole set). Raises `NotFound` when there is no such pool;
    returns its configuration and live state."""
    fields = {
        "limit": limit, "queue_size": queue_size, "queue_timeout_ms": queue_timeout_ms,
        "term_ms": term_ms, "renew_interval_ms": renew_interval_ms,
        "request_timeout_ms": request_timeout_ms, "rpm": rpm, "adaptive": adaptive,
        "min_limit": min_limit, "max_body_bytes": max_body_bytes,
        "cost_per_minute": cost_per_minute,
        "upstream": None if upstream is None else upstream.as_json(),
    }
    body: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    body.update({field: None for field in unset})
    return _one(Call("PATCH", _pool_path(name), decode_as(PoolInfo), body=body))


def get_pool(name: str) -> Op[PoolInfo]:
    """Pool `name`'s configuration and live state (`in_use`, `queued`, ...)."""
    return _one(Call("GET", _pool_path(name), decode_as(PoolInfo)))


def _decode_slots(reply: Reply) -> list[SlotHolder]:
    return parse_body(reply, SlotList).slots


def list_slots(pool: str) -> Op[list[SlotHolder]]:
    """Who holds pool `pool`'s live slots, oldest first (only a prefix of each
    slot id). Raises `NotFound` when there is no such pool."""
    return _one(Call("GET", f"{_pool_path(pool)}/slots", _decode_slots))


def list_pools(
    *, prefix: str | None = None, limit: int | None = None, after: str | None = None
) -> Op[PoolPage]:
    """One page of the project's pools, sorted by name."""
    return _one(Call("GET", "/v1/pools", decode_as(PoolPage),
                     params=_list_params(prefix, limit, after)))


def delete_pool(name: str) -> Op[bool]:
    """Delete pool `name` (admin): its slots end and its waiters are refused.
    Raises `NotFound` when there is no such pool."""
    return _one(Call("DELETE", _pool_path(name), decode_flag("deleted")))


def acquire_slot_call(pool: str, *, wait: float = 0, no_queue: bool = False,
                      session_id: str | None = None, cost: int | None = None,
                      ) -> Call[SlotGrant]:
    headers = {"X-No-Queue": "1"} if no_queue else {}
    body: dict[str, Any] = {} if session_id is None else {"session_id": session_id}
    if cost is not None:
        body["cost"] = cost
    wait_spec = None
    if wait > 0:
        wait_spec = Wait(time.monotonic() + wait, "wait_ms", in_ms=True, cap_s=math.inf)

    def decode(reply: Reply) -> SlotGrant:
        grant = parse_body(reply, SlotGrant)
        return msgspec.structs.replace(
            grant,
            pool=pool,
            remaining_slots=header_int(reply.headers, "x-remaining-slots"),
            effective_limit=header_int(reply.headers, "x-effective-limit"),
            queued_ms=header_int(reply.headers, "x-queued-ms"),
            remaining_cost=header_int(reply.headers, "x-remaining-cost"),
        )

    # Not idempotent: a retry after a lost answer would take a second slot, so it
    # is retried only when the first attempt surely never reached the server.
    return Call("POST", f"{_pool_path(pool)}/lock/acquire", decode, body=body,
                headers=headers, wait=wait_spec, idempotent=False)


def acquire_slot(pool: str, *, wait: float = 0, no_queue: bool = False,
                 session_id: str | None = None, cost: int | None = None) -> Op[SlotGrant]:
    """Take a slot in `pool`, waiting in line up to `wait` seconds (clamped by the
    pool's `queue_timeout_ms`). Raises `TooManyRequests` when no slot is free and
    no wait was asked (or the queue is full), `QueueTimeout` when the wait ran out.
    With `session_id` the slot follows that session (see `create_session`).
    `cost`: the units (tokens) the call will spend of the pool's budget (SPEC
    §4.6; without it, the pool's average). You usually want `slot()` instead:
    it renews and releases for you."""
    return _one(acquire_slot_call(pool, wait=wait, no_queue=no_queue, session_id=session_id,
                                  cost=cost))


def renew_slot_call(pool: str, slot_id: str, *, retry: bool = True,
                    timeout: float | None = None) -> Call[SlotRenewal]:
    return Call("POST", f"{_pool_path(pool)}/lock/{id_segment(slot_id)}/renew",
                decode_as(SlotRenewal), retry=retry, timeout=timeout, renews=True)


def renew_slot(pool: str, slot_id: str) -> Op[SlotRenewal]:
    """Extend slot `slot_id` by the pool's term. Raises `NotFound` when the slot is
    gone, `Capped` when it is at its request deadline."""
    return _one(renew_slot_call(pool, slot_id))


def release_slot_call(pool: str, slot_id: str, outcome: Outcome | None = None) -> Call[bool]:
    body = outcome.to_body() if outcome is not None else None
    return Call("POST", f"{_pool_path(pool)}/lock/{id_segment(slot_id)}/release",
                decode_flag("released"), body=body or None)


def release_slot(pool: str, slot_id: str, outcome: Outcome | None = None) -> Op[bool]:
    """Release slot `slot_id`, reporting the upstream `outcome` if given. True when
    the slot was held, False when it was already gone (idempotent)."""
    return _one(release_slot_call(pool, slot_id, outcome))


# --- sessions (SPEC §3.10) --------------------------------------------------------


def _session_path(session_id: str) -> str:
    return f"/v1/sessions/{id_segment(session_id)}"


def create_session(ttl: int, *, name: str | None = None) -> Op[SessionGrant]:
    """Start a session of `ttl` seconds (5..3600): leases and slots acquired with
    its `session_id` follow its expiry, so one renewal keeps them all. You
    usually want `session()` instead: it renews, and ends it on exit."""
    body: dict[str, Any] = {"ttl_seconds": ttl}
    if name is not None:
        body["name"] = name
    # Not idempotent: a retry after a lost answer would start a second session
    # (the lost one holds nothing and expires by itself).
    return _one(Call("POST", "/v1/sessions", decode_as(SessionGrant), body=body,
                     idempotent=False))


def renew_session_call(session_id: str, ttl: int, *, retry: bool = True,
                       timeout: float | None = None) -> Call[SessionGrant]:
    return Call("PATCH", _session_path(session_id), decode_as(SessionGrant),
                body={"ttl_seconds": ttl}, retry=retry, timeout=timeout, renews=True)


def renew_session(session_id: str, *, ttl: int) -> Op[SessionGrant]:
    """Renew the session, and with it every lease and slot attached: it now
    expires `ttl` seconds from when the server handles this. Raises
    `SessionLost` once it has ended, `SessionExpired` when the renewal came
    within its last second."""
    return _one(renew_session_call(session_id, ttl))


def end_session(session_id: str) -> Op[SessionEnd]:
    """End the session and every lease and slot attached (idempotent: `ended`
    is False when it had already ended)."""
    return _one(Call("DELETE", _session_path(session_id), decode_as(SessionEnd)))


def get_session(session_id: str) -> Op[SessionInfo]:
    """The session and the locks and pools it holds."""
    return _one(Call("GET", _session_path(session_id), decode_as(SessionInfo)))


# --- keys and identity (SPEC §5) ------------------------------------------------


def create_key(
    role: Role,
    *,
    name: str | None = None,
    expires_in: int | None = None,
    allow_ips: Iterable[str] | None = None,
    rpm_quota: int | None = None,
) -> Op[CreatedKey]:
    """Create an API key in this key's project (admin). `expires_in` is in
    seconds. The secret (`CreatedKey.key`) is shown only in this answer."""
    body: dict[str, Any] = {"role": role}
    if name is not None:
        body["name"] = name
    if expires_in is not None:
        body["expires_in_seconds"] = expires_in
    if allow_ips is not None:
        body["allow_ips"] = list(allow_ips)
    if rpm_quota is not None:
        body["rpm_quota"] = rpm_quota
    # Not idempotent: a retry after a lost answer would make a second key.
    return _one(Call("POST", "/v1/keys", decode_as(CreatedKey), body=body, idempotent=False))


def _decode_key_page(reply: Reply) -> tuple[list[KeyInfo], str | None]:
    body = parse_json(reply)
    if not isinstance(body, dict) or not isinstance(body.get("keys"), list):
        raise UnexpectedResponse("The server's key list has no 'keys'.", status=reply.status)
    following = body.get("next")
    try:
        keys = msgspec.convert(body["keys"], list[KeyInfo], strict=False)
    except msgspec.ValidationError as exc:
        raise UnexpectedResponse(f"The server's key list could not be read: {exc}.",
                                 status=reply.status) from None
    return keys, following if isinstance(following, str) else None


# Keys asked for per page while listing them all.
_KEYS_PER_PAGE = 1000


def list_keys() -> Op[list[KeyInfo]]:
    """The project's API keys, without secrets (admin), every page of them."""
    keys: list[KeyInfo] = []
    after: str | None = None
    while True:
        params = {"limit": str(_KEYS_PER_PAGE), **({"after": after} if after else {})}
        page, after = yield Call("GET", "/v1/keys", _decode_key_page, params=params)
        keys += page
        if after is None:
            return keys


def revoke_key(key_id: str) -> Op[bool]:
    """Revoke key `key_id` (admin); refused everywhere within 2 s. Raises `NotFound`
    for an unknown ID."""
    return _one(Call("DELETE", f"/v1/keys/{id_segment(key_id)}", decode_flag("revoked")))


def retire_key(key_id: str) -> Op[bool]:
    """Retire key `key_id` (an admin of the project, or the key itself): it stops
    working, the keys refreshed from it do not (a planned rotation; revoke a
    leaked key instead). True when it is retired (now or before), False when
    it was revoked already. Raises `NotFound` for an ID the project does not
    have, `Forbidden` for another key when this one is not an admin."""
    # Retried like any idempotent call: retiring twice is retiring once.
    return _one(Call("POST", f"/v1/keys/{id_segment(key_id)}/retire", decode_flag("retired")))


def refresh_key(expires_in: int | None = None, retire_previous: bool = False) -> Op[CreatedKey]:
    """Mint a successor of this client's own API key, with its role, name,
    allowlist and quota, expiring `expires_in` seconds from now (default: this
    key's own lifetime; never longer than an admin granted the original). This
    key keeps working until its own expiry, unless `retire_previous`: then it
    is retired in the same store operation (never both keys working, or
    neither), and this client's next calls with it are refused. Revoking it
    revokes the successor. The client goes on using its own key: pass the new
    `key` to a new client, or use `on_key_refresh=` to have the client refresh
    and swap by itself."""
    body: dict[str, Any] | None = None
    if expires_in is not None or retire_previous:
        body = {**({"expires_in_seconds": expires_in} if expires_in is not None else {}),
                **({"retire_previous": True} if retire_previous else {})}
    # Not retried: an attempt whose answer was lost may have minted a key, and a
    # retry would mint another (both die with the chain, but why leave one about).
    return _one(Call("POST", "/v1/keys/refresh", decode_as(CreatedKey), body=body, retry=False))


def whoami() -> Op[WhoAmI]:
    """This key's project, ID and role."""
    return _one(Call("GET", "/v1/whoami", decode_as(WhoAmI)))


def health() -> Op[Health]:
    """The server's health (no key needed)."""
    return _one(Call("GET", "/healthz", decode_as(Health)))
