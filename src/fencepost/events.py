"""What happened, said once: the typed records of fencepost's notable events and
the hub that fans each out to its subscribers (the metrics, the event log).

A lease or slot granted or ended (and why), a lease lost, a key or pool
changed, a caller refused: each is produced in exactly one place and handed to
`Events.emit`; nothing counts the same thing a second time elsewhere.

The store produces grants and ends inside its transactions and reports them
after the commit (with the `Freed` wake-ups), so an end the reaper makes is
reported just like one a caller asked for. It learns who asked through
`ORIGIN`, which the server sets once a request is authenticated; the reaper has
none. No record carries a secret: key IDs, never keys; no lock tokens or slot
IDs.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable

_log = logging.getLogger("fencepost.events")


@dataclass(frozen=True, slots=True)
class Origin:
    """The authenticated request an event came from."""

    request_id: str
    project: str
    key_id: str
    # The API key of an application acting for its user (key_id is the user).
    app_key_id: str | None = None


# The request the running task serves, set once it is authenticated (the
# reaper runs with none). The store's batch writer reads it when an operation
# is queued. Only authenticated requests make store writes that report events,
# so a value a task inherited from an earlier request on its connection is
# replaced before it could be read.
ORIGIN: ContextVar[Origin | None] = ContextVar("fencepost_origin", default=None)


def current_origin() -> Origin | None:
    return ORIGIN.get()


@dataclass(frozen=True, slots=True)
class Granted:
    """A new lease on a lock (`kind` "lock") or a slot of a pool ("slot")."""

    kind: str
    project: str
    name: str  # the lock key or the pool name
    fencing_token: int | None
    origin: Origin | None
    mode: str | None = None  # a lock lease's: "exclusive" or "shared"


@dataclass(frozen=True, slots=True)
class Ended:
    """Leases or slots that ended: `reason` is released, expired,
    force_released, session_expired or session_ended for a lock, released,
    reclaimed, session_expired or session_ended for a slot. `count` > 1
    when the reaper reclaimed several slots of one pool at once."""

    kind: str
    project: str
    name: str
    reason: str
    held_ms: int | None
    origin: Origin | None
    count: int = 1


@dataclass(frozen=True, slots=True)
class Lost:
    """A holder learned its lease is gone: a renewal refused with `lease_lost`
    (reason: expired, released, force_released, superseded, or unknown) or
    `lease_expired` (too late to renew)."""

    project: str
    key: str
    code: str
    reason: str | None
    origin: Origin | None


@dataclass(frozen=True, slots=True)
class AcquireAttempt:
    """An acquire attempt as it ended (lock or slot): granted, existing, held,
    rejected, timeout, disconnected, shutdown or invalid."""

    kind: str
    outcome: str
    waited_s: float


@dataclass(frozen=True, slots=True)
class KeyChanged:
    """An API key created, retired or revoked (`key_id` is the key changed; the origin
    holds the admin's)."""

    action: str
    project: str
    key_id: str
    role: str | None
    origin: Origin | None


@dataclass(frozen=True, slots=True)
class PoolChanged:
    """A pool created, changed or deleted."""

    action: str
    project: str
    pool: str
    origin: Origin | None


@dataclass(frozen=True, slots=True)
class SessionChanged:
    """A session started (`action` "started"), ended ("ended", `reason`
    session_expired or session_ended, with how many live leases and slots
    ended with it; the reaper's expiries count none, since those leases and
    slots are reported as they are reaped), or its holder learned it is over
    ("lost": a renewal refused, `reason` session_expired, session_ended, or
    the code session_expired for a renewal inside the last second). No
    session id: it is a capability."""

    action: str
    project: str
    reason: str | None
    origin: Origin | None
    leases: int = 0
    slots: int = 0


@dataclass(frozen=True, slots=True)
class Refused:
    """A caller refused: 401 (no valid key), 403 (role or address), 429 (the
    key's quota). Project and key are known when the key was."""

    status: int
    code: str
    request_id: str
    project: str | None
    key_id: str | None
    client_ip: str | None
    # Why a JWT was refused (`token_expired`, `wrong_audience`...; SPEC §5.1).
    token_reason: str | None = None


@dataclass(frozen=True, slots=True)
class DatabaseChanged:
    """A PostgreSQL store's connection reached a database other than the one
    this process last wrote to (store/standing.py): `change` "new" (a promoted
    standby, a new timeline: tokens floored above every one seen) or
    "went_back" (a database behind one this process wrote to, written to
    because no host that is not behind answered: an error). `before` and
    `after` name the databases (system identifier:oid:timeline); `tokens_from`
    is where the fencing tokens continue."""

    change: str
    before: str | None
    after: str
    tokens_from: int


Event = (
    Granted | Ended | Lost | AcquireAttempt | KeyChanged | PoolChanged | SessionChanged | Refused
    | DatabaseChanged
)
Subscriber = Callable[[Event], None]


class Events:
    """The hub: every event goes to every subscriber, in subscription order."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    def emit(self, event: Event) -> None:
        for subscriber in self._subscribers:
            try:
                subscriber(event)
            except Exception:  # noqa: BLE001 - a broken subscriber must not fail a request
                _log.exception("an event subscriber failed on %s", type(event).__name__)

    def from_store(self, event: object) -> None:
        """The store's listener: grants, ends, key, pool and session changes,
        and the database changes it met."""
        if isinstance(event, (Granted, Ended, KeyChanged, PoolChanged, SessionChanged,
                              DatabaseChanged)):
            self.emit(event)
