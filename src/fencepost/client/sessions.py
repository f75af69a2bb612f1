"""What a session and the leases and slots attached to it know, shared by the
async and sync clients (SPEC §3.10).

A session hold is a hold like a lock's: acquired (`POST /v1/sessions`), kept
alive by the keeper (one heartbeat, at a third of its TTL), and ended on exit
(`DELETE`, which ends everything still attached). What is attached keeps
nothing alive of its own: no task, no thread, no timer per lease, so one
process can hold tens of thousands of leases on one heartbeat. Their loss is
the session's: one signal for everything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from fencepost.client.calls import name_segment
from fencepost.client.holding import Holding, LockFacts, LockSetFacts, SlotFacts
from fencepost.client.keeper import LockTerms, Loss, SessionTerms, Terms
from fencepost.client.models import Lease, LockSet, SessionGrant
from fencepost.client.operations import (
    Op,
    acquire_lock_set,
    create_session,
    end_session,
    release_call,
)
from fencepost.client.transport import MAX_IN_FLIGHT
from fencepost.errors import FencepostError

# How many requests the async client keeps in flight for one fail-fast lock
# set: as many as the client sends at once (more would only queue for a turn).
LOCK_SET_WAYS = MAX_IN_FLIGHT
# The most keys one lock set takes (SPEC §3.7); a longer session.lock_many()
# is taken as several sets.
LOCK_SET_MAX_KEYS = 32
# Attached leases have no TTL of their own; the server asks for one anyway
# (SPEC §3.1) and does not use it.
_UNUSED_TTL = 5


LockT = TypeVar("LockT")
SetT = TypeVar("SetT")
SlotT = TypeVar("SlotT")


@dataclass(frozen=True, slots=True)
class AttachedKinds(Generic[LockT, SetT, SlotT]):
    """The hold classes a session makes: the async or the blocking ones."""

    lock: Callable[..., LockT]
    lock_set: Callable[..., SetT]
    slot: Callable[..., SlotT]


class SessionFacts(Holding, Generic[LockT, SetT, SlotT]):
    """A session held by a `with client.session(...)` block. Take leases and
    slots with `lock()`, `lock_many()` and `slot()`: they need no renewal of
    their own, and all of them are lost when the session is (`lost`,
    `lost_event`, `on_lost`)."""

    _what = "session"

    def __init__(
        self,
        *,
        kinds: AttachedKinds[LockT, SetT, SlotT],
        ttl: int,
        name: str | None,
        renew_every: float | None,
        on_lost: Callable[[Any], Any] | None,
        raise_on_loss: bool,
    ) -> None:
        super().__init__(on_lost, raise_on_loss)
        self._kinds = kinds
        self._ttl = ttl
        self._name = name
        self._renew_every = renew_every
        self._terms: SessionTerms | None = None

    @property
    def session_id(self) -> str:
        """The session's id (a capability of this client's key: keep it private)."""
        return self._require().session_id

    @property
    def expires_at(self) -> datetime:
        """When the session, and everything attached, expires unless renewed."""
        return self._require().expires_at

    def lock(
        self, key: str, *, wait: float = 0, operation: str | None = None,
        metadata: Mapping[str, Any] | None = None, lock_delay: int = 0,
        shared: bool = False, token: str | None = None,
    ) -> LockT:
        """Hold lock `key` for a `with` (`async with`) block, attached to this
        session: as the client's `lock()`, but it follows the session's expiry
        and is renewed by the session's heartbeat alone."""
        return self._kinds.lock(
            self, key, wait=wait, operation=operation, metadata=metadata,
            lock_delay=lock_delay, shared=shared, token=token,
        )

    def lock_many(
        self, keys: Iterable[str], *, wait: float = 0, operation: str | None = None,
        metadata: Mapping[str, Any] | None = None, lock_delay: int = 0,
        shared: bool = False, token: str | None = None,
    ) -> SetT:
        """Hold every lock of `keys` for a `with` (`async with`) block, all or
        none, under one lock token, attached to this session: one lock set of up
        to 32 keys, more as consecutive sets in key order, so overlapping sets
        never deadlock (`wait` applies to each set)."""
        return self._kinds.lock_set(
            self, keys, wait=wait, operation=operation, metadata=metadata,
            lock_delay=lock_delay, shared=shared, token=token,
        )

    def slot(self, pool: str, *, wait: float = 0, no_queue: bool = False,
             cost: int | None = None) -> SlotT:
        """Hold a slot of `pool` for a `with` (`async with`) block, attached to
        this session (`cost` as for the client's `slot()`)."""
        return self._kinds.slot(self, pool, wait=wait, no_queue=no_queue, cost=cost)

    def _require(self) -> SessionTerms:
        if self._terms is None:
            raise RuntimeError("The session is not started yet; use it inside its `with` block.")
        return self._terms

    def _acquire_op(self) -> Op[SessionGrant]:
        return create_session(self._ttl, name=self._name)

    def _make_terms(self, grant: SessionGrant, sent: float, answered: float) -> list[Terms]:
        self._terms = SessionTerms(grant, sent, answered, self._renew_every)
        return [self._terms]

    def _release_op(self) -> Op[bool]:
        ended = yield from end_session(self.session_id)
        return ended.ended

    def _release_after_failed_acquire(self) -> bool:
        return False  # without the answer there is no id; the session expires by itself


class Attached(Holding):
    """A lease or slot attached to a session: renewed by the session's heartbeat
    alone, lost when the session is, and held only while the session is."""

    _session: SessionFacts[Any, Any, Any]

    @property
    def loss(self) -> Loss | None:
        return self._session.loss

    @property
    def held(self) -> bool:
        return self._held and self._session.held


class AttachedLockFacts(Attached, LockFacts):
    """A lock lease attached to a session (`session.lock(...)`)."""

    def __init__(self, session: SessionFacts[Any, Any, Any], key: str, **options: Any) -> None:
        self._session = session
        LockFacts.__init__(
            self, key, ttl=_UNUSED_TTL, on_expiry="release", renew_every=None,
            on_lost=None, raise_on_loss=session._raise_on_loss,
            session_id=session.session_id, **options,
        )


class AttachedSlotFacts(Attached, SlotFacts):
    """A pool slot attached to a session (`session.slot(...)`)."""

    def __init__(self, session: SessionFacts[Any, Any, Any], pool: str, **options: Any) -> None:
        self._session = session
        SlotFacts.__init__(
            self, pool, on_lost=None, raise_on_loss=session._raise_on_loss,
            session_id=session.session_id, **options,
        )


class AttachedLockSetFacts(Attached, LockSetFacts):
    """Many locks held together under one lock token, attached to a session
    (`session.lock_many(...)`): all of them or none. Up to 32 keys are one lock
    set (`POST /v1/lock-sets`, SPEC §3.7); more are taken as consecutive sets
    of 32 in key order, so two callers asking for overlapping sets never
    deadlock, and a refusal releases the sets already taken."""

    def __init__(
        self, session: SessionFacts[Any, Any, Any], keys: Iterable[str], **options: Any
    ) -> None:
        self._session = session
        names = sorted({name_segment(key, "keys") for key in keys})
        if not names:
            raise ValueError("lock_many() needs at least one key")
        LockSetFacts.__init__(
            self, names, ttl=_UNUSED_TTL, on_expiry="release", renew_every=None,
            on_lost=None, raise_on_loss=session._raise_on_loss,
            session_id=session.session_id, **options,
        )

    def shares(self, ways: int) -> list[list[str]]:
        """The keys split into up to `ways` shares that may be acquired (and
        released) at the same time. Only a fail-fast set is split: waiting for
        keys in parallel could deadlock two sets waiting for each other's keys,
        which taking them in key order never does."""
        if self._wait > 0 or ways <= 1:
            return [self.keys]
        sets = _in_sets(self.keys)
        return [
            [key for part in sets[i::ways] for key in part] for i in range(min(ways, len(sets)))
        ]

    def _acquire_op(self) -> Op[LockSet]:
        return self.acquire_share(self.keys)

    def acquire_share(self, keys: list[str]) -> Op[LockSet]:
        """Take `keys` as lock sets in key order (one grant for them all); on a
        refusal, release those taken and raise it."""
        taken: list[Lease] = []
        try:
            for part in _in_sets(keys):
                granted = yield from acquire_lock_set(
                    part, ttl=_UNUSED_TTL, wait=self._wait, operation=self._operation,
                    metadata=self._metadata, lock_delay=self._lock_delay, shared=self.shared,
                    token=self.token, session_id=self._session.session_id,
                )
                taken.extend(granted.leases)
        except FencepostError:
            yield from self.release_share([lease.key for lease in taken])
            raise
        return LockSet(leases=taken, lock_token=self.token)

    def _make_terms(self, granted: LockSet, sent: float, answered: float) -> list[Terms]:
        # Kept for `leases` and `fencing_tokens`; none is timed on its own (the
        # session is), so the hold starts no keeper.
        by_key = {lease.key: lease for lease in granted.leases}
        self._terms = [
            LockTerms(by_key[key], self._ttl, sent, answered, None) for key in self.keys
        ]
        return []

    def _release_op(self) -> Op[bool]:
        return self.release_share(self.keys)

    def release_share(self, keys: list[str]) -> Op[bool]:
        """Release `keys` with this set's token; True when every one was held.
        A failed release is skipped: the lease ends with the session anyway."""
        released = True
        for key in keys:
            try:
                released = (yield release_call(key, self.token)) and released
            except FencepostError:
                released = False
        return released


def _in_sets(keys: list[str]) -> list[list[str]]:
    """`keys` cut into lock sets of at most LOCK_SET_MAX_KEYS, in order."""
    return [keys[i:i + LOCK_SET_MAX_KEYS] for i in range(0, len(keys), LOCK_SET_MAX_KEYS)]
