"""Session rules (SPEC §3.10): one heartbeat for many leases and slots.

A session has a TTL like a lease and is renewed like one (set outright, never
inside its last second). Leases and slots attached to it have no expiry of
their own: their expiry is kept equal to the session's (capped by their own
absolute deadlines), so that every existing rule about expiry, reaping,
inspection and fence checks applies to them unchanged.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from enum import StrEnum

from fencepost.core.leases import RENEW_MARGIN_MS
from fencepost.core.timefmt import MS_PER_SECOND
from fencepost.errors import SessionExpired, SessionLost

SESSION_TTL_MIN_SECONDS = 5
SESSION_TTL_MAX_SECONDS = 3600
# "ses_" and 32 URL-safe characters: 192 random bits, since whoever knows a
# session id of its own key may attach to it and end it.
# Live sessions one key's lineage (the key and every key refreshed from it,
# SPEC §5) may hold at once: a member key cannot fill the store with
# sessions, not even by refreshing itself into many keys, and a process needs
# one session, not many.
MAX_LIVE_SESSIONS = 1_000
SESSION_ID_PREFIX = "ses_"
SESSION_ID_PATTERN = "^ses_[A-Za-z0-9_-]{16,64}$"


class SessionEnd(StrEnum):
    """Why a session ended, which is also why its leases and slots ended."""

    EXPIRED = "session_expired"  # nobody renewed it in time
    ENDED = "session_ended"  # its holder deleted it


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    name: str | None
    ttl_ms: int
    created_ms: int
    expires_ms: int
    key_id: str | None  # the API key that made it
    ended: SessionEnd | None = None  # recorded once it ended (deleted, or reaped)
    ended_ms: int | None = None


def new_session_id() -> str:
    return SESSION_ID_PREFIX + secrets.token_urlsafe(24)


def new_session(
    session_id: str, name: str | None, ttl_seconds: int, key_id: str | None, now_ms: int
) -> Session:
    ttl_ms = ttl_seconds * MS_PER_SECOND
    return Session(session_id, name, ttl_ms, now_ms, now_ms + ttl_ms, key_id)


def end_of(session: Session, now_ms: int) -> SessionEnd | None:
    """Why the session is over at `now_ms`, or None while it is live. A session
    past its expiry is over even before the reaper records it."""
    if session.ended is not None:
        return session.ended
    if now_ms >= session.expires_ms:
        return SessionEnd.EXPIRED
    return None


def lost_error(reason: SessionEnd) -> SessionLost:
    said = "nobody renewed it in time" if reason is SessionEnd.EXPIRED else "it was ended"
    return SessionLost(
        f"The session has ended ({said}); its leases and slots ended with it.",
        reason=reason.value,
    )


def require_live(session: Session, now_ms: int) -> Session:
    """The session, if leases and slots may attach to it now; else SessionLost."""
    reason = end_of(session, now_ms)
    if reason is not None:
        raise lost_error(reason)
    return session


def decide_renew(session: Session, ttl_seconds: int, now_ms: int) -> Session:
    """The renewed session (expiry set outright to now + TTL), or raise
    SessionLost / SessionExpired by the lease rules of SPEC §3.2: a renewal
    must arrive more than one second before the expiry (clock-skew margin)."""
    require_live(session, now_ms)
    if now_ms >= session.expires_ms - RENEW_MARGIN_MS:
        raise SessionExpired(expires_in_ms=session.expires_ms - now_ms)
    ttl_ms = ttl_seconds * MS_PER_SECOND
    return replace(session, ttl_ms=ttl_ms, expires_ms=now_ms + ttl_ms)


def attached_expiry_ms(session_expires_ms: int, own_deadline_ms: int) -> int:
    """An attached lease's or slot's expiry: its session's, never past its own
    absolute deadline (a lease's 90 days, a slot's request deadline)."""
    return min(session_expires_ms, own_deadline_ms)
