"""Session routes (SPEC §3.10): create, renew, end and inspect a session. A
session is its key's: every other key gets 404, as for one that never existed.
The route table checks the role, the id's form (a malformed id is not found)
and the body before a handler runs."""

from __future__ import annotations

from fencepost.core.sessions import Session, end_of
from fencepost.core.timefmt import MS_PER_SECOND, format_at
from fencepost.errors import SessionExpired, SessionLost
from fencepost.events import SessionChanged, current_origin
from fencepost.server import schemas
from fencepost.server.context import Call
from fencepost.server.http import json_response
from fencepost.server.listing import no_query
from fencepost.server.messages import Response
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


async def create(call: Call[schemas.CreateSessionBody]) -> Response:
    caller, body = call.caller, call.body
    session = await call.services.store.create_session(
        caller.project, caller.key_id, body.ttl_seconds, body.name,
        lineage=caller.lineage or caller.key_id,
    )
    return json_response(201, session_grant(session))


async def renew(call: Call[schemas.RenewSessionBody]) -> Response:
    svc, caller = call.services, call.caller
    try:
        session = await svc.store.renew_session(
            caller.project, caller.key_id, call.params["session_id"], call.body.ttl_seconds
        )
    except (SessionLost, SessionExpired) as lost:
        # The holder learns it lost everything attached (no session id: a capability).
        svc.events.emit(SessionChanged(
            "lost", caller.project, lost.reason or lost.code, current_origin()
        ))
        raise
    return json_response(200, session_grant(session))


async def end(call: Call[None]) -> Response:
    caller = call.caller
    ended = await call.services.store.end_session(
        caller.project, caller.key_id, call.params["session_id"]
    )
    return json_response(
        200, schemas.SessionEnded(ended=ended.ended, leases=ended.leases, slots=ended.slots)
    )


async def inspect(call: Call[None]) -> Response:
    caller = call.caller
    no_query(call.request)
    view = await call.services.store.get_session(
        caller.project, caller.key_id, call.params["session_id"]
    )
    return json_response(200, session_state(view))
