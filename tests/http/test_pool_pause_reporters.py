"""One holder cannot pause a pool for everyone for long (SPEC §4.5): a single
caller's report that the upstream's budget is empty for ten minutes pauses the
pool for at most 60 s; a second caller's report that agrees lets the pause run
as long as both say. On both stores, over HTTP, with two member keys."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from fencepost.core.governor import MAX_PAUSE_MS, ONE_REPORTER_PAUSE_MS
from pg_support import server_on
from support import ServerProcess, unique_name

TEN_MINUTES = {"status": 429, "rate": {"remaining": 0, "reset_ms": 600_000}}


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    with server_on(request.param, tmp_path) as started:
        yield started


def _paused_for_ms(client: httpx.Client, pool: str) -> float | None:
    until = client.get(f"/v1/pools/{pool}").json()["learned"]["paused_until_at"]
    if until is None:
        return None
    at = datetime.fromisoformat(until.replace("Z", "+00:00")).timestamp()
    return at * 1000 - time.time() * 1000


def _pool(admin: httpx.Client) -> str:
    pool = unique_name("pause")
    made = admin.put(f"/v1/pools/{pool}", json={"limit": 5, "adaptive": True})
    assert made.status_code == 201, made.text
    return pool


def _slot(client: httpx.Client, pool: str) -> str:
    got = client.post(f"/v1/pools/{pool}/lock/acquire")
    assert got.status_code == 200, got.text
    return str(got.json()["slot_id"])


def _release(client: httpx.Client, pool: str, slot: str) -> None:
    done = client.post(f"/v1/pools/{pool}/lock/{slot}/release", json=TEN_MINUTES)
    assert done.json() == {"released": True}, done.text


def test_one_caller_pauses_a_pool_for_a_minute_at_most(server: ServerProcess) -> None:
    """Two slots of one key, both reporting a ten-minute empty budget: one
    caller's word, however often said."""
    hostile = server.create_key("member", name="hostile")["key"]
    with server.client() as admin, server.client(hostile) as bad:
        pool = _pool(admin)
        slots = [_slot(bad, pool), _slot(bad, pool)]
        for slot in slots:
            _release(bad, pool, slot)
            paused = _paused_for_ms(admin, pool)
            assert paused is not None and 0 < paused <= ONE_REPORTER_PAUSE_MS, paused
        # (An acquire now may be refused, or let through as the pause's probe.)


def test_two_callers_agreeing_pause_it_as_long_as_they_say(server: ServerProcess) -> None:
    one = server.create_key("member", name="one")["key"]
    other = server.create_key("member", name="other")["key"]
    with server.client() as admin, server.client(one) as a, server.client(other) as b:
        pool = _pool(admin)
        first, second = _slot(a, pool), _slot(b, pool)
        _release(a, pool, first)
        assert (_paused_for_ms(admin, pool) or 0) <= ONE_REPORTER_PAUSE_MS
        _release(b, pool, second)
        paused = _paused_for_ms(admin, pool)
        assert paused is not None and ONE_REPORTER_PAUSE_MS < paused <= MAX_PAUSE_MS, paused
