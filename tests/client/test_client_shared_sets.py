"""`client.lock(key, shared=True)` and `client.lock_many(keys)`: readers hold
together, a set is all or none, every key is renewed and released, and the
first key lost is the hold's one loss signal; sync and async alike."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

import fencepost
from client_support import Recorder
from fencepost.errors import LeaseLost, LockHeld
from support import unique_name, wait_until

TTL = 6  # renewed every 2 s


def lock_state(http: httpx.Client, key: str) -> dict[str, Any]:
    resp = http.get(f"/v1/locks/{key}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_readers_hold_together_and_keep_writers_out(client: fencepost.Client,
                                                    admin_http: httpx.Client) -> None:
    key = unique_name("readers")
    with client.lock(key, ttl=TTL, shared=True) as first, \
            client.lock(key, ttl=TTL, shared=True) as second:
        assert first.lease.mode == second.lease.mode == "shared"
        assert second.fencing_token > first.fencing_token
        state = lock_state(admin_http, key)
        assert (state["mode"], state["holders"]) == ("shared", 2)
        info = client.get_lock(key)
        assert (info.mode, info.holders) == ("shared", 2)
        with pytest.raises(LockHeld):
            client.acquire_lock(key, ttl=TTL)
    assert lock_state(admin_http, key)["held"] is False


def test_lock_many_renews_every_key_and_releases_them_all(
    client: fencepost.Client, recorder: Recorder, admin_http: httpx.Client,
) -> None:
    keys = [unique_name("many-a"), unique_name("many-b")]
    with client.lock_many(keys, ttl=TTL, operation="migrate") as held:
        assert [lease.key for lease in held.leases] == keys
        tokens = held.fencing_tokens
        assert set(tokens) == set(keys)
        for key in keys:
            assert lock_state(admin_http, key)["fencing_token"] == tokens[key]
        wait_until(lambda: all(recorder.count("PATCH", k) >= 1 for k in keys),
                   "a renewal of every key", timeout=TTL)
    for key in keys:
        assert lock_state(admin_http, key)["held"] is False


def test_lock_many_is_all_or_nothing(client: fencepost.Client,
                                     admin_http: httpx.Client) -> None:
    free, busy = unique_name("free"), unique_name("busy")
    with client.lock(busy, ttl=TTL):
        with pytest.raises(LockHeld) as refused:
            with client.lock_many([free, busy], ttl=TTL):
                pass
        assert refused.value.extra["key"] == busy
    assert lock_state(admin_http, free)["held"] is False


def test_one_key_lost_is_the_sets_one_loss(client: fencepost.Client,
                                           admin_http: httpx.Client) -> None:
    keys = [unique_name("lose-a"), unique_name("lose-b")]
    losses: list[Any] = []
    with pytest.raises(LeaseLost):
        with client.lock_many(keys, ttl=TTL, on_lost=losses.append) as held:
            assert admin_http.delete(f"/v1/locks/{keys[1]}").json()["released"]
            assert held.lost_event.wait(TTL)
            assert held.lost and held.loss is not None
            assert held.loss.reason == "force_released"
    assert losses == [held]
    assert lock_state(admin_http, keys[0])["held"] is False  # the rest released on exit


async def test_async_lock_many_and_shared(aclient: fencepost.AsyncClient,
                                          admin_http: httpx.Client) -> None:
    keys = [unique_name("async-a"), unique_name("async-b")]
    async with aclient.lock_many(keys, ttl=TTL, shared=True) as held:
        async with aclient.lock(keys[0], ttl=TTL, shared=True) as reader:
            assert lock_state(admin_http, keys[0])["holders"] == 2
            assert reader.fencing_token not in held.fencing_tokens.values()
        with pytest.raises(LockHeld):
            await aclient.acquire_lock_set(keys, ttl=TTL)
    await asyncio.sleep(0)
    for key in keys:
        assert lock_state(admin_http, key)["held"] is False


def test_acquire_lock_set_retries_are_idempotent(client: fencepost.Client) -> None:
    keys = [unique_name("idem-a"), unique_name("idem-b")]
    first = client.acquire_lock_set(keys, ttl=TTL)
    again = client.acquire_lock_set(keys, ttl=TTL, token=first.lock_token)
    assert first.created and not again.created
    assert [lease.fencing_token for lease in again.leases] == \
        [lease.fencing_token for lease in first.leases]
    for key in keys:
        assert client.release_lock(key, first.lock_token)
