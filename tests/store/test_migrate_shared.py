"""Migrations 0009 and 0010 on a store with data: a lock held before them
stays held (same token, same fencing token, renewable), a waiter keeps its
place, and tickets drawn afterwards come after every ticket given before."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from fencepost.core.leases import AcquireRequest, Busy, Granted, Mode

from . import migrating
from .conftest import FakeClock

P = "default"
BEFORE = "0008_primitives"
LOCK_TOKEN = str(uuid.uuid4())
WAITER_TOKEN = str(uuid.uuid4())


def seed(migrator: Any, now_ms: int) -> None:
    """A held lock and one waiter in its line, written as the old schema had them."""
    cursor = migrator.connection.cursor()
    cursor.execute(
        "INSERT INTO locks (project, key, lock_token, fencing_token, acquired_ms, expires_ms, "
        "deadline_ms, dies_ms, operation, metadata, on_expiry, key_id, lock_delay_ms) "
        f"VALUES ('{P}', 'held', '{LOCK_TOKEN}', 41, {now_ms}, {now_ms + 60_000}, "
        f"{now_ms + 86_400_000}, {now_ms + 60_000}, 'deploy', NULL, 'release', NULL, 0)"
    )
    for _ in range(3):  # tickets 1..3 given out; two of them gone already
        cursor.execute(
            "INSERT INTO lock_waiters (project, key, lock_token, alive_until_ms) "
            f"VALUES ('{P}', 'held', '{WAITER_TOKEN}', {now_ms + 600_000})"
        )
    cursor.execute("DELETE FROM lock_waiters WHERE ticket <> 2")
    migrator.connection.commit()
    migrator.connection.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def old_store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock):  # type: ignore[no-untyped-def]
    yield from migrating.old_store(
        request.param, tmp_path, clock, BEFORE, lambda migrator: seed(migrator, clock.now))


async def test_a_held_lock_and_its_line_survive_the_migration(old_store, clock):
    await old_store.open()
    try:
        view = await old_store.get_lock(P, "held")
        assert view.lease is not None and view.holders == 1
        assert view.lease.lock_token == LOCK_TOKEN and view.lease.fencing_token == 41
        assert view.lease.mode is Mode.EXCLUSIVE and view.waiters == 1
        renewed = await old_store.renew_lock(P, "held", LOCK_TOKEN, 30)
        assert renewed.fencing_token == 41
        shared = await old_store.acquire_lock(
            P, "held", AcquireRequest(str(uuid.uuid4()), 30, mode=Mode.SHARED),
            wait_alive_ms=60_000,
        )
        assert isinstance(shared.outcome, Busy) and shared.ticket is not None
        assert shared.ticket > 3  # after every ticket the old sequence gave
        assert await old_store.release_lock(P, "held", LOCK_TOKEN)
        waiter = AcquireRequest(WAITER_TOKEN, 30)
        first = await old_store.retry_waiter(P, "held", waiter, 2, 60_000)
        assert isinstance(first.outcome, Granted)  # the old waiter kept its place
    finally:
        await old_store.close()
