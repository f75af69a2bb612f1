"""Key routes (SPEC §5): create, list, revoke, refresh, whoami."""

from __future__ import annotations

from fencepost.core.keys import Role, parse_networks
from fencepost.core.timefmt import format_at
from fencepost.errors import NotFound
from fencepost.server import schemas
from fencepost.server.context import endpoint, request_id, services
from fencepost.server.http import json_response
from fencepost.server.messages import Request, Response
from fencepost.server.validation import decode_body, invalid_field
from fencepost.store.base import KeyRecord, NewKey


def key_info(record: KeyRecord) -> schemas.KeyInfo:
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
    )


@endpoint
async def create_key(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.ADMIN)
    body = decode_body(request.body, schemas.CreateKeyBody)
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
    record, secret = await svc.store.create_key(principal.project, new)
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


@endpoint
async def refresh_key(request: Request) -> Response:
    """POST /v1/keys/refresh: the caller's own key mints its successor; the
    caller's key keeps working until its own expiry."""
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.READER)
    expires_in_ms = None
    if request.body.strip():
        body = decode_body(request.body, schemas.RefreshKeyBody)
        if body.expires_in_seconds is not None:
            expires_in_ms = body.expires_in_seconds * 1000
    record, secret = await svc.store.refresh_key(principal.key_id, expires_in_ms)
    svc.access_log.write(
        "key.refresh", project=principal.project, key_id=principal.key_id,
        new_key_id=record.id, request_id=request_id(request),
    )
    return _created(record, secret)


@endpoint
async def list_keys(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.ADMIN)
    records = await svc.store.list_keys(principal.project)
    return json_response(200, schemas.KeyList(keys=[key_info(r) for r in records]))


@endpoint
async def revoke_key(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.ADMIN)
    key_id = str(request.path_params["id"])
    if len(key_id) > 64 or not await svc.store.revoke_key(principal.project, key_id):
        raise NotFound("This project has no key with that ID.")
    svc.auth.forget(key_id)
    return json_response(200, schemas.Revoked(revoked=True))


@endpoint
async def whoami(request: Request) -> Response:
    principal = await services(request).auth.authenticate(request, Role.READER)
    return json_response(
        200,
        schemas.WhoAmI(
            project=principal.project, key_id=principal.key_id,
            role=principal.role.label,  # type: ignore[arg-type]
            expires_at=format_at(principal.expires_ms),
        ),
    )
