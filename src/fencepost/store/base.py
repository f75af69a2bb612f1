"""The Store protocol: everything the server asks of durable state.

Every backend implements it and passes the same conformance suite. Each method
is one atomic transaction; expiry is judged by the store's own clock (the
server's for SQLite, the database's for PostgreSQL), never the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from fencepost.core.governor import GovernorState
from fencepost.core.keys import Role
from fencepost.core.leases import (
    AcquireRequest,
    Busy,
    FenceVerdict,
    Granted,
    Lease,
    SetGranted,
)
from fencepost.core.ratelimit_headers import RateLimitInfo
from fencepost.core.sessions import Session
from fencepost.core.slots import PoolConfig, Slot
from fencepost.store.standing import Replication, WentBack


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    project: str
    role: Role
    name: str | None
    secret_hash: str
    created_ms: int
    expires_ms: int | None
    allow_ips: list[str]
    rpm_quota: int | None
    revoked_ms: int | None
    # Key refresh (SPEC §5): the key this one was minted from, its chain's first
    # key, and the lifetime an admin granted that first key (None: no expiry).
    parent_id: str | None = None
    root_id: str | None = None
    granted_lifetime_ms: int | None = None
    # Retired (SPEC §5): it no longer works, and its successors still do.
    retired_ms: int | None = None

    @property
    def ended(self) -> bool:
        """Revoked or retired: refused everywhere, for good."""
        return self.revoked_ms is not None or self.retired_ms is not None


@dataclass(frozen=True, slots=True)
class NewKey:
    role: Role
    name: str | None = None
    expires_in_ms: int | None = None
    allow_ips: list[str] = field(default_factory=list)
    rpm_quota: int | None = None


@dataclass(frozen=True, slots=True)
class AcquireResult:
    outcome: Granted | Busy
    ticket: int | None = None  # set when the caller was put in line to wait


@dataclass(frozen=True, slots=True)
class SetAttempt:
    """A lock set's acquire (SPEC §3.7): every lease, or the first busy key's
    refusal and, when the caller waits, its one ticket in every key's line."""

    outcome: SetGranted | Busy
    ticket: int | None = None


# How many waiters a lock's view lists; `waiters` still counts them all.
LINE_SHOWN = 100


@dataclass(frozen=True, slots=True)
class KeyRef:
    """An API key as other callers of its project may see it: never its secret.
    Both None for a lease or waiter recorded before keys were stamped on them."""

    key_id: str | None
    key_name: str | None


@dataclass(frozen=True, slots=True)
class WaiterView:
    """One caller in a lock's line (the lock token is never shown)."""

    key: KeyRef
    since_ms: int | None  # when it joined the line (None: recorded before this was kept)
    gives_up_ms: int | None  # when its wait ends


@dataclass(frozen=True, slots=True)
class LockView:
    key: str
    # The live lease (of a shared lock, the oldest); None: not held (never
    # held, released, or dead).
    lease: Lease | None
    waiters: int
    now_ms: int
    holder: KeyRef | None = None  # the key that took the lease; None when not held
    line: tuple[WaiterView, ...] = ()  # the first LINE_SHOWN waiters, in order
    holders: int = 0  # how many live leases the lock has (several when shared)


@dataclass(frozen=True, slots=True)
class SlotHolderView:
    """A live slot as readers see it: a prefix of its id, never the whole
    (the full slot id is its holder's capability)."""

    slot_id_prefix: str
    key: KeyRef
    acquired_ms: int
    lease_deadline_ms: int
    request_deadline_ms: int


@dataclass(frozen=True, slots=True)
class ForceReleased:
    key: str
    # The displaced lease (of a shared lock, the oldest), or None when nothing
    # was held.
    lease: Lease | None
    now_ms: int
    released_count: int = 0  # how many live leases ended (SPEC §3.6)


@dataclass(frozen=True, slots=True)
class ForceReleaser:
    """Who asks for a force release: an admin ends any lease of its project,
    anyone else only a lease its own API key took (SPEC §3.5)."""

    key_id: str
    is_admin: bool


@dataclass(frozen=True, slots=True)
class Freed:
    """Something may now be grantable: a lock or pool slot was released, expired
    or reclaimed, a waiter left the line, or a pool changed. `wake_all` asks every
    local waiter of that line to re-check (the pool was deleted or reconfigured).

    `remote`: whether the other processes serving the store (replicas,
    workers) are told too. False where the store saw nobody in the line when
    it freed the thing: a waiter elsewhere has a place in the line from its
    join on (joins and frees of one lock are decided one after the other), so
    nobody elsewhere can be waiting for it, and its waiters in this process
    are told all the same. It says who hears the wake-up, not what was freed,
    so it takes no part in comparisons."""

    kind: str  # "lock" or "pool"
    project: str
    name: str
    wake_all: bool = False
    remote: bool = field(default=True, compare=False)


def lock_freed(project: str, key: str, remote: bool = True) -> Freed:
    return Freed("lock", project, key, remote=remote)


def pool_freed(project: str, pool: str, wake_all: bool = False) -> Freed:
    return Freed("pool", project, pool, wake_all)


FreedListener = Callable[[Freed], None]
# Told what the store's committed operations granted and ended (the records of
# fencepost.events), after the commit, on the event loop.
EventListener = Callable[[object], None]
# Told whether a store batch was a write batch (`writes`), its size, its
# seconds from begin to commit, whether it failed, and whether it was replayed
# with a savepoint per operation (an operation raised; batch.py). Called on a
# store thread.
BatchObserver = Callable[[bool, int, float, bool, bool], None]


@dataclass(frozen=True, slots=True)
class PoolStats:
    released: int = 0
    reclaimed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # "2xx" -> count
    status_429: int = 0
    throttled: int = 0
    last_retry_after_ms: int | None = None
    last_reported_ms: int | None = None


@dataclass(frozen=True, slots=True)
class PoolView:
    name: str
    config: PoolConfig
    in_use: int
    queued: int
    effective_limit: int
    stats: PoolStats
    now_ms: int
    governor: GovernorState  # what the pool has learned (SPEC §4.5)
    effective_rpm: int | None = None
    # The unit budget paced by (SPEC §4.6), and what is left of its minute.
    effective_cost_per_minute: int | None = None
    remaining_cost: int | None = None
    average_cost: float | None = None
    learned_cost_per_minute: int | None = None  # the budget the upstream's headers state


@dataclass(frozen=True, slots=True)
class Census:
    """What every replica shares, read at once for the metrics: live leases,
    overdue `keep` leases, live slots, and every pool of every project."""

    live_leases: int
    overdue_leases: int
    live_slots: int
    pools: list[tuple[str, PoolView]]  # (project, pool)
    live_sessions: int = 0


@dataclass(frozen=True, slots=True)
class SlotAttempt:
    """An acquire's result: a slot, a place in line, or a refusal with the state
    that explains it."""

    slot: Slot | None
    ticket: int | None
    in_use: int
    effective_limit: int
    # The pool's configuration as this attempt was decided under it (a grant's
    # term_ms and renew interval come from it).
    config: PoolConfig
    retry_after_ms: int | None = None  # when to try again (a waiter re-checks then)
    paused_until_ms: int | None = None  # set while the pool is paused (SPEC §4.5)
    pause_left_ms: int | None = None  # ... and how long it has to go, by the store's clock
    # The wait acquire_slot was asked for, clamped to `config`
    # (rules.clamp_wait_ms; 0: fail fast). A retry's is 0: its wait was settled.
    wait_ms: int = 0
    # Units of the pool's budget left after this grant (SPEC §4.6; None: no budget).
    remaining_cost: int | None = None


# How many lock keys and pools a session's view lists; `leases` and `slots`
# still count them all (a session may hold tens of thousands of leases).
SESSION_SHOWN = 1000


@dataclass(frozen=True, slots=True)
class SessionView:
    """A session and what it holds now (SPEC §3.10 `GET /v1/sessions/{id}`)."""

    session: Session
    now_ms: int
    keys: list[str]  # the first SESSION_SHOWN lock keys it holds leases of, sorted
    leases: int
    pools: list[tuple[str, int]]  # (pool, live slots), the first SESSION_SHOWN by name
    slots: int


@dataclass(frozen=True, slots=True)
class SessionEnded:
    """`DELETE /v1/sessions/{id}`: whether this call ended it (False when it had
    already ended), and how many live leases and slots ended with it."""

    ended: bool
    leases: int
    slots: int


@dataclass(frozen=True, slots=True)
class SlotReport:
    """The upstream outcome a holder reports on release (SPEC §4.4), validated."""

    status: int | None = None
    throttled: int | None = None
    retry_after_ms: int | None = None
    rate: RateLimitInfo | None = None  # `rate` merged over the parsed `headers`
    report_json: str | None = None  # the whole report, as sent
    cost: int | None = None  # units the call really spent (SPEC §4.6)


class Store(Protocol):
    """Durable state. All methods are coroutines safe to call concurrently."""

    url_scheme: str
    # How many write batches the store runs at once (SQLite: its one writer).
    writers: int

    async def open(self) -> None:
        """Connect, create or migrate the schema, and start background work."""

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers."""

    async def check_ready(self) -> None:
        """Raise StoreUnavailable unless the store answers and takes writes: its
        file is the one it opened, and the last write batch did not fail (or a
        write probe has committed since). Cheap: one read, no write."""

    def replication(self) -> Replication | None:
        """What confirms the store's commits, as last read (PostgreSQL: at each
        connection and every 10 s; SPEC §6); None where nothing replicates
        (SQLite) or nothing was read yet."""

    def went_back(self) -> WentBack | None:
        """The last time the store wrote to a database behind one it wrote to
        before (PostgreSQL, SPEC §7.9), if it did in the last
        WENT_BACK_SHOWN_MS; None otherwise (always on SQLite)."""

    def add_freed_listener(self, listener: FreedListener) -> None:
        """Call `listener` (on the event loop) after a commit that may free a lock."""

    def add_event_listener(self, listener: EventListener) -> None:
        """Call `listener` (on the event loop) with each Granted and Ended record
        of fencepost.events that a committed operation of this process made."""

    def watch_batches(self, observer: BatchObserver) -> None:
        """Report every batch (reads and writes) to `observer`."""

    async def census(self) -> Census:
        """Counts across every project and replica, for the metrics."""

    async def now_ms(self) -> int:
        """The store's clock: the one time authority for expiry."""

    # --- projects and keys -------------------------------------------------
    async def bootstrap(self, secret: str | None) -> str | None:
        """When the store holds no key: create project `default` and an admin key
        (with `secret`, or a generated one) and return its secret. Otherwise None."""

    async def create_project(self, name: str) -> str:
        """Create a project with a first admin key; return the key's secret.
        Raises Conflict when the project exists."""

    async def create_key(self, project: str, new: NewKey) -> tuple[KeyRecord, str]: ...

    async def recover_admin_key(self, project: str) -> tuple[KeyRecord, str]:
        """A new admin key for an existing project, for whoever can reach the
        store itself (`fencepost project admin-key --new`): the way back when
        every admin key of the project is lost. Raises NotFound."""

    async def list_keys(
        self, project: str, after: str | None = None, limit: int | None = None
    ) -> list[KeyRecord]:
        """The project's keys in creation order, from the one after the key
        `after`, at most `limit`."""

    async def revoke_key(self, project: str, key_id: str) -> bool:
        """Revoke the key and every key minted from it by refresh, transitively.
        False when the project has no such key."""

    async def retire_key(
        self, project: str, key_id: str, by_key_id: str, by_admin: bool
    ) -> KeyRecord | None:
        """Retire the project's key `key_id` (idempotent; a revoked key stays
        revoked): it is refused from now on, and the keys refreshed from it
        are not. The key as it is after; None when the project has no such
        key; Forbidden unless `by_admin` or `by_key_id` is the key itself."""

    async def refresh_key(
        self, key_id: str, expires_in_ms: int | None, retire_previous: bool = False
    ) -> tuple[KeyRecord, str]:
        """Mint a successor of the key (same project, role, name, allowlist and
        quota). Raises Unauthorized when the key is revoked or expired, and
        ValidationError when the asked lifetime exceeds the chain's grant."""

    async def find_key(self, secret: str) -> KeyRecord | None:
        """The key whose secret this is (revoked and expired keys included)."""

    async def project_exists(self, project: str) -> bool:
        """Whether the store holds this project (a JWT's project claim must name one)."""

    async def note_identity(
        self, project: str, caller_id: str, name: str | None, app_key_id: str | None
    ) -> None:
        """Remember the name of a caller from an identity provider (SPEC §5.1),
        and the API key it came through, for the listings that name holders."""

    async def admit_request(self, key_id: str, per_minute: int) -> int | None:
        """Count a request against the key's per-minute quota, shared by every
        server: None when admitted, else milliseconds until one would be."""

    # --- locks ---------------------------------------------------------------
    async def acquire_lock(
        self, project: str, key: str, request: AcquireRequest, *, wait_alive_ms: int | None
    ) -> AcquireResult:
        """Grant, repeat, or refuse. When refused and `wait_alive_ms` is given, also
        put the caller at the back of the line (the ticket is in the result): its
        place lasts `wait_alive_ms` unless refreshed, and ends with this process."""

    async def retry_waiter(
        self, project: str, key: str, request: AcquireRequest, ticket: int, alive_ms: int
    ) -> AcquireResult:
        """Grant to a waiter if the lock is free and no live waiter is ahead of it;
        otherwise keep it in line for `alive_ms` more. The result's ticket is the
        caller's (possibly new) ticket while it still waits."""

    async def acquire_lock_set(
        self, project: str, keys: list[str], request: AcquireRequest, *,
        wait_alive_ms: int | None,
    ) -> SetAttempt:
        """All or nothing over distinct `keys` (SPEC §3.7), under one lock token.
        When refused and `wait_alive_ms` is given, the caller takes one ticket
        and a place in every key's line."""

    async def retry_set_waiter(
        self, project: str, keys: list[str], request: AcquireRequest, ticket: int,
        alive_ms: int,
    ) -> SetAttempt:
        """Grant a waiting set when it is at the head of every key's line and
        every key is free for it; otherwise keep its places for `alive_ms` more."""

    async def leave_line(self, project: str, key: str, ticket: int) -> None:
        """Give up the ticket's place in line (a lock set's, in every line)."""

    async def renew_lock(self, project: str, key: str, lock_token: str, ttl_seconds: int) -> Lease:
        """Raises LeaseLost or LeaseExpired."""

    async def release_lock(self, project: str, key: str, lock_token: str) -> bool: ...

    async def leave_set_line(self, project: str, keys: list[str], ticket: int) -> None:
        """Give up a lock set's places (one ticket) in the lines of all its keys."""

    async def force_release(self, project: str, key: str, by: ForceReleaser) -> ForceReleased:
        """End every lease of the lock (dead or alive: no live lease is left
        behind). Raises Forbidden, changing nothing, when `by` may not end
        every live one."""

    async def get_lock(self, project: str, key: str) -> LockView: ...

    async def fence_check(self, project: str, key: str, token: int) -> FenceVerdict:
        """Whether `token` is the fencing token of the lock's live lease, and
        why not (SPEC §3.8)."""

    async def list_locks(
        self, project: str, prefix: str, after: str | None, limit: int
    ) -> list[LockView]:
        """Held locks with keys starting with `prefix`, sorted by key, after `after`."""

    # --- pools ---------------------------------------------------------------
    async def put_pool(self, project: str, name: str, config: PoolConfig) -> tuple[PoolView, bool]:
        """Create or replace a pool's configuration; True when created."""

    async def get_pool(self, project: str, name: str) -> PoolView | None: ...

    async def list_pools(
        self, project: str, prefix: str, after: str | None, limit: int
    ) -> list[PoolView]: ...

    async def delete_pool(self, project: str, name: str) -> bool:
        """Remove the pool, its slots and its line; False when there is no such pool."""

    async def acquire_slot(
        self, project: str, pool: str, *, wait_ms: int = 0, no_queue: bool = False,
        wait_alive_ms: int | None, key_id: str | None = None, session_id: str | None = None,
        cost: int | None = None,
    ) -> SlotAttempt:
        """Admit, queue, or refuse. The wait asked for (`wait_ms`; none with
        `no_queue`, SPEC §4.2's X-No-Queue) is clamped to the pool's
        configuration in the transaction that decides, and the attempt reports
        it (`SlotAttempt.wait_ms`) with that configuration; a refusal joins the
        line when `wait_alive_ms` (how long the place lasts unless refreshed) is
        given, the clamped wait is not 0 and the queue has room. Raises
        NotFound for an unknown pool, before anything else. A slot admitted
        records `key_id`, the API key that asked. With `session_id`, the slot
        is attached to that session of `key_id`'s (NotFound when it is not
        theirs, SessionLost when it has ended). `cost`: the units the call
        will spend of the pool's budget (SPEC §4.6; None: the pool's average)."""

    async def retry_slot_waiter(
        self, project: str, pool: str, ticket: int, alive_ms: int, key_id: str | None = None,
        session_id: str | None = None, cost: int | None = None,
    ) -> SlotAttempt:
        """Admit a waiter when a slot is free and no live waiter is ahead of it,
        reporting the pool's configuration as it is now (the one a slot is
        admitted under). Raises NotFound when the pool was deleted,
        SessionLost when the waiter's session ended."""

    async def list_slots(self, project: str, pool: str) -> list[SlotHolderView]:
        """The pool's live slots, oldest first. Raises NotFound for an unknown pool."""

    async def leave_slot_line(self, project: str, pool: str, ticket: int) -> None: ...

    async def renew_slot(self, project: str, pool: str, slot_id: str) -> Slot:
        """Raises NotFound (unknown, released, reclaimed, foreign) or Capped."""

    async def release_slot(
        self, project: str, pool: str, slot_id: str, report: SlotReport | None
    ) -> bool:
        """True when the slot was held. Raises NotFound for an unknown pool or a slot
        of another project or pool."""

    # --- sessions (SPEC §3.10) ---------------------------------------------------
    # A session belongs to the key that made it and to the keys refreshed from
    # it; to any other key it does not exist (NotFound). Acquires attach to one
    # through AcquireRequest.session_id and acquire_slot's `session_id`.
    async def create_session(
        self, project: str, key_id: str, ttl_seconds: int, name: str | None,
        lineage: str | None = None,
    ) -> Session:
        """A new session of the key's. `lineage` is the first key of its refresh
        chain (None: the key itself): the lineage's live sessions are bounded
        together. Raises TooManySessions."""

    async def renew_session(
        self, project: str, key_id: str, session_id: str, ttl_seconds: int
    ) -> Session:
        """Set the expiry outright, and every attached lease's and slot's with it,
        in one transaction. Raises NotFound, SessionLost or SessionExpired."""

    async def end_session(self, project: str, key_id: str, session_id: str) -> SessionEnded:
        """End the session and everything attached (reason `session_ended`).
        Raises NotFound."""

    async def get_session(self, project: str, key_id: str, session_id: str) -> SessionView:
        """Raises NotFound."""

    async def keep_waiting(
        self, lines: dict[tuple[str, str, str], list[int]], alive_ms: int
    ) -> dict[tuple[str, str, str], list[int]]:
        """Refresh waiters' places: the tickets of each line (kind, project,
        name) last `alive_ms` from now. One operation for the parked waiters
        of a process; returns, by line, the tickets that are no longer in
        line (their place ran out, or was dropped), whose waiters must
        rejoin."""

    async def reap(self) -> int:
        """Free every dead lease and slot, record the end of expired sessions, and
        drop dead waiters: those whose place was not refreshed in time, and every
        waiter of a replica (server process) that died. Return how many leases
        and slots were freed."""
