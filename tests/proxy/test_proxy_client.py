"""The Python client in proxy mode (SPEC §4.7): configuring a pool's upstream
with `Upstream`, and `proxy_client`, an httpx client whose every request goes
through the pool, on both clients."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from proxy_upstreams import Upstream

import fencepost
from support import ServerProcess, unique_name, wait_until

SECRET = "sk-client-secret-555"


def test_set_pool_with_an_upstream_and_call_through_it(
        server: ServerProcess, upstream: Upstream) -> None:
    name = unique_name("clientproxy")
    with fencepost.Client(server.base_url, server.admin_key) as fp:
        info = fp.set_pool(name, limit=1, upstream=fencepost.Upstream(
            base_url=upstream.url + "/api", headers={"Authorization": f"Bearer {SECRET}"}))
        assert info.upstream is not None and info.upstream.headers == ["Authorization"]
        assert SECRET not in repr(fencepost.Upstream(headers={"A": SECRET}))
        with fp.proxy_client(name, wait=5) as api:
            answer = api.post("echo/run", params={"q": "1"}, json={"x": 1})
            assert answer.status_code == 200, answer.text
            seen = answer.json()
            assert seen["path"] == "/api/echo/run?q=1" and seen["body"] == '{"x":1}'
            assert dict((k.lower(), v) for k, v in seen["headers"])["authorization"] == \
                f"Bearer {SECRET}"
            assert answer.headers["x-queued-ms"] is not None
            # The one slot is taken by a lock-API holder: the proxied request waits
            # in the same line and goes through when it is released.
            held = fp.acquire_slot(name)
            result: dict[str, httpx.Response] = {}
            caller = threading.Thread(target=lambda: result.setdefault("r", api.get("echo")))
            caller.start()
            wait_until(lambda: fp.get_pool(name).queued == 1, "the proxied request to wait")
            fp.release_slot(name, held.slot_id)
            caller.join(10)
            assert result["r"].status_code == 200
        with fp.proxy_client(name, no_queue=True) as hasty:
            held = fp.acquire_slot(name)
            assert hasty.get("echo").status_code == 429
            fp.release_slot(name, held.slot_id)
        changed = fp.update_pool(name, upstream=fencepost.Upstream(timeout_ms=2000))
        assert changed.upstream is not None and changed.upstream.timeout_ms == 2000
        assert changed.upstream.headers == ["Authorization"]
        assert fp.update_pool(name, unset=["upstream"]).upstream is None


def test_a_proxy_client_follows_the_clients_refreshed_key(
        server: ServerProcess, upstream: Upstream) -> None:
    name = unique_name("refreshing")
    with fencepost.Client(server.base_url, server.admin_key) as admin:
        admin.set_pool(name, limit=2, upstream=fencepost.Upstream(base_url=upstream.url))
    key = server.create_key("member", expires_in_seconds=3)
    seen: list[fencepost.client.CreatedKey] = []
    with fencepost.Client(server.base_url, key["key"], on_key_refresh=seen.append,
                          retire_previous=True) as fp, fp.proxy_client(name) as api:
        fp.whoami()
        wait_until(lambda: (fp.whoami() and bool(seen)), "a refresh", timeout=10, interval=0.2)
        # The old key is retired now; the proxy client sends the new one.
        assert api.get("echo").status_code == 200


async def test_the_async_client_calls_through_a_pool(
        server: ServerProcess, upstream: Upstream) -> None:
    name = unique_name("asyncproxy")
    async with fencepost.AsyncClient(server.base_url, server.admin_key) as fp:
        await fp.set_pool(name, limit=2, upstream=fencepost.Upstream(base_url=upstream.url))
        async with fp.proxy_client(name, wait=5) as api:
            answers = await asyncio.gather(*(api.get(f"echo/{n}") for n in range(6)))
        assert [a.status_code for a in answers] == [200] * 6
        assert {a.json()["path"] for a in answers} == {f"/echo/{n}" for n in range(6)}
        assert (await fp.get_pool(name)).in_use == 0


@pytest.mark.parametrize("pool", ["no-such-pool"])
def test_an_unknown_pool_is_404(server: ServerProcess, pool: str) -> None:
    with fencepost.Client(server.base_url, server.admin_key) as fp, fp.proxy_client(pool) as api:
        assert api.get("anything").status_code == 404
