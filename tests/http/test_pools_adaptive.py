"""Adaptive admission over HTTP (SPEC §4.5): outcomes reported on release move
the pool's effective limit, retry hints pause admissions, and what was learned
survives a restart."""

from __future__ import annotations

import math
import time

import httpx

from fencepost.core.governor import BETA, LEARNED_PACE_SHARE
from support import ServerProcess, unique_name, wait_parked, wait_until

LOWERED = math.floor(10 * BETA)  # one throttle report on a pool of limit 10
# The loss needs a release to land while a retry is in flight: about one round in three.
WAKE_ROUNDS = 20
WAIT_MS = 20_000  # a waiter's wait: only a lost wake-up makes it wait all of it


def make_pool(client: httpx.Client, **config: object) -> str:
    name = unique_name("adaptive")
    assert client.put(f"/v1/pools/{name}", json=config).status_code == 201
    return name


def warmed(client: httpx.Client, **config: object) -> str:
    """An adaptive pool past its slow start (SPEC §4.5): successes reported
    until its effective limit is the configured one."""
    pool = make_pool(client, adaptive=True, **config)
    for _ in range(int(str(config["limit"]))):
        if client.get(f"/v1/pools/{pool}").json()["effective_limit"] == config["limit"]:
            return pool
        cycle(client, pool, {"status": 200})
    raise AssertionError("the pool did not leave its slow start")


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
        pool = warmed(client, limit=10)
        first = cycle(client, pool, {"status": 429})
        assert first.headers["X-Effective-Limit"] == "10"
        after = client.post(f"/v1/pools/{pool}/lock/acquire")
        assert after.headers["X-Effective-Limit"] == str(LOWERED)
        state = client.get(f"/v1/pools/{pool}").json()
        assert state["effective_limit"] == LOWERED < 10 and state["limit"] == 10
        assert state["learned"]["limit"] == round(10 * BETA, 3)


def test_throttle_reported_in_headers_counts_too(server: ServerProcess) -> None:
    with server.client() as client:
        pool = warmed(client, limit=10)
        cycle(client, pool, {"status": 200, "throttled": 3})
        assert client.get(f"/v1/pools/{pool}").json()["effective_limit"] == LOWERED


def test_a_throttle_naming_no_budget_lowers_the_limit_without_pausing(
        server: ServerProcess) -> None:
    # What a cap on calls in progress sends: 429, a whole-second Retry-After, no rate headers.
    with server.client() as client:
        pool = warmed(client, limit=10)
        cycle(client, pool, {"status": 429, "headers": {"Retry-After": "1"}})
        got = client.post(f"/v1/pools/{pool}/lock/acquire")
        assert got.status_code == 200 and got.headers["X-Effective-Limit"] == str(LOWERED)
        state = client.get(f"/v1/pools/{pool}").json()
        learned = state["learned"]
        assert learned["paused_until_at"] is None
        assert learned["effective_limit"] == LOWERED
        assert learned["last_hint"]["source"] == "retry-after"
        assert learned["last_hint"]["retry_after_ms"] == 1_000
        assert state["stats"]["last_retry_after_ms"] == 1_000  # a hint from the headers


SPENT = {  # OpenAI's headers when the request budget is spent: 2 a minute, back in 30 s
    "x-ratelimit-limit-requests": "2",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "30s",
    "retry-after": "30",
}


def test_an_empty_budget_pauses_and_fail_fast_gets_429_saying_so(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=10, adaptive=True)
        cycle(client, pool, {"status": 429, "headers": SPENT})
        refused = client.post(f"/v1/pools/{pool}/lock/acquire")
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "too_many_requests" and "paused" in error["message"]
        assert 29 <= int(refused.headers["Retry-After"]) <= 30  # the pause's end
        learned = client.get(f"/v1/pools/{pool}").json()["learned"]
        assert learned["paused_until_at"] == error["paused_until_at"]
        assert learned["effective_rpm"] == 2 and learned["window_ms"] == 60_000
        assert learned["last_hint"]["source"] == "reset"
        assert learned["last_hint"]["retry_after_ms"] == 30_000


def test_a_waiter_timing_out_during_a_pause_gets_504_saying_so(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=10, adaptive=True)
        cycle(client, pool, {"status": 429, "headers": SPENT})
        waited = client.post(f"/v1/pools/{pool}/lock/acquire", json={"wait_ms": 300})
        assert waited.status_code == 504, waited.text
        error = waited.json()["error"]
        assert error["code"] == "queue_timeout" and "paused" in error["message"]
        assert 28 <= int(waited.headers["Retry-After"]) <= 30


def test_a_waiter_gets_in_once_a_probe_finds_the_budget_refilled(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=10, adaptive=True)
        cycle(client, pool, {"status": 429, "headers": {
            "x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "2s", "retry-after": "2"}})
        assert client.post(f"/v1/pools/{pool}/lock/acquire").status_code == 429
        # the first probe is due after one refill interval (100 ms at 600 a minute)
        probe = client.post(f"/v1/pools/{pool}/lock/acquire", json={"wait_ms": 5_000})
        assert probe.status_code == 200, probe.text
        released = client.post(f"/v1/pools/{pool}/lock/{probe.json()['slot_id']}/release",
                               json={"status": 200})
        assert released.json() == {"released": True}
        state = client.get(f"/v1/pools/{pool}").json()
        assert state["learned"]["paused_until_at"] is None  # resumed early


def test_a_fixed_pool_is_not_paused_by_reports(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=10)
        cycle(client, pool, {"status": 429, "retry_after_ms": 60_000, "headers": SPENT})
        got = client.post(f"/v1/pools/{pool}/lock/acquire")
        assert got.status_code == 200 and got.headers["X-Effective-Limit"] == "10"


def test_a_learned_hourly_rate_spaces_admissions(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=50, adaptive=True)
        cycle(client, pool, {"status": 200, "headers": {  # GitHub: 120 an hour
            "x-ratelimit-limit": "120", "x-ratelimit-remaining": "100",
            "x-ratelimit-reset": str(int(time.time()) + 3000),
        }})
        state = client.get(f"/v1/pools/{pool}").json()
        assert state["effective_rpm"] == 2 and state["learned"]["window_ms"] == 3_600_000
        # one every 30 s after a burst of two, not 120 at once
        assert client.post(f"/v1/pools/{pool}/lock/acquire").status_code == 200
        assert client.post(f"/v1/pools/{pool}/lock/acquire").status_code == 200
        refused = client.post(f"/v1/pools/{pool}/lock/acquire")
        assert refused.status_code == 429
        assert "pacing" in refused.json()["error"]["message"]
        assert 25 <= int(refused.headers["Retry-After"]) <= 32  # paced a little below 2/min


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
            "anthropic-ratelimit-requests-reset": "yesterday", "ratelimit": "r=;;;t=",
        }})  # (a NUL in a header value is a 422: tests/http/test_nul_strings.py)
        state = client.get(f"/v1/pools/{pool}").json()
        assert state["learned"]["paused_until_at"] is None
        assert client.post(f"/v1/pools/{pool}/lock/acquire").status_code == 200


def test_learned_state_survives_a_restart(fresh_server: ServerProcess) -> None:
    with fresh_server.client() as client:
        pool = warmed(client, limit=10)
        assert client.patch(f"/v1/pools/{pool}", json={"rpm": 1000}).status_code == 200
        cycle(client, pool, {"status": 429, "rate": {"limit": 120}})
        before = client.get(f"/v1/pools/{pool}").json()
    paced_rpm = round(120 * LEARNED_PACE_SHARE)  # learned rates are paced a little below
    assert before["effective_limit"] == LOWERED and before["effective_rpm"] == paced_rpm
    fresh_server.kill9()
    fresh_server.start()
    with fresh_server.client() as client:
        after = client.get(f"/v1/pools/{pool}").json()
    assert after["effective_limit"] == LOWERED and after["learned"] == before["learned"]
    assert after["effective_rpm"] == paced_rpm


def test_freed_slots_go_to_every_waiter_through_wake_ups(wake_server: ServerProcess) -> None:
    """Three slots freed one after another admit all three parked waiters, each
    through its wake-up (a lost wake-up regression: a wake-up that reached a
    waiter whose retry was in flight, and that it did not need, was dropped
    instead of passed on). The server has no safety wake (WAKE_UPS_ONLY): a
    waiter whose wake-up is lost is admitted only by its last try when its
    wait runs out, so it waited its whole wait (X-Queued-Ms, on the server's
    clock, at least wait_ms), where a woken one did not. Several rounds, since
    the loss needs a release to land while a retry is in flight."""
    import threading

    with wake_server.client() as client:
        pool = make_pool(client, limit=3)
        for _ in range(WAKE_ROUNDS):
            held = [client.post(f"/v1/pools/{pool}/lock/acquire").json()["slot_id"]
                    for _ in range(3)]
            answers: list[httpx.Response] = []

            def wait_for_slot(answers: list[httpx.Response] = answers) -> None:
                with wake_server.client() as c:
                    answers.append(c.post(f"/v1/pools/{pool}/lock/acquire",
                                          json={"wait_ms": WAIT_MS}))

            waiters = [threading.Thread(target=wait_for_slot) for _ in range(3)]
            for t in waiters:
                t.start()
            wait_until(lambda: client.get(f"/v1/pools/{pool}").json()["queued"] == 3,
                       "three waiters in line")
            wait_parked(wake_server, 3)
            for slot in held:
                client.post(f"/v1/pools/{pool}/lock/{slot}/release")
            for t in waiters:
                t.join(timeout=60)
            assert [a.status_code for a in answers] == [200, 200, 200], \
                [a.text for a in answers]
            # Woken, not admitted by the last try at the end of the wait.
            assert all(int(a.headers["X-Queued-Ms"]) < WAIT_MS for a in answers), \
                [a.headers["X-Queued-Ms"] for a in answers]
            for answer in answers:
                slot = answer.json()["slot_id"]
                assert client.post(f"/v1/pools/{pool}/lock/{slot}/release").json() == {
                    "released": True}


def test_turning_adaptive_off_with_patch_ends_a_pause(server: ServerProcess) -> None:
    with server.client() as client:
        pool = make_pool(client, limit=10, adaptive=True)
        cycle(client, pool, {"status": 429, "headers": SPENT})
        assert client.post(f"/v1/pools/{pool}/lock/acquire").status_code == 429
        patched = client.patch(f"/v1/pools/{pool}", json={"adaptive": False})
        assert patched.status_code == 200 and patched.json()["limit"] == 10
        got = client.post(f"/v1/pools/{pool}/lock/acquire")
        assert got.status_code == 200 and got.headers["X-Effective-Limit"] == "10"
