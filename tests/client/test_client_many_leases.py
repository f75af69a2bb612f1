"""One `AsyncClient` keeps thousands of leases alive, each renewed on its own:
2,000 locks of 10 s held together for 25 s (each renewed several times)
against a real server, none lost. Before the client limited its requests in flight and kept
its connections alive, about 300 such leases were the most one process held."""

from __future__ import annotations

import asyncio
import collections
import time

import httpx
import pytest

import fencepost
from fencepost.client.calls import Call
from fencepost.client.operations import acquire_call, renew_call, renew_slot_call
from fencepost.client.transport import MAX_IN_FLIGHT
from fencepost.errors import LeaseLost
from support import ServerProcess, unique_name

LEASES = 2000
TTL = 10
HOLD_S = 25.0  # the first renewal within 3.3 s, then about every 3 s: seven or so each


@pytest.mark.timeout(240)
async def test_one_client_holds_two_thousand_leases_without_losing_one(
        server: ServerProcess) -> None:
    renewed: list[float] = []
    lost: collections.Counter[str] = collections.Counter()
    prefix = unique_name("many")
    async with fencepost.AsyncClient(server.base_url, server.admin_key,
                                     on_renewed=renewed.append) as client:

        granted = 0
        all_held = asyncio.Event()

        async def hold(i: int) -> None:
            nonlocal granted
            async with client.lock(f"{prefix}-{i}", ttl=TTL, raise_on_loss=False) as held:
                granted += 1
                if granted == LEASES:
                    all_held.set()
                await all_held.wait()  # all of them held at once from here
                await asyncio.sleep(HOLD_S)
                if held.loss is not None:
                    lost[str(held.loss.reason)] += 1

        await asyncio.gather(*(hold(i) for i in range(LEASES)))

    assert not lost, dict(lost)
    # Every lease was renewed (not merely acquired with a long enough TTL).
    assert len(renewed) >= 2 * LEASES, len(renewed)
    with server.client() as admin:
        page = admin.get("/v1/locks", params={"prefix": prefix, "limit": 10})
        assert page.status_code == 200 and not page.json()["locks"], page.text  # all released


async def test_renewals_go_before_other_waiting_requests(server: ServerProcess) -> None:
    """With every turn to send taken, a renewal that starts waiting after many
    acquires is sent before them: a late renewal loses a lease, a late acquire
    only waits."""
    order: list[str] = []

    class Recording(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.AsyncHTTPTransport()
            self.gate = asyncio.Event()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            order.append(request.method)
            await self.gate.wait()  # hold every turn until all requests are queued
            return await self.inner.handle_async_request(request)

        async def aclose(self) -> None:
            await self.inner.aclose()

    transport = Recording()
    prefix = unique_name("turns")
    async with fencepost.AsyncClient(server.base_url, server.admin_key,
                                     transport=transport) as setup:
        transport.gate.set()
        lease = await setup.acquire_lock(f"{prefix}-held", ttl=30)
    order.clear()
    transport = Recording()
    async with fencepost.AsyncClient(server.base_url, server.admin_key,
                                     transport=transport) as client:
        acquires = [asyncio.create_task(client.acquire_lock(f"{prefix}-{i}", ttl=30))
                    for i in range(MAX_IN_FLIGHT + 20)]
        while len(order) < MAX_IN_FLIGHT:  # the first acquires hold every turn
            await asyncio.sleep(0.01)
        renewal = asyncio.create_task(client.renew_lock(lease.key, lease.lock_token, ttl=30))
        await asyncio.sleep(0.1)
        assert order == ["PUT"] * MAX_IN_FLIGHT  # the rest wait in the client
        transport.gate.set()
        await renewal
        granted = await asyncio.gather(*acquires)
        assert order[MAX_IN_FLIGHT] == "PATCH", order[: MAX_IN_FLIGHT + 2]
        assert len(granted) == MAX_IN_FLIGHT + 20
        for got in [lease, *granted]:
            await client.release_lock(got.key, got.lock_token)


def test_renewal_calls_are_marked_and_others_are_not() -> None:
    assert renew_call("k", "t", 10).renews and renew_slot_call("p", "s").renews
    plain: Call[object] = acquire_call("k", "t", ttl=10, wait_until=None)  # type: ignore[assignment]
    assert not plain.renews


def test_on_renewed_is_told_when_each_renewal_that_got_through_was_sent(
        server: ServerProcess) -> None:
    sent: list[float] = []
    with fencepost.Client(server.base_url, server.admin_key, on_renewed=sent.append) as client:
        lease = client.acquire_lock(unique_name("told"), ttl=30)
        before = time.monotonic()
        client.renew_lock(lease.key, lease.lock_token, ttl=30)
        after = time.monotonic()
        assert len(sent) == 1 and before <= sent[0] <= after
        client.release_lock(lease.key, lease.lock_token)
        with pytest.raises(LeaseLost):
            client.renew_lock(lease.key, lease.lock_token, ttl=30)
        assert len(sent) == 1  # a refused renewal is not reported
