"""Pool behaviour of the Store protocol, identical on every backend."""

from __future__ import annotations

import asyncio

import pytest

from fencepost.core.slots import PoolConfig
from fencepost.errors import Capped, NotFound
from fencepost.store.base import Freed, SlotReport, pool_freed

from .conftest import reopen
from .store_support import P, warmed_pool


async def test_put_creates_then_replaces(store):
    view, created = await store.put_pool(P, "api", PoolConfig(limit=3))
    assert created and view.config.limit == 3 and view.in_use == 0 and view.effective_limit == 3
    view, created = await store.put_pool(P, "api", PoolConfig(limit=5, queue_size=0))
    assert not created and view.config.limit == 5 and view.config.queue_size == 0
    assert [v.name for v in await store.list_pools(P, "", None, 10)] == ["api"]
    assert await store.get_pool("other", "api") is None


async def test_limit_holds_under_concurrency(store):
    await store.put_pool(P, "api", PoolConfig(limit=3))
    results = await asyncio.gather(
        *(store.acquire_slot(P, "api", wait_alive_ms=None) for _ in range(48))
    )
    assert sum(r.slot is not None for r in results) == 3
    refused = [r for r in results if r.slot is None]
    assert all(r.in_use == 3 and r.retry_after_ms is not None for r in refused)


async def test_unknown_pool(store):
    with pytest.raises(NotFound):
        await store.acquire_slot(P, "nope", wait_alive_ms=None)
    with pytest.raises(NotFound):
        await store.release_slot(P, "nope", "slot_x", None)


async def test_queue_order_and_size(store):
    await store.put_pool(P, "api", PoolConfig(limit=1, queue_size=2))
    held = await store.acquire_slot(P, "api", wait_alive_ms=None)
    w1 = await store.acquire_slot(P, "api", wait_ms=5_000, wait_alive_ms=5_000)
    w2 = await store.acquire_slot(P, "api", wait_ms=5_000, wait_alive_ms=5_000)
    full = await store.acquire_slot(P, "api", wait_ms=5_000, wait_alive_ms=5_000)
    assert w1.ticket is not None and w2.ticket is not None and full.ticket is None
    assert (await store.get_pool(P, "api")).queued == 2
    assert await store.release_slot(P, "api", held.slot.slot_id, None)
    assert (await store.acquire_slot(P, "api", wait_alive_ms=None)).slot is None  # no jumping
    assert (await store.retry_slot_waiter(P, "api", w2.ticket, 5_000)).slot is None
    assert (await store.retry_slot_waiter(P, "api", w1.ticket, 5_000)).slot is not None


async def test_the_store_clamps_the_wait_to_the_pool(store):
    config = PoolConfig(limit=1, queue_size=2, queue_timeout_ms=500, term_ms=9_000,
                        renew_interval_ms=1_000)
    await store.put_pool(P, "api", config)
    held = await store.acquire_slot(P, "api", wait_ms=5_000, wait_alive_ms=None)
    assert held.slot is not None and held.config == config and held.wait_ms == 500
    refused = await store.acquire_slot(P, "api", wait_alive_ms=5_000)  # asked no wait
    assert (refused.ticket, refused.wait_ms, refused.config) == (None, 0, config)
    fail_fast = await store.acquire_slot(P, "api", wait_ms=5_000, no_queue=True,
                                         wait_alive_ms=5_000)
    assert (fail_fast.ticket, fail_fast.wait_ms) == (None, 0)
    queued = await store.acquire_slot(P, "api", wait_ms=200, wait_alive_ms=5_000)
    assert queued.ticket is not None and queued.wait_ms == 200
    assert (await store.get_pool(P, "api")).queued == 1
    await store.put_pool(P, "none", PoolConfig(limit=1, queue_size=0))
    await store.acquire_slot(P, "none", wait_alive_ms=None)
    no_line = await store.acquire_slot(P, "none", wait_ms=5_000, wait_alive_ms=5_000)
    assert (no_line.ticket, no_line.wait_ms) == (None, 0)


@pytest.mark.parametrize("how", ["paced", "unknown to this writer"])
async def test_a_waiting_acquire_admitted_by_its_general_case_leaves_no_place_in_line(
    store, clock, how
):
    # A caller that may wait sends its place in line with the reads of the
    # general case; admitted after all, it takes the place back out. A ghost
    # place would hold back every later acquire until it aged out.
    writer = store
    if how == "paced":
        await store.put_pool(P, "api", PoolConfig(limit=5, rpm=60))
    else:
        await store.put_pool(P, "api", PoolConfig(limit=5))
        await store.close()
        writer = reopen(store, clock)  # remembers no pool: reads it first
        await writer.open()
    try:
        waiting = await writer.acquire_slot(P, "api", wait_ms=5_000, wait_alive_ms=60_000)
        assert waiting.slot is not None and waiting.ticket is None
        assert (await writer.get_pool(P, "api")).queued == 0
        clock.advance(1_000)  # the next paced turn
        assert (await writer.acquire_slot(P, "api", wait_alive_ms=None)).slot is not None
    finally:
        if writer is not store:
            await writer.close()
            await store.open()


async def test_a_pool_that_waits_no_time_gives_a_waiting_acquire_no_place(store):
    await store.put_pool(P, "api", PoolConfig(limit=1, queue_size=5, queue_timeout_ms=0))
    assert (await store.acquire_slot(P, "api", wait_alive_ms=None)).slot is not None
    refused = await store.acquire_slot(P, "api", wait_ms=5_000, wait_alive_ms=60_000)
    assert (refused.slot, refused.ticket, refused.wait_ms) == (None, None, 0)
    assert (await store.get_pool(P, "api")).queued == 0


async def test_a_waiting_acquire_of_an_unknown_pool_is_not_found_and_joins_nothing(store):
    with pytest.raises(NotFound):
        await store.acquire_slot(P, "nope", wait_ms=5_000, wait_alive_ms=60_000)
    await store.put_pool(P, "nope", PoolConfig(limit=1))
    assert (await store.get_pool(P, "nope")).queued == 0


async def test_a_waiter_is_granted_under_the_configuration_it_is_admitted_under(store, clock):
    await store.put_pool(P, "api", PoolConfig(limit=1, term_ms=9_000))
    held = await store.acquire_slot(P, "api", wait_alive_ms=None)
    waiter = await store.acquire_slot(P, "api", wait_ms=5_000, wait_alive_ms=5_000)
    assert waiter.config.term_ms == 9_000 and waiter.wait_ms == 5_000
    changed = PoolConfig(limit=1, term_ms=4_000, renew_interval_ms=1_500)
    await store.put_pool(P, "api", changed)
    assert await store.release_slot(P, "api", held.slot.slot_id, None)
    admitted = await store.retry_slot_waiter(P, "api", waiter.ticket, 5_000)
    assert admitted.slot is not None and admitted.config == changed
    assert admitted.slot.lease_deadline_ms == clock.now + 4_000


async def test_an_unknown_pool_is_not_found_before_the_session_is_judged(store):
    session = await store.create_session(P, "key_a", 30, None)
    await store.end_session(P, "key_a", session.session_id)
    with pytest.raises(NotFound):
        await store.acquire_slot(P, "nope", wait_ms=1_000, wait_alive_ms=5_000,
                                 key_id="key_a", session_id=session.session_id)


async def test_renew_cap_and_reclaim(store, clock):
    events: list[Freed] = []
    store.add_freed_listener(events.append)
    await store.put_pool(P, "api", PoolConfig(limit=1, term_ms=1_000, request_timeout_ms=2_500))
    slot = (await store.acquire_slot(P, "api", wait_alive_ms=None)).slot
    clock.advance(900)
    assert (await store.renew_slot(P, "api", slot.slot_id)).lease_deadline_ms == clock.now + 1_000
    clock.advance(900)
    capped = await store.renew_slot(P, "api", slot.slot_id)
    assert capped.lease_deadline_ms == capped.request_deadline_ms
    with pytest.raises(Capped):
        await store.renew_slot(P, "api", slot.slot_id)
    clock.now = capped.request_deadline_ms
    assert await store.reap() == 1
    await asyncio.sleep(0)
    assert pool_freed(P, "api") in events
    view = await store.get_pool(P, "api")
    assert view.in_use == 0 and view.stats.reclaimed == 1
    with pytest.raises(NotFound):
        await store.renew_slot(P, "api", slot.slot_id)


async def test_release_reports_are_counted_once(store):
    await store.put_pool(P, "api", PoolConfig(limit=2))
    slot = (await store.acquire_slot(P, "api", wait_alive_ms=None)).slot
    report = SlotReport(status=429, throttled=3, retry_after_ms=1_500, report_json="{}")
    assert await store.release_slot(P, "api", slot.slot_id, report) is True
    assert await store.release_slot(P, "api", slot.slot_id, report) is False
    stats = (await store.get_pool(P, "api")).stats
    assert stats.released == 1 and stats.status_429 == 1 and stats.statuses["4xx"] == 1
    assert stats.throttled == 3 and stats.last_retry_after_ms == 1_500


async def test_slots_are_scoped_to_project_and_pool(store):
    await store.put_pool(P, "a", PoolConfig(limit=1))
    await store.put_pool(P, "b", PoolConfig(limit=1))
    await store.create_project("other")
    await store.put_pool("other", "a", PoolConfig(limit=1))
    slot = (await store.acquire_slot(P, "a", wait_alive_ms=None)).slot
    with pytest.raises(NotFound):
        await store.release_slot(P, "b", slot.slot_id, None)
    with pytest.raises(NotFound):
        await store.release_slot("other", "a", slot.slot_id, None)
    with pytest.raises(NotFound):
        await store.renew_slot("other", "a", slot.slot_id)
    assert (await store.get_pool(P, "a")).in_use == 1


async def test_delete_ends_slots_and_line(store):
    events: list[Freed] = []
    store.add_freed_listener(events.append)
    await store.put_pool(P, "api", PoolConfig(limit=1))
    await store.acquire_slot(P, "api", wait_alive_ms=None)
    waiter = await store.acquire_slot(P, "api", wait_ms=5_000, wait_alive_ms=5_000)
    assert await store.delete_pool(P, "api") is True
    assert await store.delete_pool(P, "api") is False
    await asyncio.sleep(0)
    assert Freed("pool", P, "api", wake_all=True) in events
    with pytest.raises(NotFound):
        await store.retry_slot_waiter(P, "api", waiter.ticket, 5_000)


async def test_pools_survive_reopen(store, clock):
    await store.put_pool(P, "api", PoolConfig(limit=2, term_ms=60_000, request_timeout_ms=600_000))
    slot = (await store.acquire_slot(P, "api", wait_alive_ms=None)).slot
    await store.close()
    reopened = reopen(store, clock)
    await reopened.open()
    try:
        view = await reopened.get_pool(P, "api")
        assert view.config.term_ms == 60_000 and view.in_use == 1
        assert (await reopened.renew_slot(P, "api", slot.slot_id)).slot_id == slot.slot_id
    finally:
        await reopened.close()
        await store.open()


# --- adaptive admission (SPEC §4.5) -------------------------------------------

import math  # noqa: E402

from fencepost.core import governor as gov  # noqa: E402
from fencepost.core.ratelimit_headers import RateLimitInfo  # noqa: E402

THROTTLED = SlotReport(status=429, report_json="{}")


async def _hold_and_report(store, pool, report, clock, hold_ms=50):
    attempt = await store.acquire_slot(P, pool, wait_alive_ms=None)
    assert attempt.slot is not None, attempt
    clock.advance(hold_ms)
    assert await store.release_slot(P, pool, attempt.slot.slot_id, report)


async def test_throttle_reports_lower_the_effective_limit(store, clock):
    await warmed_pool(store, "ad", 10, clock)
    clock.advance(1_000)  # a round trip after the last change
    await _hold_and_report(store, "ad", THROTTLED, clock)
    view = await store.get_pool(P, "ad")
    lowered = math.floor(10 * gov.BETA)
    assert lowered < 10
    assert view.effective_limit == lowered and view.governor.plateau == 10
    # the lowered limit is enforced
    held = [await store.acquire_slot(P, "ad", wait_alive_ms=None) for _ in range(lowered + 1)]
    assert sum(a.slot is not None for a in held) == lowered
    assert held[-1].effective_limit == lowered


async def test_successes_raise_it_again(store, clock):
    await warmed_pool(store, "ad", 10, clock)
    clock.advance(1_000)
    await _hold_and_report(store, "ad", THROTTLED, clock)
    clock.advance(10_000)  # past the plateau
    for _ in range(40):
        await _hold_and_report(store, "ad", SlotReport(status=200, report_json="{}"), clock)
    assert (await store.get_pool(P, "ad")).effective_limit == 10


async def test_a_new_adaptive_pool_starts_slow_and_doubles_each_round_trip(store, clock):
    """SPEC §4.5's cold start: 2 slots, one more per success, up to the limit;
    the first throttle ends it (then the limit grows by about one a round trip)."""
    await store.put_pool(P, "cold", PoolConfig(limit=20, adaptive=True))
    view = await store.get_pool(P, "cold")
    assert view.effective_limit == gov.SLOW_START_FROM and view.governor.slow_start
    held = [await store.acquire_slot(P, "cold", wait_alive_ms=None) for _ in range(3)]
    assert [a.slot is not None for a in held] == [True, True, False]
    clock.advance(100)
    for attempt in held[:2]:  # one round trip: both succeed
        await store.release_slot(P, "cold", attempt.slot.slot_id,
                                 SlotReport(status=200, report_json="{}"))
    assert (await store.get_pool(P, "cold")).effective_limit == 4  # doubled
    for _ in range(4):
        await _hold_and_report(store, "cold", SlotReport(status=200, report_json="{}"), clock)
    assert (await store.get_pool(P, "cold")).effective_limit == 8
    await _hold_and_report(store, "cold", THROTTLED, clock)
    after = await store.get_pool(P, "cold")
    assert not after.governor.slow_start and after.effective_limit == math.floor(8 * gov.BETA)


async def test_stale_evidence_starts_slow_again(store, clock):
    await warmed_pool(store, "idle", 40, clock)
    assert (await store.get_pool(P, "idle")).effective_limit == 40
    clock.advance(gov.STALE_MS + 1_000)  # a quiet night
    assert (await store.get_pool(P, "idle")).effective_limit == 10  # a quarter of it
    await _hold_and_report(store, "idle", SlotReport(status=200, report_json="{}"), clock)
    view = await store.get_pool(P, "idle")
    assert view.governor.slow_start and view.effective_limit == 11


async def test_fixed_pools_ignore_reports(store, clock):
    await store.put_pool(P, "fixed", PoolConfig(limit=10))
    hinted = SlotReport(status=429, retry_after_ms=5_000, report_json="{}")
    await _hold_and_report(store, "fixed", hinted, clock)
    view = await store.get_pool(P, "fixed")
    assert view.effective_limit == 10
    assert (await store.acquire_slot(P, "fixed", wait_alive_ms=None)).slot is not None


async def test_a_hint_naming_no_budget_does_not_pause(store, clock):
    await store.put_pool(P, "ad", PoolConfig(limit=10, adaptive=True))
    await _hold_and_report(
        store, "ad", SlotReport(status=429, retry_after_ms=2_000, report_json="{}"), clock)
    assert (await store.acquire_slot(P, "ad", wait_alive_ms=None)).slot is not None
    assert (await store.get_pool(P, "ad")).stats.last_retry_after_ms == 2_000


async def test_an_empty_budget_pauses_admissions_but_lets_probes_through(store, clock):
    await store.put_pool(P, "ad", PoolConfig(limit=10, adaptive=True))
    spent = RateLimitInfo(request_limit=600, request_remaining=0, request_reset_ms=2_000,
                          retry_after_ms=2_000)
    await _hold_and_report(
        store, "ad", SlotReport(status=429, rate=spent, report_json="{}"), clock)
    view = await store.get_pool(P, "ad")
    assert view.stats.last_retry_after_ms == 2_000  # a hint from the headers is recorded
    paused = await store.acquire_slot(P, "ad", wait_alive_ms=None)
    assert paused.slot is None and paused.paused_until_ms == clock.now + 2_000
    assert paused.retry_after_ms == 100  # the first probe: one refill interval (600/min)
    clock.advance(100)
    probe = await store.acquire_slot(P, "ad", wait_alive_ms=None)
    assert probe.slot is not None
    after = await store.acquire_slot(P, "ad", wait_alive_ms=None)
    assert after.slot is None and after.retry_after_ms == 200  # the gap doubled
    # the probe got through: the pause ends early
    clock.advance(30)
    assert await store.release_slot(P, "ad", probe.slot.slot_id,
                                    SlotReport(status=200, report_json="{}"))
    assert (await store.get_pool(P, "ad")).governor.paused_until_ms == 0
    assert (await store.acquire_slot(P, "ad", wait_alive_ms=None)).slot is not None


async def test_rpm_spaces_admissions_over_the_minute(store, clock):
    await store.put_pool(P, "rated", PoolConfig(limit=100, rpm=3))
    admitted = []
    for _ in range(6):
        admitted.append(await store.acquire_slot(P, "rated", wait_alive_ms=None))
        clock.advance(5_000)
    # one every 20 s after a burst of two, never 3 in the first seconds
    assert [a.slot is not None for a in admitted] == [True, True, False, False, True, False]
    assert admitted[2].retry_after_ms == 10_000  # the next turn is at 20 s


async def test_reported_rate_teaches_a_lower_rpm_and_survives_reopen(store, clock):
    await store.put_pool(P, "rated", PoolConfig(limit=100, rpm=1_000))
    rate = RateLimitInfo(request_limit=2, request_remaining=1, request_reset_ms=30_000)
    await _hold_and_report(store, "rated", SlotReport(status=200, rate=rate, report_json="{}"),
                           clock)
    view = await store.get_pool(P, "rated")
    assert view.effective_rpm == 2 and view.governor.learned_rpm == 2
    assert (await store.acquire_slot(P, "rated", wait_alive_ms=None)).slot is not None
    assert (await store.acquire_slot(P, "rated", wait_alive_ms=None)).slot is None
    await store.close()
    reopened = reopen(store, clock)
    await reopened.open()
    try:
        assert (await reopened.get_pool(P, "rated")).effective_rpm == 2
    finally:
        await reopened.close()
        await store.open()


async def test_spent_window_pauses_until_reset(store, clock):
    await store.put_pool(P, "ad", PoolConfig(limit=10, adaptive=True))
    rate = RateLimitInfo(request_limit=60, request_remaining=0, request_reset_ms=3_000)
    await _hold_and_report(store, "ad", SlotReport(status=429, rate=rate, report_json="{}"), clock)
    refused = await store.acquire_slot(P, "ad", wait_alive_ms=None)
    assert refused.slot is None and refused.paused_until_ms == clock.now + 3_000
    assert refused.retry_after_ms == 1_000  # a probe after one refill interval (60 a minute)
