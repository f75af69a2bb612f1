"""Keeping a lease alive, as a sans-I/O program shared by both clients.

`keep_alive(terms)` yields `Sleep` and `Call` steps and returns a `Loss` when the
lease can no longer be trusted. The async client runs it in a task, the sync
client in a thread; both stop it (and so stop renewing) the moment the holder's
block exits.

All local reasoning about expiry uses the monotonic clock and only durations
the server reported, never the difference between two machines' wall clocks.
A grant is assumed to have happened no earlier than when its request was sent
and no earlier than one second before its answer arrived (answers that take
longer than that to travel are rare, and each lock lease also keeps a 1 s margin).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fencepost.client.calls import Call, Sleep
from fencepost.client.models import Lease, LeaseRenewal, SessionGrant, SlotGrant, SlotRenewal
from fencepost.client.operations import Op, renew_call, renew_session_call, renew_slot_call
from fencepost.errors import (
    Capped,
    FencepostError,
    LeaseExpired,
    LeaseLost,
    NotFound,
    SessionExpired,
    SessionLost,
    TransportError,
    UnexpectedResponse,
)

Clock = Callable[[], float]
# Renewals must reach the server more than 1 s before expiry (SPEC §3.2).
LOCK_RENEW_MARGIN_S = 1.0
MAX_ANSWER_TRANSIT_S = 1.0
MIN_ATTEMPT_TIMEOUT_S = 0.5
# Renewals are due at a random point of the end of their interval, so leases
# taken together (a process starting many tasks at once) are not renewed in one
# burst every interval: the first renewal anywhere in the second half of the
# interval, later ones in its last tenth, which keeps the spread at little cost.
FIRST_RENEWAL_SPREAD = 0.5
RENEWAL_SPREAD = 0.1


def granted_at(sent: float, answered: float) -> float:
    """The earliest moment a grant answered at `answered` may have been made."""
    return max(sent, answered - MAX_ANSWER_TRANSIT_S)


@dataclass(frozen=True, slots=True)
class Loss:
    """Why a held lease stopped being trustworthy. `reason` is the server's
    (`expired`, `released`, `force_released`, `superseded`, `session_expired`,
    `session_ended`), or `not_found`
    (a slot that is gone), `capped` (a slot at its request deadline),
    `unreachable` (no renewal got through before the lease ran out) or
    `renewal_failed` (renewals were refused until it ran out)."""

    reason: str | None
    error: FencepostError | None = None


class Terms(Protocol):
    """What the keeper needs to know about one lease."""

    interval_s: float
    capped: bool

    def renew_call(self, timeout: float) -> Call[Any]: ...

    def renewed(self, result: Any, sent: float, answered: float) -> None: ...

    def last_renewed(self) -> float: ...

    def expires(self) -> float: ...

    def give_up_at(self) -> float: ...

    def loss_for(self, error: FencepostError) -> Loss | None: ...


class LockTerms:
    """A lock lease's timing: renewed every `interval_s` (a third of the TTL by
    default) with the same TTL; trusted until 1 s before its expiry, or, for an
    `on_expiry="keep"` lease (which stays held while overdue), until its deadline."""

    def __init__(self, lease: Lease, ttl: int, sent: float, answered: float,
                 interval_s: float | None = None) -> None:
        self.key = lease.key
        self.token = lease.lock_token
        self.ttl = ttl
        self.interval_s = interval_s if interval_s is not None else ttl / 3
        self.capped = False
        self.keep = lease.on_expiry == "keep"
        start = granted_at(sent, answered)
        lifetime = (lease.deadline_at - lease.acquired_at).total_seconds()
        self._deadline = start + lifetime
        self._renewed = start
        self._expires = min(start + ttl, self._deadline)
        self.lease = lease
        self.expires_at = lease.expires_at

    def renew_call(self, timeout: float) -> Call[LeaseRenewal]:
        return renew_call(self.key, self.token, self.ttl, retry=False, timeout=timeout)

    def renewed(self, result: LeaseRenewal, sent: float, answered: float) -> None:
        start = granted_at(sent, answered)
        self._renewed = start
        self._expires = min(start + self.ttl, self._deadline)
        self.expires_at = result.expires_at

    def last_renewed(self) -> float:
        return self._renewed

    def expires(self) -> float:
        return self._expires

    def give_up_at(self) -> float:
        if self.keep:
            return self._deadline - LOCK_RENEW_MARGIN_S
        return self._expires - LOCK_RENEW_MARGIN_S

    def loss_for(self, error: FencepostError) -> Loss | None:
        if isinstance(error, LeaseLost):
            return Loss(error.reason or "lost", error)
        if isinstance(error, LeaseExpired):
            return Loss("expired", error)
        return None


class SlotTerms:
    """A pool slot's timing: renewed at the pool's suggested interval; lives one
    term past its last renewal and never past its request deadline."""

    def __init__(self, grant: SlotGrant, sent: float, answered: float) -> None:
        self.pool = grant.pool
        self.slot_id = grant.slot_id
        self.term_s = grant.term_ms / 1000
        self.interval_s = grant.renew_interval_ms / 1000
        self.capped = False
        start = granted_at(sent, answered)
        request_timeout_s = (grant.request_deadline - grant.lease_deadline) / 1000 + self.term_s
        self._request_deadline = start + request_timeout_s
        self._renewed = start
        self._expires = min(start + self.term_s, self._request_deadline)
        self.lease_deadline = grant.lease_deadline

    def renew_call(self, timeout: float) -> Call[SlotRenewal]:
        return renew_slot_call(self.pool, self.slot_id, retry=False, timeout=timeout)

    def renewed(self, result: SlotRenewal, sent: float, answered: float) -> None:
        start = granted_at(sent, answered)
        self._renewed = start
        self._expires = min(start + self.term_s, self._request_deadline)
        self.lease_deadline = result.lease_deadline

    def last_renewed(self) -> float:
        return self._renewed

    def expires(self) -> float:
        return self._expires

    def give_up_at(self) -> float:
        return self._expires

    def loss_for(self, error: FencepostError) -> Loss | None:
        if isinstance(error, NotFound):
            return Loss("not_found", error)
        if isinstance(error, Capped):
            self.capped = True
        return None


class SessionTerms:
    """A session's timing (SPEC §3.10): renewed every `interval_s` (a third of
    its TTL by default) with the same TTL; trusted, with everything attached,
    until 1 s before its expiry (renewals must arrive before that)."""

    def __init__(self, grant: SessionGrant, sent: float, answered: float,
                 interval_s: float | None = None) -> None:
        self.session_id = grant.session_id
        self.ttl = grant.ttl_seconds
        self.interval_s = interval_s if interval_s is not None else self.ttl / 3
        self.capped = False
        start = granted_at(sent, answered)
        self._renewed = start
        self._expires = start + self.ttl
        self.expires_at = grant.expires_at

    def renew_call(self, timeout: float) -> Call[SessionGrant]:
        return renew_session_call(self.session_id, self.ttl, retry=False, timeout=timeout)

    def renewed(self, result: SessionGrant, sent: float, answered: float) -> None:
        start = granted_at(sent, answered)
        self._renewed = start
        self._expires = start + self.ttl
        self.expires_at = result.expires_at

    def last_renewed(self) -> float:
        return self._renewed

    def expires(self) -> float:
        return self._expires

    def give_up_at(self) -> float:
        return self._expires - LOCK_RENEW_MARGIN_S

    def loss_for(self, error: FencepostError) -> Loss | None:
        if isinstance(error, SessionLost):
            return Loss(error.reason or "session_lost", error)
        if isinstance(error, SessionExpired):
            return Loss("session_expired", error)
        if isinstance(error, NotFound):  # forgotten, or the key lost it
            return Loss("not_found", error)
        return None


def retry_pause(terms: Terms, failures: int, error: FencepostError | None) -> float:
    """The pause before renewal attempt number `failures + 1` after a failure:
    short (the lease is running out), growing, at least any Retry-After."""
    pause: float = min(terms.interval_s / 4, 0.25 * 2.0 ** min(failures - 1, 4), 2.0)
    if error is not None and error.retry_after is not None:
        pause = max(pause, error.retry_after)
    return pause


def _reason_for_running_out(error: FencepostError | None) -> str:
    if isinstance(error, TransportError | UnexpectedResponse) or (
        error is not None and error.http_status >= 500
    ):
        return "unreachable"
    return "renewal_failed"


def keep_alive(terms: Terms, *, timeout: float, clock: Clock = time.monotonic,
               chance: Callable[[], float] = random.random) -> Op[Loss]:
    """Renew the lease described by `terms` until it is lost; returns the `Loss`.

    Each renewal is due after a random part of the end of `terms.interval_s`
    (`chance()` in [0, 1) picks it), never later than the interval.

    A renewal refused for good (`lease_lost`, `lease_expired`, a slot that is gone)
    ends it at once. Other failures (unreachable server, 5xx, quota) are retried
    until the lease would have run out; then it is lost as `unreachable` (or
    `renewal_failed`). A slot at its request deadline (`capped`) is no longer
    renewed and is lost when it runs out."""
    failures = 0
    last_error: FencepostError | None = None
    spread = FIRST_RENEWAL_SPREAD
    while True:
        now = clock()
        give_up = terms.give_up_at()
        if terms.capped:
            yield Sleep(max(0.0, terms.expires() - now))
            return Loss("capped", last_error)
        if failures == 0:
            interval = terms.interval_s * (1 - spread * chance())
            due = min(terms.last_renewed() + interval, give_up - MIN_ATTEMPT_TIMEOUT_S)
        else:
            due = now + retry_pause(terms, failures, last_error)
            if due >= give_up:
                yield Sleep(max(0.0, give_up - now))
                return Loss(_reason_for_running_out(last_error), last_error)
        if due > now:
            yield Sleep(due - now)
        sent = clock()
        attempt_timeout = max(MIN_ATTEMPT_TIMEOUT_S, min(timeout, give_up - sent))
        try:
            result = yield terms.renew_call(attempt_timeout)
        except FencepostError as error:
            loss = terms.loss_for(error)
            if loss is not None:
                return loss
            failures += 1
            last_error = error
            continue
        terms.renewed(result, sent, clock())
        spread = RENEWAL_SPREAD
        failures = 0
        last_error = None
