"""The writer's memory of what it last wrote, so that a hot path can be decided
by the rules without reading the row first: the leases a renewal judges, the
pools an acquire admits to (pools.py).

Only a hint: a write decided on a remembered lease is conditional on the row
still being exactly that lease (its fencing token names the grant; a renewal
changes only the expiry), and falls back to reading the row when it is not (the
lease was renewed or ended by another replica, a batch was rolled back, the
entry was evicted). A lock may have several leases (shared locks, SPEC §3.6),
so a lease is remembered by its lock token.

It also remembers which locks were last found held by someone else
(`contended`): a fail-fast acquire of such a lock first reads what its refusal
is decided on, instead of a guarded insert, so that on PostgreSQL a hot lock's
acquires are refused from one pipeline instead of two round trips each.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, Hashable, TypeVar

from fencepost.core.leases import Lease

DEFAULT_CAPACITY = 4096

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Known(Generic[K, V]):
    """A bounded map, the least recently written entry evicted first. Shared
    by the writer's threads (one per connection), hence the lock."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, where: K) -> V | None:
        with self._lock:
            return self._entries.get(where)

    def put(self, where: K, value: V) -> None:
        with self._lock:
            self._entries[where] = value
            self._entries.move_to_end(where)
            if len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def forget(self, where: K) -> None:
        with self._lock:
            self._entries.pop(where, None)


class KnownLeases:
    """Leases by (project, key, lock token)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._leases: Known[tuple[str, str, str], Lease] = Known(capacity)
        self._contended: Known[tuple[str, str], bool] = Known(capacity)

    def get(self, project: str, key: str, lock_token: str) -> Lease | None:
        return self._leases.get((project, key, lock_token))

    def put(self, project: str, lease: Lease) -> None:
        self._leases.put((project, lease.key, lease.lock_token), lease)

    def forget(self, project: str, lease: Lease) -> None:
        self._leases.forget((project, lease.key, lease.lock_token))

    def contended(self, project: str, key: str) -> bool:
        """Whether the last acquire of this lock that was decided found it busy."""
        return self._contended.get((project, key)) is not None

    def found(self, project: str, key: str, busy: bool) -> None:
        """Remember how an acquire of this lock was decided (only a hint)."""
        if busy:
            self._contended.put((project, key), True)
        else:
            self._contended.forget((project, key))
