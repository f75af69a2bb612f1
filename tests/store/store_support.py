"""Helpers shared by the Store conformance tests (run on SQLite and PostgreSQL alike)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fencepost.core.leases import AcquireRequest, Granted
from fencepost.store.base import ForceReleaser, Freed, lock_freed

P = "default"  # the project every conformance test works in
ADMIN = ForceReleaser("key_admin", is_admin=True)
# How long a test waits for an event that must come. Never a bound on speed:
# reaching it means the event was lost.
GUARD_S = 60.0


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


async def hear(sender: Any, heard: list[Freed], name: str) -> None:
    """Free the lock `name` on the store `sender` until `heard` (a freed
    listener of another store) has its event.

    Once it has, every event that `sender` published after the listener began
    listening has been heard too: PostgreSQL delivers notifications in commit
    order, and one sender's datagrams to a local peer arrive in order. So a
    test hears a fresh name first (the listener is up: on PostgreSQL it
    LISTENs from a thread that may still be connecting when open() returns,
    and a notification sent before then is heard by nobody), then does what
    it checks, then hears another fresh name: whatever it expected and did not
    hear by then was lost, not late."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GUARD_S
    while lock_freed(P, name) not in heard:
        assert loop.time() < deadline, f"{name}, freed again and again, was never heard"
        # A force release: its wake-up goes to every process, where a
        # holder's own release with nobody in line stays in the sender's.
        await grant(sender, name)
        await sender.force_release(P, name, ADMIN)
        for _ in range(20):
            if lock_freed(P, name) in heard:
                return
            await asyncio.sleep(0.05)


async def warmed_pool(store: Any, pool: str, limit: int, clock: Any) -> None:
    """Pool `pool` adaptive at `limit` and past its slow start (SPEC §4.5):
    successes reported until its effective limit is `limit`."""
    from fencepost.core.slots import PoolConfig
    from fencepost.store.base import SlotReport

    await store.put_pool(P, pool, PoolConfig(limit=limit, adaptive=True))
    for _ in range(limit):
        if (await store.get_pool(P, pool)).effective_limit == limit:
            return
        attempt = await store.acquire_slot(P, pool, wait_alive_ms=None)
        assert attempt.slot is not None, attempt
        clock.advance(50)
        await store.release_slot(P, pool, attempt.slot.slot_id,
                                 SlotReport(status=200, report_json="{}"))
    raise AssertionError("the pool did not leave its slow start")
