"""Shared locks and lock sets across three replicas sharing one PostgreSQL
store (SPEC §3.6, §3.7, §7)."""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx

from support import (
    ServerProcess,
    lock_headers,
    new_token,
    unique_name,
    wait_parked,
    wait_until,
    waited_ms,
)


def acquire(replica: ServerProcess, key: str, token: str, ttl: int = 30,
            request_id: str | None = None, **body) -> httpx.Response:
    with replica.client() as c:
        return c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token, request_id),
                     json={"ttl_seconds": ttl, **body})


def lock_set(replica: ServerProcess, keys: list[str], token: str, ttl: int = 30,
             **body) -> httpx.Response:
    with replica.client() as c:
        return c.post("/v1/lock-sets", headers=lock_headers(token),
                      json={"keys": keys, "ttl_seconds": ttl, **body})


def release(replica: ServerProcess, key: str, token: str) -> httpx.Response:
    with replica.client() as c:
        return c.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": token})


def state(replica: ServerProcess, key: str) -> dict:
    with replica.client() as c:
        return dict(c.get(f"/v1/locks/{key}").json())


def test_readers_on_every_replica_share_a_lock_and_keep_writers_out(replicas):
    key = unique_name("shared")
    tokens = [new_token() for _ in replicas]
    fences = []
    for replica, token in zip(replicas, tokens, strict=True):
        granted = acquire(replica, key, token, mode="shared")
        assert granted.status_code == 201, granted.text
        fences.append(granted.json()["fencing_token"])
    assert fences == sorted(set(fences))
    for replica in replicas:
        assert state(replica, key)["holders"] == 3
        assert acquire(replica, key, new_token()).status_code == 409
    for replica, token in zip(replicas, tokens, strict=True):
        assert release(replicas[(replicas.index(replica) + 1) % 3], key, token).json() == \
            {"released": True}
    assert acquire(replicas[0], key, new_token()).status_code == 201


async def test_concurrent_lock_sets_over_replicas_never_overlap(replicas):
    """Sets over crossing keys, sent at once to three replicas: each key is
    granted to exactly one of them."""
    keys = [unique_name(f"k{i}") for i in range(4)]
    orders = [keys, keys[::-1], keys[1:] + keys[:1]]
    clients = [r.async_client() for r in replicas]
    try:
        responses = await asyncio.gather(*(
            clients[i % 3].post("/v1/lock-sets", headers=lock_headers(new_token()),
                                json={"keys": orders[i % 3], "ttl_seconds": 30})
            for i in range(30)
        ))
    finally:
        for c in clients:
            await c.aclose()
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(201) == 1 and statuses.count(409) == 29, statuses


def test_crossing_sets_waiting_on_different_replicas_are_granted_in_order(replicas):
    a, b, c = replicas
    x, y, holder = unique_name("x"), unique_name("y"), new_token()
    assert acquire(a, x, holder).status_code == 201
    order: list[str] = []

    def wait_then_release(name: str, replica: ServerProcess, keys: list[str]) -> None:
        token = new_token()
        response = lock_set(replica, keys, token, wait_seconds=30)
        assert response.status_code == 201, response.text
        order.append(name)
        time.sleep(0.2)
        for key in keys:
            release(replica, key, token)

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(wait_then_release, "b", b, [x, y])
        time.sleep(0.5)
        second = pool.submit(wait_then_release, "c", c, [y, x])
        time.sleep(0.5)
        # y is free, but the set on B stands ahead of the set on C in its line.
        assert state(a, y)["waiters"] == 2 and not state(a, y)["held"]
        release(a, x, holder)
        first.result(timeout=30)
        second.result(timeout=30)
    assert order == ["b", "c"]


def test_force_release_of_a_shared_lock_wakes_the_line_on_another_replica(wake_replicas):
    """The writer parked on C is woken by B's NOTIFY. The replicas have no
    safety wake (WAKE_UPS_ONLY): without the NOTIFY the writer would wait its
    whole wait, granted only by its last try at the end of it."""
    a, b, c = wake_replicas
    key, rid = unique_name("readers"), str(uuid.uuid4())
    for replica in (a, b):
        assert acquire(replica, key, new_token(), mode="shared").status_code == 201
    with ThreadPoolExecutor(1) as pool:
        parked = pool.submit(acquire, c, key, new_token(), 30, rid, wait_seconds=20)
        wait_until(lambda: state(a, key)["waiters"] == 1, "the writer in line")
        wait_parked(c, 1)
        with b.client() as admin:
            forced = admin.delete(f"/v1/locks/{key}")
        assert forced.json()["released_count"] == 2
        granted = parked.result(timeout=60)
    assert granted.status_code == 201, granted.text
    assert state(a, key)["mode"] == "exclusive"
    assert waited_ms(c, rid) < 20_000  # woken by the NOTIFY, not at the end of its wait
