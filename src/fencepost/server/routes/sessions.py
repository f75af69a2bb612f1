"""Session routes (SPEC §3.10): create, renew, end and inspect a session. A
session is its key's: every other key gets 404, as for one that never existed."""

from __future__ import annotations

import re

from fencepost.core.keys import Role
from fencepost.core.sessions import SESSION_ID_PATTERN, Session, end_of
from fencepost.core.timefmt import MS_PER_SECOND, format_at
from fencepost.errors import NotFound, SessionExpired, SessionLost
from fencepost.events import SessionChanged, current_origin
from fencepost.server import schemas
from fencepost.server.context import endpoint, services
from fencepost.server.http import json_response
from fencepost.server.listing import no_query
from fencepost.server.messages import Request, Response
from fencepost.server.validation import decode_body
from fencepost.store.base import SessionView


def session_grant(session: Session) -> schemas.SessionGrant:
    return schemas.SessionGrant(
        session_id=session.session_id,
        name=session.name,
        ttl_seconds=session.ttl_ms // MS_PER_SECOND,
        expires_at=format_at(session.expires_ms) or "",
    )


def session_state(view: SessionView) -> schemas.SessionState:
    session = view.session
    reason = end_of(session, view.now_ms)  # expired counts before the reaper records it
    return schemas.SessionState(
        session_id=session.session_id,
        name=session.name,
        ttl_seconds=session.ttl_ms // MS_PER_SECOND,
        created_at=format_at(session.created_ms) or "",
        expires_at=format_at(session.expires_ms) or "",
        live=reason is None,
        ended=None if reason is None else reason.value,
        ended_at=None if reason is None else format_at(session.ended_ms or session.expires_ms),
        keys=view.keys,
        leases=view.leases,
        pools=[schemas.SessionPool(pool=pool, slots=count) for pool, count in view.pools],
        slots=view.slots,
    )


_SESSION_ID = re.compile(SESSION_ID_PATTERN)


def _session_id(request: Request) -> str:
    # An id that cannot be one is simply not found: nothing says which ids exist.
    session_id = str(request.path_params["session_id"])
    if _SESSION_ID.fullmatch(session_id) is None:
        raise NotFound("No such session.")
    return session_id


@endpoint
async def create(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.MEMBER)
    body = decode_body(request.body, schemas.CreateSessionBody)
    session = await svc.store.create_session(
        principal.project, principal.key_id, body.ttl_seconds, body.name
    )
    return json_response(201, session_grant(session))


@endpoint
async def renew(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.MEMBER)
    session_id = _session_id(request)
    body = decode_body(request.body, schemas.RenewSessionBody)
    try:
        session = await svc.store.renew_session(
            principal.project, principal.key_id, session_id, body.ttl_seconds
        )
    except (SessionLost, SessionExpired) as lost:
        # The holder learns it lost everything attached (no session id: a capability).
        svc.events.emit(SessionChanged(
            "lost", principal.project, lost.reason or lost.code, current_origin()
        ))
        raise
    return json_response(200, session_grant(session))


@endpoint
async def end(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.MEMBER)
    ended = await svc.store.end_session(principal.project, principal.key_id, _session_id(request))
    return json_response(
        200, schemas.SessionEnded(ended=ended.ended, leases=ended.leases, slots=ended.slots)
    )


@endpoint
async def inspect(request: Request) -> Response:
    svc = services(request)
    principal = await svc.auth.authenticate(request, Role.READER)
    no_query(request)
    view = await svc.store.get_session(principal.project, principal.key_id, _session_id(request))
    return json_response(200, session_state(view))
