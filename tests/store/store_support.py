"""Helpers shared by the Store conformance tests (run on SQLite and PostgreSQL alike)."""

from __future__ import annotations

import uuid
from typing import Any

from fencepost.core.leases import AcquireRequest, Granted
from fencepost.store.base import ForceReleaser

P = "default"  # the project every conformance test works in
ADMIN = ForceReleaser("key_admin", is_admin=True)


def token() -> str:
    return str(uuid.uuid4())


def req(tok: str | None = None, ttl: int = 30, **kw: Any) -> AcquireRequest:
    return AcquireRequest(tok or token(), ttl, **kw)


async def grant(store: Any, key: str = "k", tok: str | None = None, ttl: int = 30,
                **kw: Any) -> Any:
    """The lease of a fail-fast acquire that must be granted."""
    result = await store.acquire_lock(P, key, req(tok, ttl, **kw), wait_alive_ms=None)
    assert isinstance(result.outcome, Granted), result
    return result.outcome.lease
