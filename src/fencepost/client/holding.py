"""What a held lock or slot knows, shared by the async and sync context managers.

The context managers (`AsyncLockHold`, `LockHold`, ...) add only the I/O: how the
acquire runs, where the keeper runs (a task or a thread), and how exit stops it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import httpx

from fencepost.client.calls import name_segment, new_token
from fencepost.client.keeper import LockTerms, Loss, SlotTerms, Terms
from fencepost.client.models import Lease, LockSet, OnExpiry, SlotGrant
from fencepost.client.operations import (
    Op,
    acquire_lock,
    acquire_lock_set,
    acquire_slot,
    release_call,
    release_lock,
    release_slot,
)
from fencepost.client.outcome import Outcome, merge_outcome, outcome_from_response
from fencepost.errors import FencepostError, LeaseLost

log = logging.getLogger("fencepost.client")
log.addHandler(logging.NullHandler())  # a library logs only where the application asks


class Holding:
    """State common to every hold: whether (and why) the lease was lost."""

    _what: str = "lease"

    def __init__(self, on_lost: Callable[[Any], Any] | None, raise_on_loss: bool) -> None:
        self._on_lost = on_lost
        self._raise_on_loss = raise_on_loss
        self._loss: Loss | None = None
        self._held = False

    @property
    def lost(self) -> bool:
        """True once the lease can no longer be trusted (stop work that needs it)."""
        return self.loss is not None

    @property
    def loss(self) -> Loss | None:
        """Why the lease was lost (`Loss.reason`, `Loss.error`), or None."""
        return self._loss

    @property
    def held(self) -> bool:
        """True between a successful acquire and the end of the block."""
        return self._held

    def check(self) -> None:
        """Raise `LeaseLost` if the lease was lost; call it between steps of work
        that must not run without the lease."""
        if self.loss is not None:
            raise self.lost_error()

    def lost_error(self) -> LeaseLost:
        """The `LeaseLost` describing this loss (reason and the server's error)."""
        loss = self.loss
        reason = loss.reason if loss is not None else None
        message = f"The {self._what} was lost ({reason or 'unknown reason'})."
        error = LeaseLost(message, reason=reason)
        if loss is not None and loss.error is not None:
            error.request_id = loss.error.request_id
            error.__cause__ = loss.error
        return error

    def _record_loss(self, loss: Loss) -> bool:
        """Remember the first loss; False if one was already recorded."""
        if self._loss is not None:
            return False
        self._loss = loss
        log.warning("fencepost: %s lost (%s)", self._what, loss.reason)
        return True

    def _should_raise_on_exit(self, had_error: bool) -> bool:
        return self.loss is not None and self._raise_on_loss and not had_error

    # What to acquire, how to time its renewals and how to release it; provided by
    # LockFacts and SlotFacts, used by the async and sync context managers.
    def _acquire_op(self) -> Op[Any]:
        raise NotImplementedError

    def _make_terms(self, result: Any, sent: float, answered: float) -> list[Terms]:
        """One Terms per lease to keep alive (a lock set has one per key); each
        gets its own keeper, and the first loss among them is the hold's."""
        raise NotImplementedError

    def _release_op(self) -> Op[bool]:
        raise NotImplementedError

    def _release_after_failed_acquire(self) -> bool:
        raise NotImplementedError


class _LockOptions(Holding):
    """What a lock hold asks the server for, one key or several (a lock set)."""

    def __init__(
        self,
        *,
        ttl: int,
        wait: float,
        operation: str | None,
        metadata: Mapping[str, Any] | None,
        on_expiry: OnExpiry,
        lock_delay: int,
        renew_every: float | None,
        token: str | None,
        on_lost: Callable[[Any], Any] | None,
        raise_on_loss: bool,
        shared: bool = False,
        session_id: str | None = None,
    ) -> None:
        super().__init__(on_lost, raise_on_loss)
        self.shared = shared
        self.token = token or new_token()
        self._ttl = ttl
        self._wait = wait
        self._operation = operation
        self._metadata = metadata
        self._on_expiry: OnExpiry = on_expiry
        self._lock_delay = lock_delay
        self._renew_every = renew_every
        self._session_id = session_id

    def _release_after_failed_acquire(self) -> bool:
        # The acquire may have been granted with an answer that never arrived; the
        # token is ours, so releasing what it may hold is always safe.
        return True


class LockFacts(_LockOptions):
    """A lock held by a `with client.lock(...)` block: its key, fencing token and
    expiry. Pass `fencing_token` to whatever the lock protects."""

    _what = "lock lease"

    def __init__(self, key: str, **options: Any) -> None:
        super().__init__(**options)
        self.key = name_segment(key, "key")
        self._terms: LockTerms | None = None

    @property
    def lease(self) -> Lease:
        """The grant as the server answered it."""
        return self._require().lease

    @property
    def fencing_token(self) -> int:
        """The fencing token of this lease; pass it with every write you protect."""
        return self._require().lease.fencing_token

    @property
    def expires_at(self) -> datetime:
        """When the lease expires unless renewed (updated by every renewal)."""
        return self._require().expires_at

    @property
    def deadline_at(self) -> datetime:
        """The absolute end of the lease (90 days after acquisition)."""
        return self._require().lease.deadline_at

    def _require(self) -> LockTerms:
        if self._terms is None:
            raise RuntimeError("The lock is not acquired yet; use it inside its `with` block.")
        return self._terms

    def _acquire_op(self) -> Op[Lease]:
        return acquire_lock(
            self.key, ttl=self._ttl, wait=self._wait, operation=self._operation,
            metadata=self._metadata, on_expiry=self._on_expiry, lock_delay=self._lock_delay,
            shared=self.shared, token=self.token, session_id=self._session_id,
        )

    def _make_terms(self, lease: Lease, sent: float, answered: float) -> list[Terms]:
        self._terms = LockTerms(lease, self._ttl, sent, answered, self._renew_every)
        return [self._terms]

    def _release_op(self) -> Op[bool]:
        return release_lock(self.key, self.token)


class LockSetFacts(_LockOptions):
    """Locks held together by a `with client.lock_many(...)` block (SPEC §3.7):
    acquired all or none under one lock token, each renewed on its own, and one
    loss signal for the lot (the first key lost). Pass each key's fencing token
    to whatever that key protects."""

    _what = "lock set lease"

    def __init__(self, keys: Sequence[str], **options: Any) -> None:
        super().__init__(**options)
        self.keys = [name_segment(key, "key") for key in keys]
        self._terms: list[LockTerms] | None = None

    @property
    def leases(self) -> list[Lease]:
        """The grants as the server answered them, in the order of `keys`."""
        return [terms.lease for terms in self._require()]

    @property
    def fencing_tokens(self) -> dict[str, int]:
        """Each key's fencing token; pass it with every write that key protects."""
        return {terms.key: terms.lease.fencing_token for terms in self._require()}

    @property
    def expires_at(self) -> datetime:
        """When the first of the leases expires unless renewed."""
        return min(terms.expires_at for terms in self._require())

    def _require(self) -> list[LockTerms]:
        if self._terms is None:
            raise RuntimeError("The locks are not acquired yet; use them inside the block.")
        return self._terms

    def _acquire_op(self) -> Op[LockSet]:
        return acquire_lock_set(
            self.keys, ttl=self._ttl, wait=self._wait, operation=self._operation,
            metadata=self._metadata, on_expiry=self._on_expiry, lock_delay=self._lock_delay,
            shared=self.shared, token=self.token, session_id=self._session_id,
        )

    def _make_terms(self, granted: LockSet, sent: float, answered: float) -> list[Terms]:
        self._terms = [LockTerms(lease, self._ttl, sent, answered, self._renew_every)
                       for lease in granted.leases]
        return list(self._terms)

    def _release_op(self) -> Op[bool]:
        return _release_each(self.keys, self.token)


def _release_each(keys: list[str], token: str) -> Op[bool]:
    """Release every key the token holds; True when it held them all."""
    held = True
    for key in keys:
        released: bool = yield release_call(key, token)
        held = held and released
    return held


class SlotFacts(Holding):
    """A pool slot held by a `with client.slot(...)` block. Call `report()` with
    the upstream's answer so the release tells the pool how the work went."""

    _what = "pool slot"

    def __init__(
        self,
        pool: str,
        *,
        wait: float,
        no_queue: bool,
        on_lost: Callable[[Any], Any] | None,
        raise_on_loss: bool,
        session_id: str | None = None,
        cost: int | None = None,
    ) -> None:
        super().__init__(on_lost, raise_on_loss)
        self.pool = name_segment(pool, "pool")
        self._session_id = session_id
        self._cost = cost  # the units the call will spend of the pool's budget (SPEC §4.6)
        self._wait = wait
        self._no_queue = no_queue
        self._terms: SlotTerms | None = None
        self._grant: SlotGrant | None = None
        self.outcome: Outcome | None = None
        """The outcome sent with the release (set by `report()`)."""

    @property
    def grant(self) -> SlotGrant:
        """The admission as the server answered it."""
        if self._grant is None:
            raise RuntimeError("The slot is not acquired yet; use it inside its `with` block.")
        return self._grant

    @property
    def slot_id(self) -> str:
        """This slot's ID (a capability: keep it private)."""
        return self.grant.slot_id

    @property
    def lease_deadline(self) -> int:
        """When the slot lapses unless renewed, epoch milliseconds (server clock)."""
        if self._terms is None:
            return self.grant.lease_deadline
        return self._terms.lease_deadline

    @property
    def request_deadline(self) -> int:
        """The absolute end of the slot, epoch milliseconds (server clock)."""
        return self.grant.request_deadline

    def report(
        self,
        response: httpx.Response | None = None,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        throttled: int | None = None,
        retry_after_ms: int | None = None,
        rate: Mapping[str, int] | None = None,
        cost: int | None = None,
    ) -> Outcome:
        """Record the upstream outcome to send with the release (SPEC §4.4): pass
        the upstream `httpx.Response`, or `status` and `headers` yourself. Later
        reports win; each 429 reported counts one throttle. Only rate-limit
        headers are kept. `cost`: the units the call really spent (the tokens
        the upstream says it used), which replaces the estimate given to
        `slot(cost=...)` in the pool's budget (SPEC §4.6)."""
        if response is not None:
            self.outcome = outcome_from_response(response, previous=self.outcome)
        self.outcome = merge_outcome(
            self.outcome, status=status, headers=headers, throttled=throttled,
            retry_after_ms=retry_after_ms, rate=rate, cost=cost,
        )
        return self.outcome

    def _acquire_op(self) -> Op[SlotGrant]:
        return acquire_slot(self.pool, wait=self._wait, no_queue=self._no_queue,
                            session_id=self._session_id, cost=self._cost)

    def _make_terms(self, grant: SlotGrant, sent: float, answered: float) -> list[Terms]:
        self._grant = grant
        self._terms = SlotTerms(grant, sent, answered)
        return [self._terms]

    def _release_op(self) -> Op[bool]:
        return release_slot(self.pool, self.grant.slot_id, self.outcome)

    def _release_after_failed_acquire(self) -> bool:
        return False  # without the answer there is no slot ID; the pool reclaims it


def report_failure(what: str, error: FencepostError) -> None:
    log.warning("fencepost: could not release the %s: %s", what, error.message)
