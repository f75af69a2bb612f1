"""`client.lock(...)`: acquire, renew in the background, release on exit, notice
loss; the same behaviour from the sync and the async client."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

import fencepost
from client_support import FAST_RETRIES, Recorder
from fencepost.errors import LeaseLost, LockHeld
from support import ServerProcess, unique_name, wait_for

TTL = 6  # renewed every 2 s
# How long a test waits for a loss the client must notice: a guard, far beyond
# the renewal that notices it. The tests count renewals instead of seconds: the
# loss is noticed by the first renewal sent after it, however slow the machine.
NOTICED_GUARD_S = 60


def renewals_since(recorder: Recorder, key: str, since: float) -> int:
    return recorder.count("PATCH", key, since=since)


def lock_state(http: httpx.Client, key: str) -> dict[str, Any]:
    resp = http.get(f"/v1/locks/{key}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


# --- sync ------------------------------------------------------------------------


def test_sync_lock_acquires_renews_and_releases(client: fencepost.Client, recorder: Recorder,
                                                admin_http: httpx.Client) -> None:
    key = unique_name()
    with client.lock(key, ttl=TTL, operation="report", metadata={"job": 7}) as held:
        assert held.held and not held.lost
        state = lock_state(admin_http, key)
        assert state["held"] and state["fencing_token"] == held.fencing_token
        assert state["operation"] == "report" and state["metadata"] == {"job": 7}
        first_expiry = held.expires_at
        assert wait_for(lambda: recorder.count("PATCH", key) >= 1, timeout=TTL)
        assert wait_for(lambda: held.expires_at > first_expiry, timeout=2)
        assert lock_state(admin_http, key)["fencing_token"] == held.fencing_token
    assert not held.held
    assert lock_state(admin_http, key)["held"] is False


def test_sync_lock_releases_when_the_body_raises(client: fencepost.Client,
                                                 admin_http: httpx.Client) -> None:
    key = unique_name()
    with pytest.raises(RuntimeError, match="boom"):
        with client.lock(key, ttl=TTL):
            raise RuntimeError("boom")
    assert lock_state(admin_http, key)["held"] is False


def test_sync_lock_fails_fast_or_waits(client: fencepost.Client) -> None:
    key = unique_name()
    with client.lock(key, ttl=TTL):
        with pytest.raises(LockHeld):
            with client.lock(key, ttl=TTL):
                pass
    done = threading.Event()

    def later_release(token: str) -> None:
        time.sleep(0.5)
        client.release_lock(key, token)
        done.set()

    first = client.acquire_lock(key, ttl=TTL)
    threading.Thread(target=later_release, args=(first.lock_token,)).start()
    with client.lock(key, ttl=TTL, wait=10) as held:
        assert done.is_set()
        assert held.fencing_token > first.fencing_token


def test_sync_loss_by_force_release_is_noticed_within_one_interval(
        client: fencepost.Client, admin_http: httpx.Client, recorder: Recorder) -> None:
    key = unique_name()
    seen: list[Any] = []
    with pytest.raises(LeaseLost) as raised:
        with client.lock(key, ttl=TTL, on_lost=seen.append) as held:
            assert admin_http.delete(f"/v1/locks/{key}").json()["released"] is True
            forced = time.monotonic()
            assert held.lost_event.wait(timeout=NOTICED_GUARD_S)
            # Noticed by the first renewal after the loss (one may have left
            # before the force release's answer came back).
            assert renewals_since(recorder, key, forced) <= 1
            assert held.lost and held.loss is not None
            assert held.loss.reason == "force_released"
            with pytest.raises(LeaseLost):
                held.check()
    assert seen == [held]
    assert raised.value.reason == "force_released"


def test_sync_loss_can_be_left_unraised(client: fencepost.Client, admin_http: httpx.Client,
                                        recorder: Recorder) -> None:
    key = unique_name()
    with client.lock(key, ttl=TTL, raise_on_loss=False) as held:
        admin_http.delete(f"/v1/locks/{key}")
        forced = time.monotonic()
        assert held.lost_event.wait(timeout=NOTICED_GUARD_S)
        assert renewals_since(recorder, key, forced) <= 1
    assert held.lost


def test_sync_renewer_stops_when_the_block_exits(client: fencepost.Client,
                                                 recorder: Recorder) -> None:
    key = unique_name()
    with client.lock(key, ttl=5, renew_every=0.3):
        assert wait_for(lambda: recorder.count("PATCH", key) >= 2, timeout=5)
    exited = time.monotonic()
    time.sleep(1.0)
    assert recorder.count("PATCH", key, since=exited) == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("fencepost-keep")
                and t.is_alive()]


def test_sync_renewer_stops_when_its_thread_is_gone(client: fencepost.Client,
                                                    recorder: Recorder) -> None:
    """A block whose thread ended without leaving it (no __exit__) is not kept alive."""
    key = unique_name()
    hold = client.lock(key, ttl=5, renew_every=0.3)
    worker = threading.Thread(target=hold.__enter__)
    worker.start()
    worker.join()
    time.sleep(0.5)  # the renewer notices at its next renewal
    gone = time.monotonic()
    time.sleep(1.0)
    assert recorder.count("PATCH", key, since=gone) == 0
    assert wait_for(lambda: not client.get_lock(key).held, timeout=8)


def test_sync_lock_lost_when_the_server_cannot_be_reached(fresh_server: ServerProcess) -> None:
    key = unique_name()
    with fencepost.Client(fresh_server.base_url, fresh_server.admin_key,
                          retries=FAST_RETRIES, timeout=1) as c:
        with c.lock(key, ttl=5, raise_on_loss=False) as held:
            fresh_server.kill9()
            assert held.lost_event.wait(timeout=8)
            assert held.loss is not None and held.loss.reason == "unreachable"


# --- async -----------------------------------------------------------------------


async def test_async_lock_acquires_renews_and_releases(
        aclient: fencepost.AsyncClient, recorder: Recorder, admin_http: httpx.Client) -> None:
    key = unique_name()
    async with aclient.lock(key, ttl=TTL, operation="migrate") as held:
        assert held.held
        state = lock_state(admin_http, key)
        assert state["held"] and state["fencing_token"] == held.fencing_token
        first_expiry = held.expires_at
        for _ in range(100):
            if held.expires_at > first_expiry:
                break
            await asyncio.sleep(0.1)
        assert held.expires_at > first_expiry
        assert recorder.count("PATCH", key) >= 1
    assert lock_state(admin_http, key)["held"] is False


async def test_async_lock_releases_on_exception_and_cancellation(
        aclient: fencepost.AsyncClient, admin_http: httpx.Client) -> None:
    key = unique_name()
    with pytest.raises(ValueError):
        async with aclient.lock(key, ttl=TTL):
            raise ValueError("boom")
    assert lock_state(admin_http, key)["held"] is False

    entered = asyncio.Event()

    async def body() -> None:
        async with aclient.lock(key, ttl=TTL):
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lock_state(admin_http, key)["held"] is False


async def test_async_cancelled_wait_leaves_no_lease(aclient: fencepost.AsyncClient,
                                                    admin_http: httpx.Client) -> None:
    key = unique_name()
    first = await aclient.acquire_lock(key, ttl=TTL)
    waiter = asyncio.create_task(aclient.lock(key, ttl=TTL, wait=30).__aenter__())
    await asyncio.sleep(0.3)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await aclient.release_lock(key, first.lock_token)
    await asyncio.sleep(0.3)
    assert lock_state(admin_http, key)["held"] is False


async def test_async_loss_cancels_the_body_when_asked(aclient: fencepost.AsyncClient,
                                                      admin_http: httpx.Client,
                                                      recorder: Recorder) -> None:
    key = unique_name()
    calls: list[tuple[str, int]] = []
    forced = 0.0

    async def on_lost(hold: Any) -> None:
        calls.append((hold.loss.reason, renewals_since(recorder, key, forced)))

    reached_end = False
    with pytest.raises(LeaseLost) as raised:
        async with aclient.lock(key, ttl=TTL, cancel_on_loss=True, on_lost=on_lost) as held:
            admin_http.delete(f"/v1/locks/{key}")
            forced = time.monotonic()
            await asyncio.sleep(NOTICED_GUARD_S)  # cancelled long before this ends
            reached_end = True
    assert not reached_end
    assert raised.value.reason == "force_released"
    assert held.lost and held.lost_event.is_set()
    # Noticed by the first renewal after the loss (one may have left before
    # the force release's answer came back).
    assert len(calls) == 1 and calls[0][0] == "force_released" and calls[0][1] <= 1, calls
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the cancellation was taken back


async def test_async_loss_without_cancel_sets_the_event(aclient: fencepost.AsyncClient,
                                                        admin_http: httpx.Client,
                                                        recorder: Recorder) -> None:
    key = unique_name()
    async with aclient.lock(key, ttl=TTL, raise_on_loss=False) as held:
        admin_http.delete(f"/v1/locks/{key}")
        forced = time.monotonic()
        await asyncio.wait_for(held.lost_event.wait(), timeout=NOTICED_GUARD_S)
        assert renewals_since(recorder, key, forced) <= 1
        assert held.loss is not None and held.loss.reason == "force_released"
    assert held.lost


async def test_async_renewer_stops_when_the_block_exits(aclient: fencepost.AsyncClient,
                                                        recorder: Recorder) -> None:
    key = unique_name()
    async with aclient.lock(key, ttl=5, renew_every=0.3):
        await asyncio.sleep(1.0)
    assert recorder.count("PATCH", key) >= 2
    exited = time.monotonic()
    await asyncio.sleep(1.0)
    assert recorder.count("PATCH", key, since=exited) == 0


async def test_async_renewer_stops_when_its_task_is_gone(aclient: fencepost.AsyncClient,
                                                         recorder: Recorder) -> None:
    key = unique_name()
    hold = aclient.lock(key, ttl=5, renew_every=0.3)
    await asyncio.create_task(hold.__aenter__())  # the task ends inside the "block"
    await asyncio.sleep(0.5)
    gone = time.monotonic()
    await asyncio.sleep(1.0)
    assert recorder.count("PATCH", key, since=gone) == 0


async def test_async_keep_lease_survives_expiry_while_renewed(
        aclient: fencepost.AsyncClient, admin_http: httpx.Client) -> None:
    key = unique_name()
    async with aclient.lock(key, ttl=5, on_expiry="keep") as held:
        await asyncio.sleep(0.2)
        assert held.lease.on_expiry == "keep"
        assert lock_state(admin_http, key)["on_expiry"] == "keep"
    assert lock_state(admin_http, key)["held"] is False
