"""Every guarantee of SPEC §7 across replicas sharing one PostgreSQL store."""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from support import (
    ServerProcess,
    lock_headers,
    new_token,
    parse_at,
    true_within,
    unique_name,
    wait_parked,
    wait_until,
    waited_ms,
)

from .conftest import faketime_prefix


def acquire(replica: ServerProcess, key: str, token: str, ttl: int = 30,
            request_id: str | None = None, **body) -> httpx.Response:
    with replica.client() as c:
        return c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token, request_id),
                     json={"ttl_seconds": ttl, **body})


def renew(replica: ServerProcess, key: str, token: str, ttl: int = 30) -> httpx.Response:
    with replica.client() as c:
        return c.patch(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                       json={"ttl_seconds": ttl})


def release(replica: ServerProcess, key: str, token: str) -> httpx.Response:
    with replica.client() as c:
        return c.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": token})


def state(replica: ServerProcess, key: str) -> dict:
    with replica.client() as c:
        return dict(c.get(f"/v1/locks/{key}").json())


async def test_sixty_acquirers_over_three_replicas_get_one_grant(replicas):
    key = unique_name()
    clients = [r.async_client() for r in replicas]
    try:
        responses = await asyncio.gather(*(
            clients[i % 3].put(f"/v1/locks/{key}/lease", headers=lock_headers(new_token()),
                               json={"ttl_seconds": 30})
            for i in range(60)
        ))
    finally:
        for c in clients:
            await c.aclose()
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(201) == 1 and statuses.count(409) == 59, statuses


def test_lease_moves_across_replicas(replicas):
    a, b, c = replicas
    key, token = unique_name(), new_token()
    granted = acquire(a, key, token)
    assert granted.status_code == 201
    renewed = renew(b, key, token, ttl=60)
    assert renewed.status_code == 200
    assert renewed.json()["fencing_token"] == granted.json()["fencing_token"]
    with c.client() as client:
        assert client.get(f"/v1/locks/{key}").json()["held"] is True
    assert release(c, key, token).json() == {"released": True}
    with a.client() as client:
        assert client.get(f"/v1/locks/{key}").json()["held"] is False


def test_force_release_on_one_replica_is_authoritative_everywhere(wake_replicas):
    """The waiter parked on C is woken by B's NOTIFY. The replicas have no
    safety wake (WAKE_UPS_ONLY): without the NOTIFY the waiter would wait its
    whole wait, granted only by its last try at the end of it."""
    a, b, c = wake_replicas
    key, holder, waiter, rid = unique_name(), new_token(), new_token(), str(uuid.uuid4())
    assert acquire(a, key, holder).status_code == 201
    with ThreadPoolExecutor(1) as pool:
        parked = pool.submit(acquire, c, key, waiter, 30, rid, wait_seconds=20)
        wait_until(lambda: state(a, key)["waiters"] == 1, "the waiter in line")
        wait_parked(c, 1)
        with b.client() as admin:
            forced = admin.delete(f"/v1/locks/{key}")
        assert forced.json()["released"] is True
        lost = renew(a, key, holder)
        assert lost.status_code == 409
        assert lost.json()["error"]["code"] == "lease_lost"
        assert lost.json()["error"]["reason"] == "force_released"
        granted = parked.result(timeout=60)
    assert granted.status_code == 201, granted.text
    assert waited_ms(c, rid) < 20_000  # woken by the NOTIFY, not at the end of its wait


def test_fencing_tokens_rise_across_replicas(replicas):
    tokens = []
    for i in range(12):
        replica = replicas[i % 3]
        key, token = unique_name(), new_token()
        response = acquire(replica, key, token)
        assert response.status_code == 201
        tokens.append(response.json()["fencing_token"])
        release(replicas[(i + 1) % 3], key, token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


async def test_pool_limit_holds_across_replicas(replicas):
    pool = unique_name("pool")
    with replicas[0].client() as admin:
        assert admin.put(f"/v1/pools/{pool}", json={"limit": 4}).status_code == 201
    clients = [r.async_client() for r in replicas]
    try:
        responses = await asyncio.gather(*(
            clients[i % 3].post(f"/v1/pools/{pool}/lock/acquire") for i in range(48)
        ))
    finally:
        for c in clients:
            await c.aclose()
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 4 and statuses.count(429) == 44, statuses


def test_waiters_queue_in_arrival_order_across_replicas(replicas):
    a, b, c = replicas
    key, holder = unique_name(), new_token()
    assert acquire(a, key, holder).status_code == 201
    order: list[str] = []
    tokens = {"b": new_token(), "c": new_token(), "a": new_token()}

    def wait_then_release(name: str, replica: ServerProcess) -> None:
        response = acquire(replica, key, tokens[name], 30, wait_seconds=30)
        assert response.status_code == 201, response.text
        order.append(name)
        time.sleep(0.2)
        release(replica, key, tokens[name])

    with ThreadPoolExecutor(3) as pool:
        futures = []
        for name, replica in (("b", b), ("c", c), ("a", a)):
            futures.append(pool.submit(wait_then_release, name, replica))
            time.sleep(0.4)  # arrival order b, c, a
        release(a, key, holder)
        for future in futures:
            future.result(timeout=30)
    assert order == ["b", "c", "a"]


def test_revoked_key_is_refused_by_every_replica_within_two_seconds(replicas):
    a, b, c = replicas
    created = a.create_key("member")
    for replica in replicas:  # warm every replica's key cache
        with replica.client(created["key"]) as client:
            assert client.get("/v1/whoami").status_code == 200
    with a.client() as admin:
        assert admin.delete(f"/v1/keys/{created['id']}").status_code == 200
    revoked_at = time.monotonic()
    for replica in (b, c):
        with replica.client(created["key"]) as client:
            assert true_within(lambda c=client: c.get("/v1/whoami").status_code == 401,
                               revoked_at, 2.0), "still accepted 2 s after (SPEC §5)"


def test_kill_9_of_a_replica_loses_nothing_acknowledged(replicas):
    a, b, _ = replicas
    held = {}
    for _ in range(5):
        key, token = unique_name(), new_token()
        response = acquire(a, key, token, ttl=120)
        assert response.status_code == 201
        held[key] = (token, response.json()["fencing_token"])
    a.kill9()
    for key, (token, fencing) in held.items():
        with b.client() as client:
            state = client.get(f"/v1/locks/{key}").json()
        assert state["held"] and state["fencing_token"] == fencing
        assert renew(b, key, token).status_code == 200
    fresh = acquire(b, unique_name(), new_token())
    assert fresh.json()["fencing_token"] > max(f for _, f in held.values())


@pytest.mark.parametrize("offset", ["+600s", "-600s"])
def test_a_replica_with_a_skewed_clock_never_decides_expiry_by_it(start_replica, offset):
    normal = start_replica("normal")
    skewed = start_replica("skewed", command_prefix=faketime_prefix(offset))
    key, holder = unique_name(), new_token()
    granted = acquire(normal, key, holder, ttl=5)
    assert granted.status_code == 201
    # Ten minutes ahead, the lease would look long dead; behind, long alive.
    assert acquire(skewed, key, new_token()).status_code == 409
    with skewed.client() as client:
        state = client.get(f"/v1/locks/{key}").json()
    assert state["held"] is True
    assert state["expires_at"] == granted.json()["expires_at"]
    time.sleep(6.2)  # past expires_at by the database's clock (and the reaper's 1 s)
    taken = acquire(skewed, key, new_token(), ttl=5)
    assert taken.status_code == 201, taken.text
    # The skewed replica stamps times from the database clock, not its own.
    # (Its own clock is ten minutes off; the test slept 6.2 s between the two.)
    waited = parse_at(taken.json()["acquired_at"]) - parse_at(granted.json()["acquired_at"])
    assert 6 <= waited.total_seconds() < 60, (granted.json(), taken.json())
