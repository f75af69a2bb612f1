"""A pool's unit budget from the Python client (SPEC §4.6): `cost_per_minute`
in set_pool / update_pool, `slot(cost=...)` and `report(cost=...)`."""

from __future__ import annotations

import pytest

import fencepost
from fencepost.errors import TooManyRequests
from support import ServerProcess, unique_name


def test_a_slot_declares_its_cost_and_reports_what_it_spent(server: ServerProcess) -> None:
    pool = unique_name("pool")
    with fencepost.Client(server.base_url, server.admin_key) as client:
        info = client.set_pool(pool, limit=50, cost_per_minute=60_000)
        assert info.cost_per_minute == 60_000
        with client.slot(pool, cost=5_000) as held:
            assert held.grant.remaining_cost is not None
            assert held.grant.remaining_cost <= 55_000
            held.report(status=200, cost=0)  # answered from a cache: spent nothing
        with client.slot(pool, cost=5_000):  # fits: the first gave its units back
            pass
        with pytest.raises(TooManyRequests):  # 5 s of the budget owed: the next waits
            with client.slot(pool, cost=1):
                pass
        learned = client.get_pool(pool).learned
        assert learned is not None and learned.effective_cost_per_minute == 60_000
        assert learned.average_cost is not None
        cleared = client.update_pool(pool, unset=["cost_per_minute"])
        assert cleared.cost_per_minute is None


async def test_the_async_client_and_a_session_take_a_cost(server: ServerProcess) -> None:
    pool = unique_name("pool")
    async with fencepost.AsyncClient(server.base_url, server.admin_key) as client:
        await client.set_pool(pool, limit=50, cost_per_minute=60_000)
        async with client.session(ttl=30) as session:
            async with session.slot(pool, cost=5_000) as held:
                assert held.grant.remaining_cost is not None
                assert held.grant.remaining_cost <= 55_000
        with pytest.raises(TooManyRequests):
            async with client.slot(pool, cost=10):
                pass
