"""Opt-in refresh of the client's own API key before it expires (SPEC §5),
written once for both clients as a sans-I/O program and its bookkeeping.

The client learns its key's expiry (from `whoami`, or from the answer of its
last refresh), and once two thirds of the key's remaining life have passed it
asks `POST /v1/keys/refresh` for a successor, swaps it in for its next
requests, and hands it to the caller's callback to store. The old key keeps
working until its own expiry, so a request in flight meanwhile is unharmed;
or, with `retire_previous`, it is retired as the successor is minted, and a
request the old key sent that is refused for it (401: nothing was done) is
sent once more with the new key.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from fencepost.client.bearer_token import BearerToken
from fencepost.client.calls import Call
from fencepost.client.models import CreatedKey, WhoAmI
from fencepost.client.operations import Op, refresh_key, whoami
from fencepost.client.transport import Settings
from fencepost.errors import FencepostError, Unauthorized

# Refresh once this share of the key's remaining life (when learned) is left.
REFRESH_AT_REMAINING = 1 / 3
# After a failed refresh, wait this long (or less, near the expiry) before the next try.
RETRY_AFTER_FAILURE_S = 5.0

OnKeyRefresh = Callable[[CreatedKey], Any]
"""Called with each successor (its secret is `.key`); may be async on `AsyncClient`."""


class KeyRefresh:
    """When the client's key is due for refresh, on the monotonic clock."""

    def __init__(self, wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 retire_previous: bool = False) -> None:
        self._wall = wall
        self.retire_previous = retire_previous
        self._monotonic = monotonic
        self.known = False  # whether the key's expiry has been learned
        self.due_at: float | None = None  # None: the key never expires

    def learn(self, expires_at: datetime | None, created_at: datetime | None = None) -> None:
        """Set the schedule from the key's expiry: its life is measured from
        `created_at` when known (a fresh successor), else from now."""
        self.known = True
        if expires_at is None:
            self.due_at = None
            return
        if created_at is not None:
            remaining = (expires_at - created_at).total_seconds()
        else:
            remaining = expires_at.timestamp() - self._wall()
        self.due_at = self._monotonic() + max(remaining, 0.0) * (1 - REFRESH_AT_REMAINING)

    def failed(self, retry_after_s: float | None = None) -> None:
        """Try again after the server's `retry_after_s` when it said one (a
        lineage refreshes at most once a minute), else after a short while."""
        if self.due_at is not None:
            self.due_at = self._monotonic() + (
                RETRY_AFTER_FAILURE_S if retry_after_s is None else max(retry_after_s, 0.0))

    def is_due(self) -> bool:
        if not self.known:
            return True  # learn the expiry first
        return self.due_at is not None and self._monotonic() >= self.due_at


def refresh_if_due(state: KeyRefresh) -> Op[CreatedKey | None]:
    """Learn the key's expiry if unknown, and mint its successor when due."""
    if not state.known:
        me: WhoAmI = yield from whoami()
        state.learn(me.expires_at)
    if not state.is_due():
        return None
    created: CreatedKey = yield from refresh_key(retire_previous=state.retire_previous)
    state.learn(created.expires_at, created.created_at)
    return created


class CurrentKey:
    """What both clients share to send the latest key: the swap, and the
    headers of a call with it."""

    settings: Settings
    _key_refresh: KeyRefresh | None
    _bearer: BearerToken | None = None

    def _use_key(self, secret: str) -> None:
        # One reference swap: a request being built on another thread reads
        # either the old settings or the new, never half of each.
        self.settings = dataclasses.replace(self.settings, api_key=secret)

    def _retired_since(self, error: FencepostError, used: str | None) -> bool:
        """Whether `error` refused a request sent with the key `used` that this
        client has swapped for its successor since: the old key may be retired
        (`retire_previous`), and a 401 did nothing, so sending it again with
        the current key is safe."""
        return (isinstance(error, Unauthorized) and self._key_refresh is not None
                and self._key_refresh.retire_previous and used != self.settings.api_key)

    def _headers(self, call: Call[Any]) -> dict[str, str]:
        headers = call.all_headers()
        if self._bearer is not None and self._bearer.cached is not None:
            # The user's token as the bearer; the key, if any, is the
            # application acting for that user (SPEC §5.1).
            headers["Authorization"] = f"Bearer {self._bearer.cached}"
            if self.settings.api_key:
                headers["X-Api-Key"] = self.settings.api_key
        elif self._key_refresh is not None and self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key}"  # the latest key
        return headers
