"""Lease rules for locks (SPEC §3), as pure functions of the current lease and `now`.

Every instant is Unix epoch milliseconds. The store reads the lock row, asks
these functions what to do, and writes the answer in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Callable, Mapping, Sequence

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


# A lock set names at most this many keys (SPEC §3.7): each key is a waiter row
# and a lease, and the set is decided in one transaction.
LOCK_SET_MAX_KEYS = 32


class Mode(StrEnum):
    """SPEC §3.6: an exclusive lease excludes every other lease of its lock;
    any number of shared leases may be live together."""

    EXCLUSIVE = "exclusive"
    SHARED = "shared"


def compatible(wanted: Mode, other: Mode) -> bool:
    return wanted is Mode.SHARED and other is Mode.SHARED


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
    mode: Mode = Mode.EXCLUSIVE
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
    mode: Mode = Mode.EXCLUSIVE
    session_id: str | None = None  # attach the lease to this session (SPEC §3.10)
    # The session's expiry, filled in by the store from the session's row in
    # the transaction that decides the acquire; the lease's expiry follows it.
    session_expires_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Granted:
    lease: Lease
    created: bool  # False: the same token already held it (a retried acquire)


@dataclass(frozen=True, slots=True)
class SetGranted:
    """A lock set's grant (SPEC §3.7): one lease per key, in the order asked."""

    leases: tuple[Lease, ...]
    created: bool  # False: the token already held every key (a retried acquire)


@dataclass(frozen=True, slots=True)
class Busy:
    # The lease in the way (for a shared lock, the one whose end frees it last),
    # None: free, but in its lock delay or others wait ahead.
    holder: Lease | None
    now_ms: int
    waiters: int = 0
    delay_until_ms: int | None = None  # set when refused because of a lock delay
    key: str | None = None  # the busy key: a lock set's 409 names it (SPEC §3.7)

    def to_error(self) -> LockHeld:
        if self.delay_until_ms is not None:
            error = lock_delay_error(self.delay_until_ms, self.now_ms, self.waiters)
        else:
            error = lock_held_error(self.holder, self.now_ms, self.waiters)
        if self.key is not None:
            error.extra["key"] = self.key
        return error

    @property
    def ends_in_ms(self) -> int | None:
        """How long until the refusal ends by itself, where that is known."""
        if self.delay_until_ms is not None:
            return max(self.delay_until_ms - self.now_ms, 0)
        return None

    @property
    def frees_in_ms(self) -> int | None:
        """How long until the lease in the way dies unless it is renewed (its
        expiry; a `keep` lease's deadline), if one is in the way."""
        if self.holder is None or self.delay_until_ms is not None:
            return None
        return max(end_of_life_ms(self.holder) - self.now_ms, 0)


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
        mode=request.mode,
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


@dataclass(frozen=True, slots=True)
class LockState:
    """What the store read about one lock for an acquire: its lease rows (live
    or dead, not yet reaped), the live waiters ahead of the caller (all of them
    for a fail-fast acquire) and how many of those are exclusive, and the end of
    a recorded lock delay."""

    leases: Sequence[Lease] = ()
    waiters_ahead: int = 0
    exclusive_ahead: int = 0
    delayed_until_ms: int | None = None


def _blocking(leases: Sequence[Lease], wanted: Mode) -> Lease | None:
    """The live lease that keeps `wanted` out, if any: of several, the one
    whose end frees the lock last (a `keep` lease before any other), so the
    refusal's expiry and Retry-After say when the lock can free by itself."""
    blockers = [lease for lease in leases if not compatible(wanted, lease.mode)]
    if not blockers:
        return None
    return max(blockers, key=lambda b: (b.on_expiry is OnExpiry.KEEP, end_of_life_ms(b)))


def judge_acquire(
    key: str, state: LockState, request: AcquireRequest, now_ms: int
) -> Lease | Busy | None:
    """The caller's own live lease (a retried acquire), a refusal, or None: the
    lock may be granted to the caller now.

    One line across modes (SPEC §3.6): an exclusive acquire waits for every
    waiter ahead; a shared one only for exclusive waiters ahead, so shared
    waiters at the head are granted together and a writer in line is never
    overtaken by readers that arrive after it (writers never starve)."""
    live = [lease for lease in state.leases if is_live(lease, now_ms)]
    for lease in live:
        if lease.lock_token == request.lock_token:
            return lease
    blocker = _blocking(live, request.mode)
    if blocker is not None:
        return Busy(blocker, now_ms, state.waiters_ahead, key=key)
    blocked_until = state.delayed_until_ms
    for lease in state.leases:
        if is_live(lease, now_ms):
            continue
        own = delay_until_ms(lease, dead_reason(lease), now_ms)  # dead, not yet reaped
        if own is not None and (blocked_until is None or own > blocked_until):
            blocked_until = own
    if blocked_until is not None and now_ms < blocked_until:
        return Busy(None, now_ms, state.waiters_ahead, delay_until_ms=blocked_until, key=key)
    ahead = state.waiters_ahead if request.mode is Mode.EXCLUSIVE else state.exclusive_ahead
    if ahead > 0:
        return Busy(None, now_ms, state.waiters_ahead, key=key)
    return None


def decide_acquire(
    key: str,
    current: Sequence[Lease],
    request: AcquireRequest,
    now_ms: int,
    *,
    waiters_ahead: int,
    next_fencing_token: Callable[[], int],
    delayed_until_ms: int | None = None,
    exclusive_ahead: int | None = None,
) -> Granted | Busy:
    """Grant, repeat an existing grant, or refuse.

    `current` are the lock's lease rows (live or dead, not yet reaped).
    `waiters_ahead` counts live waiters queued before this caller (all of them
    for a fail-fast acquire), `exclusive_ahead` how many of them are exclusive
    (all, when not given): a free lock goes to the head of the line first.
    `delayed_until_ms` is the end of a lock delay recorded for the lock; a dead
    lease still on record starts its own. `next_fencing_token` is only called
    when a new lease is granted, so the counter moves exactly when the lock
    changes hands.
    """
    state = LockState(
        current, waiters_ahead,
        waiters_ahead if exclusive_ahead is None else exclusive_ahead, delayed_until_ms,
    )
    verdict = judge_acquire(key, state, request, now_ms)
    if isinstance(verdict, Busy):
        return verdict
    if verdict is not None:
        return Granted(verdict, created=False)
    return Granted(new_lease(key, request, now_ms, next_fencing_token()), created=True)


def decide_set(
    keys: Sequence[str],
    states: Mapping[str, LockState],
    request: AcquireRequest,
    now_ms: int,
    next_fencing_token: Callable[[], int],
) -> SetGranted | Busy:
    """All or nothing (SPEC §3.7): the refusal of the first busy key in the
    order given, or one lease per key. Every key is judged before any fencing
    token is drawn, so a refused set moves no counter; new leases then take
    their tokens in the order the keys were given. A key the caller's token
    already holds keeps its lease (a retried acquire)."""
    verdicts = [judge_acquire(key, states[key], request, now_ms) for key in keys]
    for verdict in verdicts:
        if isinstance(verdict, Busy):
            return verdict
    leases: list[Lease] = []
    created = False
    for key, verdict in zip(keys, verdicts, strict=True):
        if isinstance(verdict, Lease):
            leases.append(verdict)
            continue
        leases.append(new_lease(key, request, now_ms, next_fencing_token()))
        created = True
    return SetGranted(tuple(leases), created)


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
    leases: Sequence[Lease], token: int, now_ms: int, ended: EndReason | None
) -> FenceVerdict:
    """Judge `token` against the lock's lease rows (live or dead) and the
    recorded end of the lease that had it, if any. A stale token's reason
    follows the rule a late renewal is told (`lost_reason`): an expired lease
    whose lock is held again by someone else was superseded. `live_token` is
    the token's own when current, else the newest live lease's (a shared lock
    has several)."""
    live = [lease for lease in leases if is_live(lease, now_ms)]
    mine = next((lease for lease in leases if lease.fencing_token == token), None)
    if mine is not None and is_live(mine, now_ms):
        return FenceVerdict(token, True, token, None)
    live_token = max((lease.fencing_token for lease in live), default=None)
    reason: str
    if mine is not None:
        reason = dead_reason(mine).value  # still on record, but dead
    elif ended is EndReason.EXPIRED and live:
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


def may_force_release_all(leases: Sequence[Lease], key_id: str, is_admin: bool) -> bool:
    """A force release ends every live lease of the lock (SPEC §3.6), so a
    member may do it only when its own key took each of them: one shared
    reader must not be able to end the other readers' leases."""
    return all(may_force_release(lease, key_id, is_admin) for lease in leases)
