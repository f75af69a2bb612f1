"""Key routes (SPEC §5): create, list, revoke, retire, refresh, whoami."""

from __future__ import annotations

from fencepost.core.keys import Role, parse_networks
from fencepost.core.timefmt import format_at
from fencepost.errors import Forbidden, NotFound
from fencepost.server import schemas
from fencepost.server.context import Call
from fencepost.server.http import json_response
from fencepost.server.listing import one_page
from fencepost.server.messages import Response
from fencepost.server.validation import invalid_field
from fencepost.store.base import KeyRecord, NewKey


def _state(record: KeyRecord, now_ms: int) -> str:
    if record.revoked_ms is not None:
        return "revoked"
    if record.retired_ms is not None:
        return "retired"
    if record.expires_ms is not None and record.expires_ms <= now_ms:
        return "expired"
    return "active"


def key_info(record: KeyRecord, now_ms: int | None = None) -> schemas.KeyInfo:
    return schemas.KeyInfo(
        id=record.id,
        role=record.role.label,  # type: ignore[arg-type]
        name=record.name,
        project=record.project,
        expires_at=format_at(record.expires_ms),
        allow_ips=record.allow_ips,
        rpm_quota=record.rpm_quota,
        created_at=format_at(record.created_ms) or "",
        revoked_at=format_at(record.revoked_ms),
        refreshed_from=record.parent_id,
        state=_state(record, now_ms) if now_ms is not None else "active",  # type: ignore[arg-type]
    )


async def create_key(call: Call[schemas.CreateKeyBody]) -> Response:
    body = call.body
    allow_ips = body.allow_ips or []
    try:
        networks = parse_networks(allow_ips)
    except ValueError as exc:
        raise invalid_field("allow_ips", str(exc)) from None
    new = NewKey(
        role=Role.parse(body.role),
        name=body.name,
        expires_in_ms=None if body.expires_in_seconds is None else body.expires_in_seconds * 1000,
        allow_ips=[str(net) for net in networks],
        rpm_quota=body.rpm_quota,
    )
    record, secret = await call.services.store.create_key(call.caller.project, new)
    return _created(record, secret)


def _created(record: KeyRecord, secret: str) -> Response:
    info = key_info(record)
    return json_response(
        201,
        schemas.CreatedKey(
            id=info.id, key=secret, role=info.role, name=info.name, project=info.project,
            expires_at=info.expires_at, allow_ips=info.allow_ips, rpm_quota=info.rpm_quota,
            created_at=info.created_at,
        ),
    )


async def refresh_key(call: Call[schemas.RefreshKeyBody | None]) -> Response:
    """POST /v1/keys/refresh: the caller's own key mints its successor; the
    caller's key keeps working until its own expiry."""
    svc, caller = call.services, call.caller
    if caller.from_token:
        raise Forbidden("A caller from an identity provider has no API key to refresh; "
                        "the identity provider issues its next token.")
    expires_in_ms = None
    if call.body is not None and call.body.expires_in_seconds is not None:
        expires_in_ms = call.body.expires_in_seconds * 1000
    retire = call.body is not None and call.body.retire_previous
    record, secret = await svc.store.refresh_key(caller.key_id, expires_in_ms, retire)
    if retire:
        svc.auth.forget(caller.key_id)  # refused here at once, elsewhere within 2 s
    svc.access_log.write(
        "key.refresh", project=caller.project, key_id=caller.key_id,
        new_key_id=record.id, request_id=call.request_id,
        **({"retired_key_id": caller.key_id} if retire else {}),
    )
    return _created(record, secret)


async def retire_key(call: Call[None]) -> Response:
    """POST /v1/keys/{id}/retire: an admin of the project, or the key itself,
    ends the key and leaves its successors working (SPEC §5)."""
    svc, caller, key_id = call.services, call.caller, call.params["id"]
    record = await svc.store.retire_key(caller.project, key_id, caller.key_id,
                                        caller.role is Role.ADMIN)
    if record is None:
        raise NotFound("This project has no key with that ID.")
    svc.auth.forget(key_id)  # refused here at once, elsewhere within 2 s
    svc.access_log.write(
        "key.retire", project=caller.project, key_id=caller.key_id, retired_key_id=key_id,
        request_id=call.request_id,
    )
    state = _state(record, await svc.store.now_ms())
    return json_response(200, schemas.Retired(
        id=key_id, retired=record.revoked_ms is None,
        state=state,  # type: ignore[arg-type]
    ))


async def list_keys(call: Call[None]) -> Response:
    store, project = call.services.store, call.caller.project
    now_ms = await store.now_ms()
    return await one_page(
        call.request, call.services.lists,
        lambda _, after, count: store.list_keys(project, after, count),
        lambda record: record.id,
        lambda records, cursor: json_response(200, schemas.KeyList(
            keys=[key_info(r, now_ms) for r in records], next=cursor)),
        allowed=_KEY_LIST_PARAMS,
    )


_KEY_LIST_PARAMS = frozenset({"limit", "after"})


async def revoke_key(call: Call[None]) -> Response:
    svc, key_id = call.services, call.params["id"]
    if not await svc.store.revoke_key(call.caller.project, key_id):
        raise NotFound("This project has no key with that ID.")
    svc.auth.forget(key_id)
    return json_response(200, schemas.Revoked(revoked=True))


async def whoami(call: Call[None]) -> Response:
    caller = call.caller
    return json_response(
        200,
        schemas.WhoAmI(
            project=caller.project, key_id=caller.key_id,
            role=caller.role.label,  # type: ignore[arg-type]
            expires_at=format_at(caller.expires_ms),
            key_name=caller.key_name if caller.from_token else None,
            via="jwt" if caller.from_token else "key",
            app_key_id=caller.app_key_id,
        ),
    )
