"""`client.session(...)`: one heartbeat for many leases and slots, one loss
signal for everything attached, and everything released on exit; the same
behaviour from the sync and the async client (SPEC §3.10)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

import fencepost
from client_support import Recorder
from fencepost.errors import LeaseLost, LockHeld, NotFound, SessionLost
from support import ServerProcess, lock_headers, new_token, unique_name, wait_for

TTL = 6  # the session is renewed every 2 s


def lock_state(http: httpx.Client, key: str) -> dict[str, Any]:
    resp = http.get(f"/v1/locks/{key}")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def make_pool(http: httpx.Client) -> str:
    pool = unique_name("cspool")
    resp = http.put(f"/v1/pools/{pool}", json={"limit": 5, "request_timeout_ms": 3_600_000})
    assert resp.status_code == 201, resp.text
    return pool


# --- sync ------------------------------------------------------------------------


def test_sync_session_renews_once_for_everything_and_ends_it_all(
        client: fencepost.Client, recorder: Recorder, admin_http: httpx.Client) -> None:
    pool = make_pool(admin_http)
    single, many = unique_name("cs"), [unique_name("cs") for _ in range(3)]
    with client.session(ttl=TTL, name="sync batch") as session:
        with session.lock(single, operation="report") as lock, session.lock_many(many) as locks, \
                session.slot(pool) as slot:
            assert lock.held and locks.held and slot.held and not session.lost
            assert [lease.key for lease in locks.leases] == sorted(many)
            assert len(set(locks.fencing_tokens.values())) == 3
            state = lock_state(admin_http, single)
            assert state["held"] and state["fencing_token"] == lock.fencing_token
            assert state["operation"] == "report"
            first_expiry = session.expires_at
            assert lock.lease.expires_at == first_expiry
            assert wait_for(lambda: session.expires_at > first_expiry, timeout=TTL)
            for key in [single, *many]:
                assert lock_state(admin_http, key)["expires_at"] > state["expires_at"]
            info = client.get_session(session.session_id)
            assert (info.leases, info.slots, info.name) == (4, 1, "sync batch")
            # One heartbeat: no lease or slot renews on its own.
            assert recorder.count("PATCH", "/v1/locks/") == 0
            assert recorder.count("POST", "/renew") == 0
            assert recorder.count("PATCH", "/v1/sessions/") >= 1
        assert not lock.held and not locks.held
        assert all(not lock_state(admin_http, k)["held"] for k in [single, *many])
        with session.lock(single) as again:
            assert again.fencing_token > lock.fencing_token
    assert not session.held
    assert not lock_state(admin_http, single)["held"]
    assert client.get_session(session.session_id).ended == "session_ended"


def test_sync_session_exit_releases_what_is_still_attached(
        client: fencepost.Client, admin_http: httpx.Client) -> None:
    key = unique_name("cs")
    with client.session(ttl=TTL) as session:
        held = session.lock(key).__enter__()  # never exited: the session's end frees it
        assert lock_state(admin_http, key)["held"]
    assert not held.held and not lock_state(admin_http, key)["held"]


def test_sync_loss_is_one_signal_for_everything(client: fencepost.Client,
                                                admin_http: httpx.Client) -> None:
    seen: list[Any] = []
    key = unique_name("cs")
    with pytest.raises(LeaseLost) as lost:
        with client.session(ttl=TTL, on_lost=seen.append) as session:
            with session.lock(key) as lock:
                # Ended behind the client's back (as another process with the key could).
                assert admin_http.delete(f"/v1/sessions/{session.session_id}").json()["ended"]
                assert session.lost_event.wait(TTL)
                assert session.lost and lock.lost
                assert session.loss is not None and session.loss.reason == "session_ended"
                with pytest.raises(LeaseLost):
                    lock.check()
                with pytest.raises(LeaseLost):
                    session.lock(unique_name("cs")).__enter__()
    assert lost.value.reason == "session_ended"
    assert seen == [session]


def test_sync_lock_many_is_all_or_none(client: fencepost.Client,
                                       admin_http: httpx.Client) -> None:
    keys = sorted(unique_name("cs") for _ in range(4))
    busy = keys[2]
    admin_http.put(f"/v1/locks/{busy}/lease", headers=lock_headers(new_token()),
                   json={"ttl_seconds": 30})
    with client.session(ttl=TTL) as session:
        with pytest.raises(LockHeld):
            with session.lock_many(keys):
                pytest.fail("granted a set with a busy key")
        assert [lock_state(admin_http, k)["held"] for k in keys] == [False, False, True, False]


def test_sync_lock_many_holds_a_thousand_leases_on_one_thread(
        client: fencepost.Client, admin_http: httpx.Client) -> None:
    # The async test below holds ten thousand; this one shows the blocking
    # client's shape (one heartbeat thread, whatever the count) in less time.
    prefix = unique_name("many") + "."
    keys = [f"{prefix}{i:05}" for i in range(1_000)]
    threads_before = threading.active_count()
    with client.session(ttl=30) as session:
        with session.lock_many(keys) as locks:
            assert len(locks.leases) == 1_000
            # One heartbeat thread for all of them, not one per lease.
            assert threading.active_count() == threads_before + 1
            info = client.get_session(session.session_id)
            assert info.leases == 1_000 and info.keys == keys
            renewed = client.renew_session(session.session_id, ttl=30)
            page = admin_http.get("/v1/locks", params={"prefix": prefix, "limit": 1000}).json()
            assert {lock["expires_at"] for lock in page["locks"]} == {
                renewed.expires_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")}
    assert admin_http.get("/v1/locks", params={"prefix": prefix}).json()["locks"] == []


def test_sync_session_methods(client: fencepost.Client) -> None:
    grant = client.create_session(30, name="raw")
    assert grant.session_id.startswith("ses_") and grant.ttl_seconds == 30
    key = unique_name("cs")
    lease = client.acquire_lock(key, ttl=5, session_id=grant.session_id)
    assert lease.expires_at == grant.expires_at
    renewed = client.renew_session(grant.session_id, ttl=60)
    assert client.get_lock(key).expires_at == renewed.expires_at
    ended = client.end_session(grant.session_id)
    assert (ended.ended, ended.leases, ended.slots) == (True, 1, 0)
    with pytest.raises(SessionLost) as lost:
        client.renew_session(grant.session_id, ttl=60)
    assert lost.value.reason == "session_ended"
    with pytest.raises(LeaseLost) as gone:
        client.renew_lock(key, lease.lock_token, ttl=30)
    assert gone.value.reason == "session_ended"


# --- async -----------------------------------------------------------------------


async def test_async_session_renews_once_and_ends_it_all(
        aclient: fencepost.AsyncClient, recorder: Recorder, admin_http: httpx.Client) -> None:
    pool = make_pool(admin_http)
    single, many = unique_name("cs"), [unique_name("cs") for _ in range(3)]
    async with aclient.session(ttl=TTL) as session:
        async with session.lock(single) as lock, session.lock_many(many) as locks, \
                session.slot(pool) as slot:
            assert lock.held and locks.held and slot.held
            first_expiry = session.expires_at
            deadline = time.monotonic() + TTL
            while session.expires_at == first_expiry and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert session.expires_at > first_expiry
            info = await aclient.get_session(session.session_id)
            assert (info.leases, info.slots) == (4, 1)
            assert info.pools[0].pool == pool
            assert recorder.count("PATCH", "/v1/locks/") == 0
            assert recorder.count("POST", "/renew") == 0
    assert not lock.held and not slot.held
    assert all(not lock_state(admin_http, k)["held"] for k in [single, *many])
    assert admin_http.get(f"/v1/pools/{pool}").json()["in_use"] == 0


async def test_async_loss_cancels_the_block_when_asked(aclient: fencepost.AsyncClient,
                                                       admin_http: httpx.Client) -> None:
    key = unique_name("cs")
    with pytest.raises(LeaseLost) as lost:
        async with aclient.session(ttl=TTL, cancel_on_loss=True) as session:
            async with session.lock(key) as lock:
                admin_http.delete(f"/v1/sessions/{session.session_id}")
                await asyncio.sleep(TTL * 2)
                pytest.fail("the block was not cancelled")
    assert lost.value.reason == "session_ended" and lock.lost


async def test_async_ten_thousand_leases_on_one_heartbeat(
        aclient: fencepost.AsyncClient, admin_http: httpx.Client) -> None:
    prefix = unique_name("amany") + "."
    keys = [f"{prefix}{i:05}" for i in range(10_000)]
    tasks_before = len(asyncio.all_tasks())
    async with aclient.session(ttl=30) as session:
        async with session.lock_many(keys) as locks:
            assert len(locks.fencing_tokens) == 10_000
            assert len(asyncio.all_tasks()) == tasks_before + 1  # the one heartbeat
            assert (await aclient.get_session(session.session_id)).leases == 10_000
    assert admin_http.get("/v1/locks", params={"prefix": prefix}).json()["locks"] == []


def test_a_session_is_only_its_keys(server: ServerProcess, member_key: str) -> None:
    with fencepost.Client(server.base_url, member_key) as mine, \
            fencepost.Client(server.base_url, server.admin_key) as admin:
        grant = mine.create_session(30)
        with pytest.raises(NotFound):
            admin.get_session(grant.session_id)
        mine.end_session(grant.session_id)
