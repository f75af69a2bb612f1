"""Adaptive admission over HTTP (SPEC §4.5): outcomes reported on release move
the pool's effective limit, retry hints pause admissions, and what was learned
survives a restart."""

from __future__ import annotations

import time

import math

import httpx

from fencepost.core.governor import BETA
from support import ServerProcess, unique_name

LOWERED = math.floor(10 * BETA)  # one throttle report on a pool of limit 10


def make_pool(client: httpx.Client, **config: object) -> str:
    name = unique_name("adaptive")
    assert client.put(f"/v1/pools/{name}", json=config).status_code == 201
    return name


def cycle(client: httpx.Client, pool: str, report: dict[str, object]) -> httpx.Response:
    """Acquire a slot and release it with `report`; returns the acquire response."""
    got = client.post(f"/v1/pools/{pool}/lock/acquire")
    assert got.status_code == 200, got.text
    slot = got.json()["slot_id"]
    released = client.post(f"/v1/pools/{pool}/lock/{slot}/release", json=report)
    assert released.json() == {"released": True}
    return got


def test_reports_of_429_lower_the_effective_limit(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=10, adaptive=True)
        first = cycle(client, pool, {"status": 429})
        assert first.headers["X-Effective-Limit"] == "10"
        after = client.post(f"/v1/pools/{pool}/lock/acquire")
        assert after.headers["X-Effective-Limit"] == str(LOWERED)
        state = client.get(f"/v1/pools/{pool}").json()
        assert state["effective_limit"] == LOWERED < 10 and state["limit"] == 10
        assert state["learned"]["limit"] == round(10 * BETA, 3)


def test_throttle_reported_in_headers_counts_too(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=10, adaptive=True)
        cycle(client, pool, {"status": 200, "throttled": 3})
        assert client.get(f"/v1/pools/{pool}").json()["effective_limit"] == LOWERED


def test_a_retry_hint_pauses_admissions_then_they_resume(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=10, adaptive=True)
        cycle(client, pool, {"status": 429, "headers": {"Retry-After": "2"}})
        paused = client.post(f"/v1/pools/{pool}/lock/acquire")
        assert paused.status_code == 429
        assert paused.json()["error"]["code"] == "too_many_requests"
        assert 1 <= int(paused.headers["Retry-After"]) <= 2
        assert client.get(f"/v1/pools/{pool}").json()["learned"]["paused_until_at"]
        # a waiter waits out the pause within its own wait
        started = time.monotonic()
        waited = client.post(f"/v1/pools/{pool}/lock/acquire", json={"wait_ms": 5_000})
        assert waited.status_code == 200, waited.text
        assert time.monotonic() - started < 4.5


def test_a_fixed_pool_is_not_paused_by_reports(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=10)
        cycle(client, pool, {"status": 429, "retry_after_ms": 60_000})
        got = client.post(f"/v1/pools/{pool}/lock/acquire")
        assert got.status_code == 200 and got.headers["X-Effective-Limit"] == "10"


def test_rate_from_headers_limits_an_rpm_pool(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=50, rpm=600)
        cycle(client, pool, {"status": 200, "headers": {
            "x-ratelimit-limit-requests": "3",
            "x-ratelimit-remaining-requests": "2",
            "x-ratelimit-reset-requests": "20s",
        }})
        state = client.get(f"/v1/pools/{pool}").json()
        assert state["effective_rpm"] == 3 and state["learned"]["rpm"] == 3
        assert client.post(f"/v1/pools/{pool}/lock/acquire").status_code == 200
        assert client.post(f"/v1/pools/{pool}/lock/acquire").status_code == 200
        refused = client.post(f"/v1/pools/{pool}/lock/acquire")
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 50


def test_rate_object_wins_over_headers(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=50, rpm=600)
        cycle(client, pool, {"status": 200, "rate": {"limit": 5},
                             "headers": {"x-ratelimit-limit-requests": "2"}})
        assert client.get(f"/v1/pools/{pool}").json()["learned"]["rpm"] == 5


def test_malformed_rate_headers_are_ignored(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=10, adaptive=True)
        cycle(client, pool, {"status": 200, "headers": {
            "retry-after": "soon", "x-ratelimit-reset-requests": "-5zz",
            "anthropic-ratelimit-requests-reset": "yesterday", "ratelimit": "\x00;;;",
        }})
        state = client.get(f"/v1/pools/{pool}").json()
        assert state["learned"]["paused_until_at"] is None
        assert client.post(f"/v1/pools/{pool}/lock/acquire").status_code == 200


def test_learned_state_survives_a_restart(fresh_server: ServerProcess) -> None:
    with fresh_server.client() as client:
        pool = make_pool(client, limit=10, adaptive=True, rpm=1000)
        cycle(client, pool, {"status": 429, "rate": {"limit": 120}})
        before = client.get(f"/v1/pools/{pool}").json()
    assert before["effective_limit"] == LOWERED and before["effective_rpm"] == 120
    fresh_server.kill9()
    fresh_server.start()
    with fresh_server.client() as client:
        after = client.get(f"/v1/pools/{pool}").json()
    assert after["effective_limit"] == LOWERED and after["learned"] == before["learned"]
    assert after["effective_rpm"] == 120


def test_freed_slots_go_to_every_waiter_promptly(server: ServerProcess) -> None:
    """Three slots freed at once admit three waiters at once, not one per
    periodic re-check (a lost wake-up regression)."""
    import threading

    with server.client() as client:
        pool = make_pool(client, limit=3)
        held = [client.post(f"/v1/pools/{pool}/lock/acquire").json()["slot_id"]
                for _ in range(3)]
    admitted: list[float] = []

    def wait_for_slot() -> None:
        with server.client() as c:
            got = c.post(f"/v1/pools/{pool}/lock/acquire", json={"wait_ms": 10_000})
            assert got.status_code == 200, got.text
            admitted.append(time.monotonic())

    waiters = [threading.Thread(target=wait_for_slot) for _ in range(3)]
    for t in waiters:
        t.start()
    time.sleep(0.5)  # all three are parked
    with server.client() as client:
        released_at = time.monotonic()
        for slot in held:
            client.post(f"/v1/pools/{pool}/lock/{slot}/release")
    for t in waiters:
        t.join(timeout=15)
    assert len(admitted) == 3
    # Far below the 1 s safety-net re-check that a lost wake-up falls back to.
    assert max(admitted) - released_at < 0.8
