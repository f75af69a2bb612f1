"""Lease rules for locks (SPEC §3), as pure functions of the current lease and `now`.

Every instant is Unix epoch milliseconds. The store reads the lock row, asks
these functions what to do, and writes the answer in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Callable

from fencepost.core.timefmt import MS_PER_DAY, MS_PER_SECOND
from fencepost.errors import LeaseExpired, LeaseLost, LockHeld

TTL_MIN_SECONDS = 5
TTL_MAX_SECONDS = 7_776_000  # 90 days
# Absolute life of one acquisition: renewals can never push a lease past it.
LEASE_LIFETIME_MS = 90 * MS_PER_DAY
# Renewals must arrive more than this long before expires_at. The margin absorbs
# clock skew between replicas and the client so an expired lease is never resurrected.
RENEW_MARGIN_MS = 1000
# Lock delay (SPEC §3.9): after a lease ends by expiry or force release, nobody
# is granted the lock for up to this long, so a paused holder's writes in
# flight land before the next holder starts.
LOCK_DELAY_MAX_SECONDS = 60
LOCK_DELAY_REASON = "lock_delay"


class OnExpiry(StrEnum):
    RELEASE = "release"
    KEEP = "keep"


class EndReason(StrEnum):
    EXPIRED = "expired"
    RELEASED = "released"
    FORCE_RELEASED = "force_released"
    SUPERSEDED = "superseded"
    # A lease attached to a session (SPEC §3.10) ends with it.
    SESSION_EXPIRED = "session_expired"
    SESSION_ENDED = "session_ended"


# Ends the holder itself asked for, reported as they are even when the lock is
# held by someone else since.
_OWN_ENDS = (EndReason.RELEASED, EndReason.FORCE_RELEASED, EndReason.SESSION_ENDED)
# Ends by running out of time: they start a lock delay (SPEC §3.9).
_TIMED_OUT = (EndReason.EXPIRED, EndReason.SESSION_EXPIRED)


@dataclass(frozen=True, slots=True)
class Lease:
    key: str
    lock_token: str
    fencing_token: int
    acquired_ms: int
    expires_ms: int
    deadline_ms: int
    operation: str | None
    metadata_json: str | None
    on_expiry: OnExpiry
    # The API key that took the lease (None for leases taken before keys were
    # recorded): shown as the holder (never the lock token), and its owner may
    # force-release it (SPEC §3.5).
    key_id: str | None = None
    # Applied when the lease ends by expiry or force release (SPEC §3.9).
    lock_delay_ms: int = 0
    # The session the lease is attached to (SPEC §3.10): its expiry is kept
    # equal to the session's, and it ends with the session.
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class AcquireRequest:
    lock_token: str
    ttl_seconds: int
    operation: str | None = None
    metadata_json: str | None = None
    on_expiry: OnExpiry = OnExpiry.RELEASE
    key_id: str | None = None  # the caller's API key
    wait_ms: int = 0  # how long the caller will wait in line; 0 fails fast
    lock_delay_seconds: int = 0
    session_id: str | None = None  # attach the lease to this session (SPEC §3.10)
    # The session's expiry, filled in by the store from the session's row in
    # the transaction that decides the acquire; the lease's expiry follows it.
    session_expires_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Granted:
    lease: Lease
    created: bool  # False: the same token already held it (a retried acquire)


@dataclass(frozen=True, slots=True)
class Busy:
    holder: Lease | None  # None: free, but in its lock delay or others wait ahead
    now_ms: int
    waiters: int = 0
    delay_until_ms: int | None = None  # set when refused because of a lock delay

    def to_error(self) -> LockHeld:
        if self.delay_until_ms is not None:
            return lock_delay_error(self.delay_until_ms, self.now_ms, self.waiters)
        return lock_held_error(self.holder, self.now_ms, self.waiters)

    @property
    def ends_in_ms(self) -> int | None:
        """How long until the refusal ends by itself, where that is known."""
        if self.delay_until_ms is not None:
            return max(self.delay_until_ms - self.now_ms, 0)
        return None


def is_live(lease: Lease, now_ms: int) -> bool:
    """A `release` lease dies at expires_at; a `keep` lease only at its deadline."""
    if now_ms >= lease.deadline_ms:
        return False
    return lease.on_expiry is OnExpiry.KEEP or now_ms < lease.expires_ms


def is_overdue(lease: Lease, now_ms: int) -> bool:
    return lease.on_expiry is OnExpiry.KEEP and lease.expires_ms <= now_ms < lease.deadline_ms


def end_of_life_ms(lease: Lease) -> int:
    """The instant the lease dies unless renewed or released."""
    return lease.deadline_ms if lease.on_expiry is OnExpiry.KEEP else lease.expires_ms


def new_lease(key: str, request: AcquireRequest, now_ms: int, fencing_token: int) -> Lease:
    deadline = now_ms + LEASE_LIFETIME_MS
    if request.session_expires_ms is not None:
        expires = request.session_expires_ms  # it has no expiry of its own
    else:
        expires = now_ms + request.ttl_seconds * MS_PER_SECOND
    return Lease(
        key=key,
        lock_token=request.lock_token,
        fencing_token=fencing_token,
        acquired_ms=now_ms,
        expires_ms=min(expires, deadline),
        deadline_ms=deadline,
        operation=request.operation,
        metadata_json=request.metadata_json,
        on_expiry=request.on_expiry,
        key_id=request.key_id,
        lock_delay_ms=request.lock_delay_seconds * MS_PER_SECOND,
        session_id=request.session_id,
    )


def delay_until_ms(lease: Lease, reason: EndReason, now_ms: int) -> int | None:
    """Until when nobody may be granted the lock after `lease` ended for `reason`
    (None: no delay). Measured from the end itself: the expiry instant for an
    expired lease (however late it is noticed), the force release's instant."""
    if lease.lock_delay_ms <= 0:
        return None
    if reason in _TIMED_OUT:
        return end_of_life_ms(lease) + lease.lock_delay_ms
    if reason is EndReason.FORCE_RELEASED:
        return now_ms + lease.lock_delay_ms
    return None  # the holder's own release (or its session's end): it knows its writes landed


def decide_acquire(
    key: str,
    current: Lease | None,
    request: AcquireRequest,
    now_ms: int,
    *,
    waiters_ahead: int,
    next_fencing_token: Callable[[], int],
    delayed_until_ms: int | None = None,
) -> Granted | Busy:
    """Grant, repeat an existing grant, or refuse.

    `waiters_ahead` counts live waiters queued before this caller (all of them
    for a fail-fast acquire): a free lock goes to the head of the line first.
    `delayed_until_ms` is the end of a lock delay recorded for the lock; a dead
    lease still on record starts its own. `next_fencing_token` is only called
    when a new lease is granted, so the counter moves exactly when the lock
    changes hands.
    """
    if current is not None and is_live(current, now_ms):
        if current.lock_token == request.lock_token:
            return Granted(current, created=False)
        return Busy(current, now_ms, waiters_ahead)
    blocked_until = delayed_until_ms
    if current is not None:  # dead, not yet reaped: it expired
        own = delay_until_ms(current, EndReason.EXPIRED, now_ms)
        if own is not None and (blocked_until is None or own > blocked_until):
            blocked_until = own
    if blocked_until is not None and now_ms < blocked_until:
        return Busy(None, now_ms, waiters_ahead, delay_until_ms=blocked_until)
    if waiters_ahead > 0:
        return Busy(None, now_ms, waiters_ahead)
    return Granted(new_lease(key, request, now_ms, next_fencing_token()), created=True)


def lock_held_error(holder: Lease | None, now_ms: int, waiters: int = 0) -> LockHeld:
    if holder is None:
        return LockHeld(
            f"The lock is free but {waiters} caller(s) are waiting in line ahead of you.",
            operation=None,
            expires_in_ms=0,
            waiters=waiters,
        )
    expires_in_ms = holder.expires_ms - now_ms
    # Retry-After only when the lease can end on its own soon: an overdue or
    # not-yet-overdue `keep` lease is held until someone ends it.
    retry_after = expires_in_ms if holder.on_expiry is OnExpiry.RELEASE else None
    what = f" for {holder.operation!r}" if holder.operation else ""
    return LockHeld(
        f"The lock is held by another token{what}.",
        operation=holder.operation,
        expires_in_ms=expires_in_ms,
        waiters=waiters,
        retry_after_ms=retry_after,
    )


def lock_delay_error(until_ms: int, now_ms: int, waiters: int = 0) -> LockHeld:
    wait_ms = max(until_ms - now_ms, 0)
    return LockHeld(
        "The lock is in its lock delay after its last holder was lost; "
        f"nobody is granted it for {wait_ms} ms.",
        operation=None,
        expires_in_ms=0,
        waiters=waiters,
        reason=LOCK_DELAY_REASON,
        retry_after_ms=wait_ms,
    )


def lost_reason(
    current: Lease | None, lock_token: str, now_ms: int, ended: EndReason | None
) -> EndReason | None:
    """Why `lock_token` no longer holds the lock, where the server knows it."""
    if current is not None and current.lock_token == lock_token:
        return dead_reason(current)  # still on record, but dead
    if ended in _OWN_ENDS or ended is EndReason.SESSION_EXPIRED:
        # A session's end is worth more to its holder than who took the lock next.
        return ended
    if ended is not None:
        if current is not None and is_live(current, now_ms):
            return EndReason.SUPERSEDED
        return ended
    return None


def dead_reason(lease: Lease) -> EndReason:
    """Why a lease that is dead by the clock ended: its own expiry, or its
    session's (its expiry is the session's until its 90-day deadline)."""
    if lease.session_id is not None and lease.expires_ms < lease.deadline_ms:
        return EndReason.SESSION_EXPIRED
    return EndReason.EXPIRED


def decide_renew(
    current: Lease | None,
    lock_token: str,
    ttl_seconds: int,
    now_ms: int,
    ended: EndReason | None,
) -> Lease:
    """The renewed lease, or raise LeaseLost / LeaseExpired.

    The new expiry is set outright (a shorter TTL shortens the lease), capped at
    the absolute deadline. The fencing token never changes on renewal. A lease
    attached to a session has no expiry of its own: renewing it is allowed,
    changes nothing and answers the session's expiry (renew the session).
    """
    if current is None or current.lock_token != lock_token or not is_live(current, now_ms):
        reason = lost_reason(current, lock_token, now_ms, ended)
        raise LeaseLost(
            "This token does not hold the lock"
            + (f" (it was {reason.value.replace('_', ' ')})." if reason else "."),
            reason=reason.value if reason else None,
        )
    if current.on_expiry is OnExpiry.RELEASE and now_ms >= current.expires_ms - RENEW_MARGIN_MS:
        raise LeaseExpired(expires_in_ms=current.expires_ms - now_ms)
    if current.session_id is not None:
        return current
    expires = min(now_ms + ttl_seconds * MS_PER_SECOND, current.deadline_ms)
    return replace(current, expires_ms=expires)


def holds(current: Lease | None, lock_token: str, now_ms: int) -> bool:
    """True when `lock_token` holds a live lease (release succeeds exactly then)."""
    return current is not None and current.lock_token == lock_token and is_live(current, now_ms)


# A fence check's reason when the server has no record of the token on this
# lock (never issued for it, or ended longer ago than the server remembers).
FENCE_UNKNOWN = "unknown"
# Fencing tokens stay below 2^53 (SPEC §1): a larger number was never issued.
MAX_FENCING_TOKEN = 2**53 - 1


@dataclass(frozen=True, slots=True)
class FenceVerdict:
    """The answer to "is token N the fencing token of this lock's live lease?"."""

    token: int
    current: bool
    live_token: int | None
    reason: str | None  # None exactly when current


def judge_fence(
    current: Lease | None, token: int, now_ms: int, ended: EndReason | None
) -> FenceVerdict:
    """Judge `token` against the lock's lease row (live or dead) and the recorded
    end of the lease that had it, if any. A stale token's reason follows the
    rule a late renewal is told (`lost_reason`): an expired lease whose lock is
    held again by someone else was superseded."""
    live = current if current is not None and is_live(current, now_ms) else None
    live_token = None if live is None else live.fencing_token
    if live is not None and live.fencing_token == token:
        return FenceVerdict(token, True, live_token, None)
    reason: str
    if current is not None and current.fencing_token == token:
        reason = dead_reason(current).value  # still on record, but dead
    elif ended is EndReason.EXPIRED and live is not None:
        reason = EndReason.SUPERSEDED.value
    elif ended is not None:
        reason = ended.value
    else:
        reason = FENCE_UNKNOWN
    return FenceVerdict(token, False, live_token, reason)


def may_force_release(lease: Lease, key_id: str, is_admin: bool) -> bool:
    """An admin may end any lease of its project; anyone else only a lease its
    own API key took (ownership is the only check: the caller is typically a
    client that crashed and lost its lock token). A lease taken before keys
    were recorded has no owner but the admins."""
    return is_admin or (lease.key_id is not None and lease.key_id == key_id)
