"""The client's pool configuration and learned state (SPEC §4.1 PATCH, §4.5):
`update_pool` changes only what it is given, `PoolInfo.learned` shows what the
pool learned."""

from __future__ import annotations

from datetime import datetime

import pytest

import fencepost
from fencepost.errors import NotFound, ValidationError
from support import ServerProcess, unique_name


def test_update_pool_changes_only_the_given_fields(client: fencepost.Client) -> None:
    name = unique_name("pool")
    client.set_pool(name, limit=4, queue_size=7, term_ms=6000, rpm=30, adaptive=True,
                    min_limit=2)
    updated = client.update_pool(name, limit=9)
    assert updated.limit == 9
    assert (updated.queue_size, updated.term_ms, updated.rpm, updated.adaptive,
            updated.min_limit) == (7, 6000, 30, True, 2)
    cleared = client.update_pool(name, unset=["rpm"])
    assert cleared.rpm is None and cleared.limit == 9 and cleared.adaptive is True


def test_update_pool_refuses_bad_fields_and_unknown_pools(client: fencepost.Client) -> None:
    name = unique_name("pool")
    client.set_pool(name, limit=4, min_limit=2)
    with pytest.raises(ValidationError):
        client.update_pool(name, limit=1)  # below the kept min_limit
    assert client.get_pool(name).limit == 4
    with pytest.raises(NotFound):
        client.update_pool(unique_name("nopool"), limit=3)


async def test_pool_info_shows_what_was_learned(server: ServerProcess) -> None:
    name = unique_name("pool")
    async with fencepost.AsyncClient(server.base_url, server.admin_key) as c:
        await c.set_pool(name, limit=10, adaptive=True)
        fresh = await c.get_pool(name)
        assert fresh.learned is not None and fresh.learned.paused_until_at is None
        # A new adaptive pool starts slow (SPEC §4.5): 2 slots, doubling as calls succeed.
        assert fresh.learned.last_hint is None and fresh.learned.effective_limit == 2
        assert fresh.learned.slow_start is True
        grant = await c.acquire_slot(name)
        spent = fencepost.Outcome(status=429, headers={
            "x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "30s", "retry-after": "30"})
        assert await c.release_slot(name, grant.slot_id, spent)
        info = await c.get_pool(name)
    learned = info.learned
    assert learned is not None
    assert isinstance(learned.paused_until_at, datetime)
    assert learned.effective_rpm == 2 == info.effective_rpm and learned.window_ms == 60_000
    assert learned.last_hint is not None
    assert (learned.last_hint.source, learned.last_hint.retry_after_ms) == ("reset", 30_000)
    assert info.to_dict()["learned"]["last_hint"]["source"] == "reset"
