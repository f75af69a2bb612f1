"""Session statements (SPEC §3.10; portable SQL, `?` placeholders).

A session row says when the session expires; the leases and slots attached to
it carry the same expiry in their own rows (locks.follow_session and
pools.follow_session keep them equal in the transaction that renews the
session), so the existing expiry, reaping, views and fence checks hold for
them unchanged. Ending a session ends what is attached in the same
transaction. Every lookup is by the session id *and* its owner: another key's
session is not found, exactly like one that does not exist.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from fencepost.core import sessions as rules
from fencepost.core.leases import AcquireRequest
from fencepost.core.sessions import Session, SessionEnd
from fencepost.errors import NotFound, SessionExpired, SessionLost, TooManySessions
from fencepost.events import SessionChanged
from fencepost.store.batch import Key, Keys, Refused, Tx, refused_before_writing
from fencepost.store.sql.bounded import delete_oldest
from fencepost.store.sql.rows import columns

KIND = "session"


def key_of(project: str, session_id: str | None) -> Keys:
    """The key of a session (see batch.py), declared by every operation that
    reads it to decide and writes by it: attaching, renewing, ending. None
    (no session): no key."""
    return () if session_id is None else (Key(KIND, project, session_id),)


def attached_keys(tx: Tx, project: str, session_id: str) -> list[Key]:
    """The key of every lock and pool something attached to the session holds
    (an attached lease or slot is in its session's project). The kinds are
    locks.KIND and pools.KIND (which import this module)."""
    rows = tx.execute(
        "SELECT DISTINCT 'lock', key FROM locks WHERE session_id = ? "
        "UNION SELECT DISTINCT 'pool', pool FROM slots WHERE session_id = ?",
        (session_id, session_id),
    ).fetchall()
    return sorted(Key(kind, project, name) for kind, name in rows)


class _SessionRow(NamedTuple):
    """A `sessions` row's columns as Session reads them (see rows.py)."""

    id: str
    name: str | None
    ttl_ms: int
    created_ms: int
    expires_ms: int
    key_id: str | None
    ended_reason: str | None
    ended_ms: int | None


_COLUMNS = columns(_SessionRow)
# The first key of a key's refresh chain (SPEC §5): the session's owner. A key
# the store does not know owns only its own sessions.
_ROOT_OF = "COALESCE((SELECT COALESCE(root_id, id) FROM api_keys WHERE id = ?), ?)"
_OWNED = f"project = ? AND id = ? AND owner_root = {_ROOT_OF}"


def _session(row: Any) -> Session:
    r = _SessionRow._make(row)
    return Session(
        session_id=r.id, name=r.name, ttl_ms=int(r.ttl_ms), created_ms=int(r.created_ms),
        expires_ms=int(r.expires_ms), key_id=r.key_id,
        ended=None if r.ended_reason is None else SessionEnd(r.ended_reason),
        ended_ms=None if r.ended_ms is None else int(r.ended_ms),
    )


def create(
    tx: Tx, project: str, key_id: str, ttl_seconds: int, name: str | None
) -> Session | Refused:
    """A new session of `key_id`'s, unless the key's lineage (the first key of
    its refresh chain and every key refreshed from it) holds MAX_LIVE_SESSIONS
    live ones already (Refused, read before anything is written, with when
    the soonest of them expires as the time to retry)."""
    live, soonest = tx.execute(
        "SELECT count(*), min(expires_ms) FROM sessions "
        f"WHERE owner_root = {_ROOT_OF} AND ended_reason IS NULL AND expires_ms > ?",
        (key_id, key_id, tx.now_ms),
    ).fetchone()
    if live >= rules.MAX_LIVE_SESSIONS:
        return Refused(TooManySessions(
            f"This key and the keys refreshed from the same first key hold {live} live "
            f"sessions, the most they may together; end one (DELETE /v1/sessions/{{id}}) "
            f"or let one expire.",
            retry_after_ms=max(0, int(soonest) - tx.now_ms),
        ))
    session = rules.new_session(rules.new_session_id(), name, ttl_seconds, key_id, tx.now_ms)
    tx.execute(
        "INSERT INTO sessions (id, project, key_id, owner_root, name, ttl_ms, created_ms, "
        f"expires_ms) VALUES (?, ?, ?, {_ROOT_OF}, ?, ?, ?, ?)",
        (session.session_id, project, key_id, key_id, key_id, name, session.ttl_ms,
         session.created_ms, session.expires_ms),
    )
    tx.events.append(SessionChanged("started", project, None, tx.origin))
    return session


def load(tx: Tx, project: str, session_id: str, key_id: str | None) -> Session:
    """The caller's session (live or ended, while its end is remembered);
    NotFound for an unknown session and for another key's."""
    row = tx.execute(
        f"SELECT {_COLUMNS} FROM sessions WHERE {_OWNED}",
        (project, session_id, key_id, key_id),
    ).fetchone()
    if row is None:
        raise NotFound("No such session (it never existed, was forgotten, or is another key's).")
    return _session(row)


def attach(tx: Tx, project: str, request: AcquireRequest) -> AcquireRequest:
    """The acquire with its session's expiry filled in, once the session is
    found live and the caller's (else NotFound, or SessionLost with why)."""
    assert request.session_id is not None
    session = rules.require_live(
        load(tx, project, request.session_id, request.key_id), tx.now_ms
    )
    return replace(request, session_expires_ms=session.expires_ms)


def live(tx: Tx, project: str, session_id: str, key_id: str | None) -> Session:
    """The caller's session if things may attach to it now."""
    return rules.require_live(load(tx, project, session_id, key_id), tx.now_ms)


def renew(
    tx: Tx, project: str, session_id: str, key_id: str, ttl_seconds: int
) -> Session | Refused:
    """Set the session's expiry outright (SPEC §3.2's rules); the caller then
    moves the attached leases and slots with it, in the same transaction. An
    unknown or foreign session (NotFound), or one the rules will not renew
    (SessionLost, SessionExpired), is Refused: the caller writes nothing
    before, and this reads until the rules decide."""
    renewed = refused_before_writing(
        lambda: rules.decide_renew(load(tx, project, session_id, key_id), ttl_seconds, tx.now_ms),
        NotFound, SessionLost, SessionExpired,
    )
    if isinstance(renewed, Refused):
        return renewed
    # Contract: only a session not yet ended moves (the rules judged it live
    # by this transaction's clock; the batch lock keeps it so until commit).
    tx.execute(
        "UPDATE sessions SET ttl_ms = ?, expires_ms = ? WHERE id = ? AND ended_reason IS NULL",
        (renewed.ttl_ms, renewed.expires_ms, session_id),
    )
    return renewed


def mark_ended(tx: Tx, project: str, session_id: str, key_id: str) -> bool | Refused:
    """Record that the holder ended its session; False when it had already
    ended (deleted, or expired whether or not the reaper has seen it yet). An
    unknown or foreign session is Refused (NotFound): the caller writes
    nothing before, and this reads it first."""
    session = refused_before_writing(lambda: load(tx, project, session_id, key_id), NotFound)
    if isinstance(session, Refused):
        return session
    if rules.end_of(session, tx.now_ms) is not None:
        return False
    tx.execute(
        "UPDATE sessions SET ended_reason = ?, ended_ms = ? WHERE id = ?",
        (SessionEnd.ENDED.value, tx.now_ms, session_id),
    )
    return True


def reap(tx: Tx, bound: int) -> tuple[int, bool]:
    """Record the end of the sessions past their expiry, at most `bound` of
    them, soonest expired first (their leases and slots die at the same
    instant and are reaped with the others); return how many ended and whether
    the bound was reached.

    Contract: only sessions not yet ended are marked, so running it twice, or
    on two replicas at once, ends nothing twice."""
    expired = tx.execute(
        "UPDATE sessions SET ended_reason = ?, ended_ms = expires_ms WHERE id IN ("
        "SELECT id FROM sessions WHERE ended_reason IS NULL AND expires_ms <= ? "
        "ORDER BY expires_ms LIMIT ?) RETURNING project",
        (SessionEnd.EXPIRED.value, tx.now_ms, bound),
    ).fetchall()
    for (project,) in expired:
        tx.events.append(SessionChanged("ended", project, SessionEnd.EXPIRED.value, None))
    return len(expired), len(expired) >= bound


def forget(tx: Tx, before_ms: int, bound: int) -> bool:
    """Forget at most `bound` sessions that ended before `before_ms` (then their
    ids are simply not found); True when the bound was reached."""
    # ended_ms < before_ms; a live session's ended_ms is NULL and never matches.
    _, more = delete_oldest(tx, "sessions", "id", "ended_ms", before_ms - 1, bound, "id")
    return more


def count_live(tx: Tx) -> int:
    (count,) = tx.execute(
        "SELECT COUNT(*) FROM sessions WHERE ended_reason IS NULL AND expires_ms > ?",
        (tx.now_ms,),
    ).fetchone()
    return int(count)


def count_slots(tx: Tx, session_id: str) -> int:
    (count,) = tx.execute(
        "SELECT COUNT(*) FROM slots WHERE session_id = ? AND lease_deadline_ms > ?",
        (session_id, tx.now_ms),
    ).fetchone()
    return int(count)
