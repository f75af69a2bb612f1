"""The writer's memory of the leases it last wrote, so that a renewal can be
decided by the rules without reading the row first.

Only a hint: a write decided on a remembered lease is conditional on the row
still being exactly that lease (its fencing token names the grant; a renewal
changes only the expiry), and falls back to reading the row when it is not (the
lease was renewed or ended by another replica, a batch was rolled back, the
entry was evicted). A lock may have several leases (shared locks, SPEC §3.6),
so a lease is remembered by its lock token.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from fencepost.core.leases import Lease

DEFAULT_CAPACITY = 4096


class KnownLeases:
    """Shared by the writer's threads (one per connection), hence the lock."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._leases: OrderedDict[tuple[str, str, str], Lease] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, project: str, key: str, lock_token: str) -> Lease | None:
        with self._lock:
            return self._leases.get((project, key, lock_token))

    def put(self, project: str, lease: Lease) -> None:
        where = (project, lease.key, lease.lock_token)
        with self._lock:
            self._leases[where] = lease
            self._leases.move_to_end(where)
            if len(self._leases) > self._capacity:
                self._leases.popitem(last=False)

    def forget(self, project: str, lease: Lease) -> None:
        with self._lock:
            self._leases.pop((project, lease.key, lease.lock_token), None)
