"""`fencepost serve --workers 2`: the pool's bound (SPEC §7.5) and the
liveness of an expired lease (§7.4) across the worker processes, on SQLite
and on PostgreSQL. Each worker admits and reaps on its own; only the store
makes them agree."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from support import ServerProcess, lock_headers, new_token, parse_at, unique_name
from workers.test_workers import (  # noqa: F401 - fixtures used by name
    WORKERS,
    acquire,
    clients_on_every_worker,
    store_url,
    worker_of,
    workers,
)


def test_a_pool_never_has_more_live_slots_than_its_limit_across_workers(
    workers: ServerProcess,  # noqa: F811 - the fixture
) -> None:
    """Callers on both workers take and give back slots of one pool of 2. Each
    counts itself in after its grant's answer and out before it sends its
    release, so the count it keeps is never above the live slots in the
    store: it must never exceed the limit, and every caller gets its turns."""
    limit, callers, turns = 2, 8, 10
    pool = unique_name("bounded")
    with workers.client() as admin:
        created = admin.put(f"/v1/pools/{pool}", json={"limit": limit, "queue_size": 64})
        assert created.status_code == 201, created.text
    guard = threading.Lock()
    state = {"inside": 0, "most": 0, "granted": 0}
    seen_workers: set[int] = set()

    def caller() -> None:
        with workers.client() as c:
            with guard:
                seen_workers.add(worker_of(c))
            for _ in range(turns):
                got = c.post(f"/v1/pools/{pool}/lock/acquire", json={"wait_ms": 60_000})
                assert got.status_code == 200, got.text
                with guard:
                    state["inside"] += 1
                    state["granted"] += 1
                    state["most"] = max(state["most"], state["inside"])
                time.sleep(0.003)  # the call to the upstream the slot protects
                with guard:
                    state["inside"] -= 1
                slot = got.json()["slot_id"]
                done = c.post(f"/v1/pools/{pool}/lock/{slot}/release")
                assert done.status_code == 200, done.text

    with ThreadPoolExecutor(callers) as threads:
        for future in [threads.submit(caller) for _ in range(callers)]:
            future.result(timeout=180)
    assert seen_workers == set(range(1, WORKERS + 1)), seen_workers
    assert state["granted"] == callers * turns
    assert state["most"] <= limit, state
    with workers.client() as admin:
        assert admin.get(f"/v1/pools/{pool}").json()["in_use"] == 0


def test_an_expired_lease_is_granted_to_a_waiter_on_the_other_worker_within_a_second(
    workers: ServerProcess,  # noqa: F811 - the fixture
) -> None:
    """A holder on one worker stops renewing; a waiter parked on the other
    worker is granted within 1 s of the lease's expires_at (SPEC §7.4), with
    a higher fencing token."""
    clients = clients_on_every_worker(workers)
    one, two = clients[1], clients[2]
    try:
        key = unique_name("expiring")
        held = acquire(one, key, new_token(), ttl=5)  # the shortest TTL (SPEC §3.1)
        assert held.status_code == 201, held.text
        expires = parse_at(held.json()["expires_at"]).timestamp()
        waited = two.put(f"/v1/locks/{key}/lease", headers=lock_headers(new_token()),
                         json={"ttl_seconds": 30, "wait_seconds": 20})
        granted_at = time.time()
        assert waited.status_code == 201, waited.text
        assert waited.json()["fencing_token"] > held.json()["fencing_token"]
        assert granted_at - expires < 1.0, granted_at - expires
    finally:
        for client in clients.values():
            client.close()
