"""The clients' fence check (§3.8), lock delay (§3.9), owner force release
(§3.5) and key refresh (§5) against a real server."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import fencepost
import fencepost.client
import fencepost.errors
from fencepost.errors import Forbidden, LockHeld, NotFound, Unauthorized
from support import ServerProcess, unique_name, wait_until


def test_fence_check_sync(server: ServerProcess, member_key: str, reader_key: str) -> None:
    key = unique_name("cfence")
    with fencepost.Client(server.base_url, member_key) as member, \
            fencepost.Client(server.base_url, reader_key) as reader:
        lease = member.acquire_lock(key, ttl=30)
        now = reader.fence_check(key, lease.fencing_token)
        assert isinstance(now, fencepost.client.FenceCheck)
        assert (now.current, now.live_token, now.reason) == (True, lease.fencing_token, None)
        assert member.release_lock(key, lease.lock_token)
        stale = reader.fence_check(key, lease.fencing_token)
        assert (stale.current, stale.live_token, stale.reason) == (False, None, "released")
        with pytest.raises(ValueError):
            reader.fence_check(key, -1)


async def test_fence_check_async(server: ServerProcess, member_key: str) -> None:
    key = unique_name("cfence")
    async with fencepost.AsyncClient(server.base_url, member_key) as member:
        lease = await member.acquire_lock(key, ttl=30)
        assert (await member.fence_check(key, lease.fencing_token)).current is True
        assert (await member.fence_check(key, lease.fencing_token + 1)).reason == "unknown"


def test_the_owner_key_force_releases_its_lease(server: ServerProcess, member_key: str) -> None:
    key = unique_name("cowner")
    other = str(server.create_key("member", name="client-not-owner")["key"])
    with fencepost.Client(server.base_url, member_key) as member, \
            fencepost.Client(server.base_url, other) as stranger:
        lease = member.acquire_lock(key, ttl=30, operation="job")
        with pytest.raises(Forbidden):
            stranger.force_release(key)
        forced = member.force_release(key)
        assert forced.released and forced.fencing_token == lease.fencing_token


def test_lock_with_a_lock_delay(server: ServerProcess, member_key: str) -> None:
    key = unique_name("cdelay")
    with fencepost.Client(server.base_url, member_key) as member:
        with member.lock(key, ttl=30, lock_delay=30, raise_on_loss=False) as hold:
            forced = member.force_release(key)
            assert forced.released and forced.fencing_token == hold.fencing_token
        # The lease ended by force release: the lock is in its delay.
        with pytest.raises(LockHeld) as held:
            member.acquire_lock(key, ttl=30)
        assert held.value.reason == "lock_delay"
        assert held.value.retry_after is not None and 0 < held.value.retry_after <= 30


async def test_acquire_lock_with_a_lock_delay_async(server: ServerProcess,
                                                    member_key: str) -> None:
    key = unique_name("cdelay")
    async with fencepost.AsyncClient(server.base_url, member_key) as member:
        lease = await member.acquire_lock(key, ttl=30, lock_delay=5)
        await member.force_release(key)
        with pytest.raises(LockHeld) as held:
            await member.acquire_lock(key, ttl=30)
        assert held.value.reason == "lock_delay"
        assert lease.fencing_token > 0


def test_refresh_key_by_hand(server: ServerProcess) -> None:
    created = server.create_key("reader", expires_in_seconds=3600, name="by-hand")
    with fencepost.Client(server.base_url, created["key"]) as c:
        me = c.whoami()
        assert me.expires_at is not None
        successor = c.refresh_key(expires_in=60)
        assert successor.name == "by-hand" and successor.role == "reader"
        assert successor.id != created["id"]
    with fencepost.Client(server.base_url, successor.key) as c:
        assert c.whoami().key_id == successor.id


def test_retire_key_and_a_refresh_that_retires_the_previous_key(server: ServerProcess) -> None:
    created = server.create_key("member", name="rotating")
    with fencepost.Client(server.base_url, created["key"]) as c:
        successor = c.refresh_key(retire_previous=True)
        with pytest.raises(Unauthorized):
            c.whoami()  # this client's key is retired now
    with fencepost.Client(server.base_url, successor.key) as c:
        assert c.whoami().key_id == successor.id
        assert c.retire_key(successor.id) is True  # the key itself may
        with pytest.raises(Unauthorized):
            c.whoami()
    with fencepost.Client(server.base_url, server.admin_key) as admin:
        states = {k.id: (k.state, k.refreshed_from) for k in admin.list_keys()}
        assert states[created["id"]] == ("retired", None)
        assert states[successor.id] == ("retired", created["id"])
        assert admin.retire_key(successor.id) is True  # idempotent
        with pytest.raises(NotFound):
            admin.retire_key("key_0000000000000000")


async def test_async_client_retires_a_key(server: ServerProcess) -> None:
    created = server.create_key("reader")
    async with fencepost.AsyncClient(server.base_url, server.admin_key) as admin:
        assert await admin.retire_key(created["id"]) is True
    async with fencepost.AsyncClient(server.base_url, created["key"]) as c:
        with pytest.raises(Unauthorized):
            await c.whoami()


def test_sync_client_refreshes_its_key_before_it_expires(server: ServerProcess) -> None:
    created = server.create_key("member", expires_in_seconds=6, name="auto")
    secrets: list[fencepost.client.CreatedKey] = []
    key = unique_name("auto")
    with fencepost.Client(server.base_url, created["key"], on_key_refresh=secrets.append) as c:
        assert c.whoami().key_id == created["id"]  # learns the expiry; not due yet
        assert secrets == []
        # Keep working past the original key's expiry: a refresh happens on the way.
        def refreshed_and_expired() -> bool:
            c.get_lock(key)
            with fencepost.Client(server.base_url, created["key"]) as old:
                try:
                    old.whoami()
                    return False
                except fencepost.errors.Unauthorized:
                    return bool(secrets)
        wait_until(refreshed_and_expired, "a refresh, and the old key to expire", timeout=15.0,
                   interval=0.1)
        assert c.whoami().key_id == secrets[-1].id  # the client uses its successor now
        assert secrets[0].name == "auto" and secrets[0].role == "member"


async def test_async_client_refreshes_with_an_async_callback(server: ServerProcess) -> None:
    created = server.create_key("reader", expires_in_seconds=3)
    seen: list[str] = []

    async def store_secret(new: fencepost.client.CreatedKey) -> None:
        seen.append(new.key)

    async with fencepost.AsyncClient(server.base_url, created["key"],
                                     on_key_refresh=store_secret) as c:
        await c.whoami()
        for _ in range(150):
            if seen:
                break
            await asyncio.sleep(0.1)
            await c.health()
        assert seen, "never refreshed"
        assert (await c.whoami()).key_id != created["id"]


class _HoldsTheOldKeysLockRead(httpx.BaseTransport):
    """A real HTTP transport that holds the first lock read sent with `old`
    until `go` is set: it reaches the server only after the key is retired."""

    def __init__(self, old: str) -> None:
        self.inner = httpx.HTTPTransport()
        self.old = old
        self.go = threading.Event()
        self.sent: list[str] = []  # "old" or "new", per lock read

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/v1/locks/"):
            old = request.headers["authorization"] == f"Bearer {self.old}"
            self.sent.append("old" if old else "new")
            if old and self.sent.count("old") == 1:
                assert self.go.wait(20)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_sync_client_refresh_retires_the_old_key_and_resends_what_it_had_in_flight(
        server: ServerProcess) -> None:
    created = server.create_key("member", expires_in_seconds=3, name="rotating")
    secrets: list[fencepost.client.CreatedKey] = []
    transport = _HoldsTheOldKeysLockRead(created["key"])
    with fencepost.Client(server.base_url, created["key"], on_key_refresh=secrets.append,
                          retire_previous=True, transport=transport) as c:
        c.whoami()  # learns the expiry: due in two seconds
        key = unique_name("inflight")
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(c.get_lock, key)  # sent with the old key, held
            wait_until(lambda: transport.sent == ["old"], "the lock read to be in flight")
            time.sleep(2.1)
            assert c.whoami().key_id == secrets[0].id  # refreshed, old key retired
            transport.go.set()
            assert in_flight.result(timeout=20).key == key  # refused once, sent again
        assert transport.sent == ["old", "new"]
    with server.client() as admin:
        assert admin.get("/v1/whoami", headers={"Authorization": f"Bearer {created['key']}"}
                         ).status_code == 401
        states = {k["id"]: k["state"] for k in
                  admin.get("/v1/keys", params={"limit": "1000"}).json()["keys"]}
    # Retired, not expired: it stopped when its successor was minted.
    assert states[created["id"]] == "retired" and states[secrets[0].id] == "active"


async def test_async_client_refresh_retires_the_old_key(server: ServerProcess) -> None:
    created = server.create_key("member", expires_in_seconds=3, name="rotating-async")
    seen: list[fencepost.client.CreatedKey] = []

    async with fencepost.AsyncClient(server.base_url, created["key"], on_key_refresh=seen.append,
                                     retire_previous=True) as c:
        await c.whoami()
        await asyncio.sleep(2.1)
        # Many calls at the moment the refresh is due: each is answered with a key
        # that works (the old one retired under some of them is resent).
        views = await asyncio.gather(*(c.get_lock(unique_name("burst")) for _ in range(20)))
        assert len(views) == 20 and len(seen) == 1
        assert (await c.whoami()).key_id == seen[0].id
    async with fencepost.AsyncClient(server.base_url, created["key"]) as old:
        with pytest.raises(Unauthorized):
            await old.whoami()


def test_a_revoked_key_fails_to_refresh_and_the_client_carries_on(
    server: ServerProcess, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("WARNING", logger="fencepost.client")
    created = server.create_key("reader", expires_in_seconds=3)
    calls: list[object] = []
    with fencepost.Client(server.base_url, created["key"], on_key_refresh=calls.append) as c:
        c.whoami()
        with server.client() as admin:
            assert admin.delete(f"/v1/keys/{created['id']}").status_code == 200
        time.sleep(2.1)  # past the refresh point (two thirds of 3 s)
        with pytest.raises(fencepost.errors.Unauthorized):
            c.whoami()  # the refresh was refused too; the call itself is refused
        assert calls == []
        assert "refreshing the API key failed" in caplog.text
