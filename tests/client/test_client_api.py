"""The two clients have the same methods (by construction), read their
configuration from arguments or the environment, and cover SPEC §3-§5."""

from __future__ import annotations

import inspect

import pytest

import fencepost
from fencepost.client import METHOD_NAMES, AsyncClient, Client
from fencepost.errors import LockHeld, NotFound, Unauthorized
from support import ServerProcess, unique_name


def test_both_clients_have_the_same_methods_and_signatures() -> None:
    sync, async_ = Client("http://127.0.0.1:1", "k"), AsyncClient("http://127.0.0.1:1", "k")
    assert {"acquire_lock", "renew_lock", "release_lock", "get_lock", "list_locks",
            "force_release", "set_pool", "get_pool", "list_pools", "delete_pool",
            "acquire_slot", "renew_slot", "release_slot", "create_key", "list_keys",
            "revoke_key", "whoami", "health"} <= set(METHOD_NAMES)
    for name in [*METHOD_NAMES, "lock", "slot"]:
        sync_method, async_method = getattr(sync, name), getattr(async_, name)
        assert sync_method.__doc__ and async_method.__doc__, name
        sync_params = inspect.signature(sync_method).parameters
        async_params = dict(inspect.signature(async_method).parameters)
        async_params.pop("cancel_on_loss", None)  # only asyncio can cancel a block
        assert list(sync_params) == list(async_params), name
        if name in METHOD_NAMES:
            assert inspect.iscoroutinefunction(async_method), name
            assert not inspect.iscoroutinefunction(sync_method), name
    sync.close()


def test_public_names_have_docstrings() -> None:
    for name in fencepost.client.__all__:
        value = getattr(fencepost.client, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__doc__, name


def test_configuration_from_environment(server: ServerProcess,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FENCEPOST_URL", server.base_url + "/")
    monkeypatch.setenv("FENCEPOST_API_KEY", server.admin_key)
    with fencepost.Client() as c:
        assert c.url == server.base_url
        assert c.whoami().role == "admin"
    with fencepost.Client(api_key="fp_wrong_key_000000000000000000000000") as c:
        with pytest.raises(Unauthorized):
            c.whoami()


def test_bad_url_is_refused_at_construction() -> None:
    for url in ["ftp://example", "not a url", "http://"]:
        with pytest.raises(ValueError):
            Client(url, "k")


def test_locks_keys_and_identity_round_trip(server: ServerProcess) -> None:
    prefix = unique_name("list")
    with fencepost.Client(server.base_url, server.admin_key) as c:
        assert c.health().status == "ok"
        me = c.whoami()
        assert (me.project, me.role) == ("default", "admin")
        leases = [c.acquire_lock(f"{prefix}-{i}", ttl=30, operation="scan") for i in range(3)]
        page = c.list_locks(prefix=prefix, limit=2)
        assert [lock.key for lock in page.locks] == [f"{prefix}-0", f"{prefix}-1"]
        rest = c.list_locks(prefix=prefix, limit=2, after=page.next)
        assert [lock.key for lock in rest.locks] == [f"{prefix}-2"] and rest.next is None
        again = c.acquire_lock(f"{prefix}-0", ttl=30, token=leases[0].lock_token)
        assert again.created is False and again.fencing_token == leases[0].fencing_token
        renewal = c.renew_lock(f"{prefix}-1", leases[1].lock_token, ttl=60)
        assert renewal.fencing_token == leases[1].fencing_token
        forced = c.force_release(f"{prefix}-2")
        assert forced.released and forced.operation == "scan"
        assert c.force_release(f"{prefix}-2").released is False
        for lease in leases[:2]:
            assert c.release_lock(lease.key, lease.lock_token) is True
        assert c.list_locks(prefix=prefix).locks == []

        created = c.create_key("reader", name="audit", expires_in=3600,
                               allow_ips=["127.0.0.1"], rpm_quota=100)
        assert created.key and created.role == "reader" and created.rpm_quota == 100
        listed = {k.id: k for k in c.list_keys()}
        assert listed[created.id].name == "audit"
        with fencepost.Client(server.base_url, created.key) as reader:
            assert reader.whoami().key_id == created.id
        assert c.revoke_key(created.id) is True
        with pytest.raises(NotFound):
            c.revoke_key("key_does_not_exist")


async def test_async_pools_round_trip(server: ServerProcess) -> None:
    name = unique_name("pool")
    async with fencepost.AsyncClient(server.base_url, server.admin_key) as c:
        created = await c.set_pool(name, limit=2, queue_size=5, term_ms=2000)
        assert (created.limit, created.queue_size, created.term_ms) == (2, 5, 2000)
        assert (await c.get_pool(name)).effective_limit == 2
        assert name in [p.name for p in (await c.list_pools(prefix=name)).pools]
        grant = await c.acquire_slot(name)
        assert grant.term_ms == 2000 and grant.lease_deadline <= grant.request_deadline
        renewed = await c.renew_slot(name, grant.slot_id)
        assert renewed.lease_deadline >= grant.lease_deadline
        assert await c.release_slot(name, grant.slot_id) is True
        assert await c.release_slot(name, grant.slot_id) is False
        assert await c.delete_pool(name) is True
        with pytest.raises(NotFound):
            await c.get_pool(name)


async def test_async_acquire_waits_longer_than_one_request(server: ServerProcess,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """Waits beyond the server's 300 s maximum are made of consecutive requests
    (shrunk here to 0.3 s per request to keep the test short)."""
    monkeypatch.setattr(fencepost.client.operations, "MAX_LOCK_WAIT_S", 0.3)
    key = unique_name()
    async with fencepost.AsyncClient(server.base_url, server.admin_key) as c:
        await c.acquire_lock(key, ttl=5)  # expires on its own after 5 s
        with pytest.raises(LockHeld):
            await c.acquire_lock(key, ttl=5, wait=0.8)
        lease = await c.acquire_lock(key, ttl=5, wait=10)
        assert lease.created
