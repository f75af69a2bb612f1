"""Proxy mode across replicas (SPEC §4.7): a proxied call on one replica and a
lock-API slot on another count against one limit, and the slot a proxied call
held is free everywhere once its answer ends."""

from __future__ import annotations

import threading

import httpx
from proxy_upstreams import Upstream

from pool_support import acquire, make_pool, pool_state
from support import wait_until


def test_a_proxied_call_and_a_slot_on_other_replicas_share_the_limit(replicas):
    a, b, c = replicas
    upstream = Upstream()
    try:
        with a.client() as on_a, b.client() as on_b, c.client() as on_c:
            pool = make_pool(on_a, limit=1, upstream={"base_url": upstream.url})
            answer: dict[str, httpx.Response] = {}
            caller = threading.Thread(target=lambda: answer.setdefault(
                "r", on_a.get(f"/v1/pools/{pool}/proxy/slow?ms=2000")))
            caller.start()
            wait_until(lambda: pool_state(on_b, pool)["in_use"] == 1,
                       "replica b to see the proxied call's slot")
            assert acquire(on_b, pool, headers={"X-No-Queue": "1"}).status_code == 429
            busy = on_c.get(f"/v1/pools/{pool}/proxy/echo", headers={"X-No-Queue": "1"})
            assert busy.status_code == 429
            caller.join(15)
            assert answer["r"].status_code == 200
            wait_until(lambda: pool_state(on_c, pool)["in_use"] == 0, "the slot to be free")
            granted = acquire(on_b, pool, headers={"X-No-Queue": "1"})
            assert granted.status_code == 200, granted.text
    finally:
        upstream.close()
