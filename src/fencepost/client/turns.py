"""Turns to send: how many requests one `AsyncClient` has on the wire at once.

httpx's connection pool looks at every queued request and every connection
each time a request starts or ends, so thousands of requests queued in it cost
time quadratic in their number. Requests past the limit wait here instead, in
queues that cost the same whatever their length, and lease renewals go first:
a late renewal loses a lease, a late acquire or release only waits.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from fencepost.client.calls import Call


class Turns:
    """At most `size` turns taken at once; a waiting renewal (`urgent`) gets the
    next free turn before any other waiting request."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._others: deque[asyncio.Future[None]] = deque()

    async def take(self, *, urgent: bool, timeout: float | None) -> None:
        """Wait for a turn, at most `timeout` seconds (`TimeoutError` then)."""
        if self._free > 0 and not self._urgent and not self._others:
            self._free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._urgent if urgent else self._others).append(granted)
        try:
            async with asyncio.timeout(timeout):
                await granted
        except BaseException:
            # Cancelled or timed out: a waiter still queued is skipped by
            # `give_back`; one that was handed its turn meanwhile passes it on.
            if granted.done() and not granted.cancelled():
                self.give_back()
            granted.cancel()
            raise

    def give_back(self) -> None:
        """Return a turn: to the first live waiter, renewals first."""
        for queue in (self._urgent, self._others):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self._free += 1


def turn_limit(call: Call[Any], default_timeout: float) -> float | None:
    """How long `call` may wait for its turn: a renewal no longer than its
    timeout (its keeper must learn in time that the lease runs out); any other
    call as long as the calls before it take, each ending within its timeout."""
    return call.read_timeout(default_timeout, time.monotonic()) if call.renews else None
