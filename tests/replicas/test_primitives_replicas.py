"""Lock delay, fence checks and owner force release across replicas sharing one
PostgreSQL store (SPEC §3.5, §3.8, §3.9)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx

from support import ServerProcess, lock_headers, new_token, unique_name


def at_ms(value: str) -> int:
    moment = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def acquire(replica: ServerProcess, key: str, api_key: str | None = None,
            **body) -> httpx.Response:
    with replica.client(api_key) as c:
        return c.put(f"/v1/locks/{key}/lease", headers=lock_headers(new_token()),
                     json={"ttl_seconds": 30, **body})


def test_a_waiter_on_another_replica_is_granted_when_the_delay_ends(replicas):
    a, b, c = replicas
    key = unique_name("rdelay")
    member = a.create_key("member")["key"]
    first = acquire(a, key, member, lock_delay_seconds=2)
    assert first.status_code == 201, first.text
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(acquire, b, key, None, wait_seconds=20)
        # The owner's own key force-releases it on a third replica.
        with c.client(member) as owner:
            forced = owner.delete(f"/v1/locks/{key}")
        assert forced.status_code == 200, forced.text
        forced_ms = at_ms(first.json()["acquired_at"]) + forced.json()["age_ms"]
        refused = acquire(a, key)
        assert refused.status_code == 409
        assert refused.json()["error"]["reason"] == "lock_delay"
        granted = waiting.result(timeout=30)
    assert granted.status_code == 201, granted.text
    assert at_ms(granted.json()["acquired_at"]) >= forced_ms + 2_000
    token, old_token = granted.json()["fencing_token"], first.json()["fencing_token"]
    for replica in replicas:  # every replica agrees on the fence
        with replica.client() as reader:
            old = reader.get(f"/v1/locks/{key}/fence", params={"token": old_token})
            assert old.json()["reason"] == "force_released"
            now = reader.get(f"/v1/locks/{key}/fence", params={"token": token})
            assert now.json()["current"] is True


def test_another_members_force_release_is_refused_on_every_replica(replicas):
    a, b, c = replicas
    key = unique_name("rowner")
    owner = a.create_key("member")["key"]
    stranger = a.create_key("member")["key"]
    assert acquire(a, key, owner).status_code == 201
    for replica in (b, c):
        with replica.client(stranger) as other:
            assert other.delete(f"/v1/locks/{key}").status_code == 403
    with b.client(owner) as mine:
        assert mine.delete(f"/v1/locks/{key}").json()["released"] is True
