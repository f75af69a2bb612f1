"""`client.slot(pool, ...)`: take a slot, renew it at the pool's interval, release
it with the reported outcome (SPEC §4.2-§4.4); notice a lost slot."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import fencepost
from client_support import Recorder
from fencepost.client.outcome import outcome_from_response
from fencepost.errors import LeaseLost, QueueTimeout, TooManyRequests
from support import ServerProcess, unique_name, wait_for


def make_pool(client: fencepost.Client, **config: int) -> str:
    name = unique_name("pool")
    client.set_pool(name, **{"limit": 1, **config})
    return name


def test_sync_slot_renews_and_releases_with_outcome(client: fencepost.Client,
                                                    recorder: Recorder) -> None:
    pool = make_pool(client, term_ms=1500)
    upstream = httpx.Response(429, headers={"retry-after": "1",
                                            "x-ratelimit-remaining-requests": "0",
                                            "set-cookie": "secret=1"})
    with client.slot(pool) as slot:
        assert slot.slot_id.startswith("slot_")
        assert slot.grant.pool == pool and slot.grant.renew_interval_ms == 500
        assert client.get_pool(pool).in_use == 1
        assert wait_for(lambda: recorder.count("POST", "/renew") >= 2, timeout=3)
        outcome = slot.report(upstream)
        slot.report(status=200)
    assert outcome.status == 429 and outcome.throttled == 1
    assert "set-cookie" not in outcome.headers  # only rate-limit headers are passed on
    assert slot.outcome is not None and slot.outcome.status == 200
    assert slot.outcome.throttled == 1
    info = client.get_pool(pool)
    assert info.in_use == 0
    assert info.stats is not None and info.stats["released"] == 1


def test_sync_slot_full_pool_fails_fast_or_times_out(client: fencepost.Client) -> None:
    pool = make_pool(client)
    with client.slot(pool):
        with pytest.raises(TooManyRequests):
            with client.slot(pool):
                pass
        with pytest.raises(QueueTimeout):
            with client.slot(pool, wait=0.3):
                pass
    assert client.get_pool(pool).in_use == 0


def test_sync_slot_waits_for_a_free_one(client: fencepost.Client) -> None:
    pool = make_pool(client, term_ms=1000)
    first = client.acquire_slot(pool)  # never renewed: reclaimed after one term
    with client.slot(pool, wait=10) as slot:
        assert slot.slot_id != first.slot_id


def test_sync_slot_lost_when_the_pool_is_deleted(client: fencepost.Client) -> None:
    pool = make_pool(client, term_ms=1500)
    with pytest.raises(LeaseLost) as raised:
        with client.slot(pool) as slot:
            client.delete_pool(pool)
            assert slot.lost_event.wait(timeout=3)
    assert raised.value.reason == "not_found"


def test_sync_slot_lost_at_its_request_deadline(client: fencepost.Client) -> None:
    pool = make_pool(client, term_ms=1000, request_timeout_ms=1500)
    with client.slot(pool, raise_on_loss=False) as slot:
        assert slot.lost_event.wait(timeout=4)
        assert slot.loss is not None and slot.loss.reason == "capped"


async def test_async_slot_cancels_the_body_on_loss(aclient: fencepost.AsyncClient) -> None:
    pool = unique_name("pool")
    await aclient.set_pool(pool, limit=2, term_ms=1500)
    with pytest.raises(LeaseLost):
        async with aclient.slot(pool, cancel_on_loss=True):
            await aclient.delete_pool(pool)
            await asyncio.sleep(10)


async def test_async_slot_acquire_release_and_report(aclient: fencepost.AsyncClient) -> None:
    pool = unique_name("pool")
    await aclient.set_pool(pool, limit=2)
    async with aclient.slot(pool) as slot:
        assert (await aclient.get_pool(pool)).in_use == 1
        assert slot.grant.remaining_slots == 1
        slot.report(status=503, headers={"Retry-After": "2"}, retry_after_ms=2000)
    assert slot.outcome is not None and slot.outcome.to_body() == {
        "status": 503, "retry_after_ms": 2000, "headers": {"retry-after": "2"}}
    info = await aclient.get_pool(pool)
    assert info.in_use == 0


def test_outcome_from_response_counts_throttles() -> None:
    first = outcome_from_response(httpx.Response(429))
    second = outcome_from_response(httpx.Response(429), previous=first)
    third = outcome_from_response(httpx.Response(200, headers={"ratelimit": "limit=10"}),
                                  previous=second)
    assert (first.throttled, second.throttled, third.throttled) == (1, 2, 2)
    assert third.status == 200 and third.headers == {"ratelimit": "limit=10"}


def test_slot_with_bad_pool_name_fails_before_any_request(server: ServerProcess) -> None:
    with fencepost.Client(server.base_url, server.admin_key) as c:
        with pytest.raises(fencepost.errors.ValidationError):
            c.slot("no/slashes")
