"""Unit budgets over HTTP (SPEC §4.6), on both stores: `cost_per_minute`,
`cost` at acquire and release, pacing that spreads the budget over the minute,
the running average for calls that declare no cost, budgets learned from the
upstream's token headers, X-Remaining-Cost, the line's order, and bad input."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pg_support import server_on
from pool_support import acquire, make_pool, pool_state, release
from support import ServerProcess, assert_error, detail_fields, wait_parked

# 60,000 units a minute: 1,000 refill each second, and the pool lets what
# refills in one second go back to back. A call of 3,000 units moves the clock
# 3 s, so the next call waits about 2 s: tests that expect a refusal hold
# unless a request is delayed by two seconds.
BUDGET = 60_000
CALL = 3_000


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder: Path = tmp_path_factory.mktemp("costs")
    with server_on(request.param, folder) as started:
        yield started


@pytest.fixture
def c(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def _grant(c: httpx.Client, pool: str, **body: Any) -> httpx.Response:
    granted = acquire(c, pool, json=body)
    assert granted.status_code == 200, granted.text
    return granted


def test_the_budget_is_configured_shown_and_paced(c: httpx.Client) -> None:
    pool = make_pool(c, limit=100, cost_per_minute=BUDGET)
    state = pool_state(c, pool)
    assert state["cost_per_minute"] == BUDGET
    assert state["learned"]["effective_cost_per_minute"] == BUDGET
    assert state["learned"]["remaining_cost"] == BUDGET
    first = _grant(c, pool, cost=CALL)
    assert BUDGET - 2 * CALL < int(first.headers["X-Remaining-Cost"]) <= BUDGET - CALL
    # Three seconds of the budget are spoken for: the next call waits for the
    # refill, although 99 slots are free.
    refused = acquire(c, pool, json={"cost": 10})
    err = assert_error(refused, 429)
    assert 0 < err["retry_after_ms"] <= 2_000
    assert int(refused.headers["Retry-After"]) == -(-err["retry_after_ms"] // 1000)
    waited = _grant(c, pool, cost=10, wait_ms=5_000)
    assert int(waited.headers["X-Queued-Ms"]) >= err["retry_after_ms"] - 300


def test_a_pool_without_a_budget_says_so(c: httpx.Client) -> None:
    pool = make_pool(c, limit=5)
    granted = _grant(c, pool, cost=CALL)
    assert "X-Remaining-Cost" not in granted.headers
    learned = pool_state(c, pool)["learned"]
    assert learned["effective_cost_per_minute"] is None and learned["remaining_cost"] is None


def test_a_release_settles_what_the_call_really_cost(c: httpx.Client) -> None:
    pool = make_pool(c, limit=100, cost_per_minute=BUDGET)
    slot = _grant(c, pool, cost=CALL).json()["slot_id"]
    assert_error(acquire(c, pool, json={"cost": CALL}), 429)
    # The first call spent nothing of its estimate (a cached answer): its
    # units come back, and the next call fits at once.
    assert release(c, pool, slot, json={"status": 200, "cost": 0}).json() == {"released": True}
    _grant(c, pool, cost=CALL)


def test_a_call_without_a_cost_is_charged_the_average(c: httpx.Client) -> None:
    pool = make_pool(c, limit=100, cost_per_minute=BUDGET)
    _grant(c, pool, cost=990)  # the clock 0.99 s ahead: still within the second allowed
    assert pool_state(c, pool)["learned"]["average_cost"] == 990
    _grant(c, pool)  # charged the average: the clock is now about 2 s ahead
    assert_error(acquire(c, pool, json={"cost": 0}), 429)


def test_a_large_call_keeps_its_place_in_line(c: httpx.Client, server: ServerProcess) -> None:
    """A waiter of 3,000 units ahead of one of 10 is admitted first, though the
    small one would fit sooner: the line's order holds."""
    pool = make_pool(c, limit=100, cost_per_minute=BUDGET, queue_timeout_ms=20_000)
    _grant(c, pool, cost=2_000)
    granted_at: dict[str, float] = {}

    def wait(name: str, cost: int) -> None:
        with server.client() as own:
            answer = acquire(own, pool, json={"cost": cost, "wait_ms": 15_000}, timeout=30)
            assert answer.status_code == 200, answer.text
            granted_at[name] = time.monotonic()

    big = threading.Thread(target=wait, args=("big", 3_000))
    big.start()
    wait_parked(server, 1)
    small = threading.Thread(target=wait, args=("small", 10))
    small.start()
    big.join(30)
    small.join(30)
    assert set(granted_at) == {"big", "small"}
    assert granted_at["big"] <= granted_at["small"]


def test_a_budget_is_learned_from_token_headers(c: httpx.Client) -> None:
    pool = make_pool(c, limit=100, adaptive=True)
    slot = _grant(c, pool).json()["slot_id"]
    # OpenAI's headers: 90,000 tokens a minute, of which 45,000 remain.
    headers = {"x-ratelimit-limit-tokens": "90000", "x-ratelimit-remaining-tokens": "45000",
               "x-ratelimit-reset-tokens": "30s"}
    assert release(c, pool, slot, json={"status": 200, "headers": headers}).status_code == 200
    learned = pool_state(c, pool)["learned"]
    assert learned["cost_per_minute"] == 90_000
    assert learned["effective_cost_per_minute"] == int(90_000 * 0.99)
    # Half of the budget is spent upstream: the next call waits for it to refill.
    err = assert_error(acquire(c, pool, json={"cost": 100}), 429)
    assert 25_000 < err["retry_after_ms"] <= 31_000


def test_a_configured_budget_below_the_learned_one_wins(c: httpx.Client) -> None:
    pool = make_pool(c, limit=100, adaptive=True, cost_per_minute=BUDGET)
    slot = _grant(c, pool).json()["slot_id"]
    release(c, pool, slot, json={"status": 200, "rate": {"token_limit": 1_000_000}})
    assert pool_state(c, pool)["learned"]["effective_cost_per_minute"] == BUDGET


def test_patch_sets_and_clears_the_budget(c: httpx.Client) -> None:
    pool = make_pool(c, limit=3)
    patched = c.patch(f"/v1/pools/{pool}", json={"cost_per_minute": 500})
    assert patched.status_code == 200 and patched.json()["cost_per_minute"] == 500
    assert pool_state(c, pool)["limit"] == 3
    cleared = c.patch(f"/v1/pools/{pool}", json={"cost_per_minute": None})
    assert cleared.json()["cost_per_minute"] is None
    _grant(c, pool, cost=10**9)  # no budget: any cost goes


@pytest.mark.parametrize("value", [0, -1, 10**12 + 1, "60000", 1.5, True])
def test_a_bad_budget_is_refused_and_changes_nothing(c: httpx.Client, value: Any) -> None:
    pool = make_pool(c, limit=3, cost_per_minute=BUDGET)
    for sent in (c.put(f"/v1/pools/{pool}", json={"limit": 3, "cost_per_minute": value}),
                 c.patch(f"/v1/pools/{pool}", json={"cost_per_minute": value})):
        err = assert_error(sent, 422)
        assert detail_fields(err) == {"cost_per_minute"}
    assert pool_state(c, pool)["cost_per_minute"] == BUDGET


@pytest.mark.parametrize("value", [-1, 10**9 + 1, "1000", 2.5, None, [1]])
def test_a_bad_cost_is_refused_and_takes_nothing(c: httpx.Client, value: Any) -> None:
    pool = make_pool(c, limit=3, cost_per_minute=BUDGET)
    if value is None:
        # null is "no cost declared": the average applies.
        _grant(c, pool, cost=None)
        return
    err = assert_error(acquire(c, pool, json={"cost": value}), 422)
    assert detail_fields(err) == {"cost"}
    slot = _grant(c, pool, cost=5).json()["slot_id"]
    err = assert_error(release(c, pool, slot, json={"cost": value}), 422)
    assert detail_fields(err) == {"cost"}
    state = pool_state(c, pool)
    assert state["in_use"] == 1  # the refused release left the slot held
    assert state["learned"]["remaining_cost"] >= BUDGET - 5 - 1


def test_the_budget_is_shared_by_replicas(tmp_path: Path) -> None:
    from pg_support import migrated_database

    with migrated_database() as url:
        a = ServerProcess(tmp_path / "a", store=url).start()
        b = ServerProcess(tmp_path / "b", store=url).start()
        try:
            with a.client() as ca, b.client() as cb:
                pool = make_pool(ca, limit=100, cost_per_minute=BUDGET)
                _grant(ca, pool, cost=900)
                _grant(cb, pool, cost=CALL)  # the clock is B's to push too
                assert_error(acquire(ca, pool, json={"cost": 1}), 429)
                assert_error(acquire(cb, pool, json={"cost": 1}), 429)
            # It survives a restart of both.
            a.stop()
            b.stop()
            a.start()
            with a.client() as ca:
                assert pool_state(ca, pool)["learned"]["average_cost"] is not None
        finally:
            a.stop()
            b.stop()
