"""The Store protocol's behaviour, identical on every backend."""

from __future__ import annotations

import asyncio

import pytest

from fencepost.core.keys import Role
from fencepost.core.leases import Busy, Granted, OnExpiry
from fencepost.core.slots import PoolConfig
from fencepost.errors import Conflict, LeaseExpired, LeaseLost
from fencepost.store.base import Freed, NewKey, lock_freed

from .conftest import reopen
from .store_support import ADMIN, P, grant, req, token


async def test_grant_then_refuse_then_repeat(store):
    a, b = token(), token()
    lease = await grant(store, tok=a)
    refused = await store.acquire_lock(P, "k", req(b), wait_alive_ms=None)
    assert isinstance(refused.outcome, Busy) and refused.outcome.holder == lease
    again = await store.acquire_lock(P, "k", req(a, ttl=99), wait_alive_ms=None)
    assert isinstance(again.outcome, Granted) and not again.outcome.created
    assert again.outcome.lease == lease


async def test_concurrent_acquires_grant_exactly_one(store):
    results = await asyncio.gather(
        *(store.acquire_lock(P, "hot", req(), wait_alive_ms=None) for _ in range(64))
    )
    assert sum(isinstance(r.outcome, Granted) for r in results) == 1


async def test_fencing_tokens_rise_across_keys_and_reopen(store, tmp_path, clock):
    first = await grant(store, "a")
    second = await grant(store, "b")
    assert second.fencing_token > first.fencing_token
    await store.close()
    reopened = reopen(store, clock)
    await reopened.open()
    try:
        third = await grant(reopened, "c")
        assert third.fencing_token > second.fencing_token
        # the acknowledged lease survived the reopen
        view = await reopened.get_lock(P, "a")
        assert view.lease == first
    finally:
        await reopened.close()
        await store.open()  # the fixture closes it again


async def test_expiry_by_the_store_clock(store, clock):
    a = token()
    await grant(store, tok=a, ttl=10)
    clock.advance(10_000)
    view = await store.get_lock(P, "k")
    assert view.lease is None
    lease = await grant(store, ttl=10)
    assert lease.lock_token != a
    with pytest.raises(LeaseLost) as info:
        await store.renew_lock(P, "k", a, 30)
    assert info.value.extra["reason"] == "superseded"


async def test_renew_rules(store, clock):
    a = token()
    lease = await grant(store, tok=a, ttl=10)
    clock.advance(5_000)
    renewed = await store.renew_lock(P, "k", a, 5)
    assert renewed.expires_ms == clock.now + 5_000
    assert renewed.fencing_token == lease.fencing_token
    clock.advance(4_000)  # 1 s left
    with pytest.raises(LeaseExpired):
        await store.renew_lock(P, "k", a, 30)
    view = await store.get_lock(P, "k")
    assert view.lease is not None and view.lease.expires_ms == renewed.expires_ms


async def test_release_and_reasons(store):
    a = token()
    await grant(store, tok=a)
    assert await store.release_lock(P, "k", a) is True
    assert await store.release_lock(P, "k", a) is False
    with pytest.raises(LeaseLost) as info:
        await store.renew_lock(P, "k", a, 30)
    assert info.value.extra["reason"] == "released"


async def test_force_release(store, clock):
    a = token()
    lease = await grant(store, tok=a, operation="deploy")
    clock.advance(1_234)
    result = await store.force_release(P, "k", ADMIN)
    assert result.lease == lease and result.now_ms - lease.acquired_ms == 1_234
    assert (await store.force_release(P, "k", ADMIN)).lease is None
    with pytest.raises(LeaseLost) as info:
        await store.renew_lock(P, "k", a, 30)
    assert info.value.extra["reason"] == "force_released"


async def test_keep_lease_outlives_expiry_until_deadline(store, clock):
    a = token()
    lease = await grant(store, tok=a, ttl=5, on_expiry=OnExpiry.KEEP)
    clock.advance(60_000)
    assert await store.reap() == 0
    assert (await store.get_lock(P, "k")).lease == lease
    renewed = await store.renew_lock(P, "k", a, 5)
    assert renewed.expires_ms == clock.now + 5_000
    clock.now = lease.deadline_ms
    assert await store.reap() == 1
    assert (await store.get_lock(P, "k")).lease is None


async def test_reaper_frees_dead_leases_and_announces_them(store, clock):
    events: list[Freed] = []
    store.add_freed_listener(events.append)
    await grant(store, "dies", ttl=5)
    await grant(store, "lives", ttl=60)
    clock.advance(5_000)
    assert await store.reap() == 1
    await asyncio.sleep(0)
    assert lock_freed(P, "dies") in events
    assert await store.reap() == 0  # idempotent
    assert (await store.get_lock(P, "lives")).lease is not None


async def test_waiters_are_granted_in_ticket_order(store):
    holder = token()
    await grant(store, tok=holder)
    w1, w2 = req(), req()
    r1 = await store.acquire_lock(P, "k", w1, wait_alive_ms=5_000)
    r2 = await store.acquire_lock(P, "k", w2, wait_alive_ms=5_000)
    assert r1.ticket is not None and r2.ticket is not None and r1.ticket < r2.ticket
    assert (await store.get_lock(P, "k")).waiters == 2
    await store.release_lock(P, "k", holder)
    # a fail-fast caller does not jump the line, nor does the second waiter
    assert isinstance((await store.acquire_lock(P, "k", req(), wait_alive_ms=None)).outcome, Busy)
    assert isinstance((await store.retry_waiter(P, "k", w2, r2.ticket, 5_000)).outcome, Busy)
    first = await store.retry_waiter(P, "k", w1, r1.ticket, 5_000)
    assert isinstance(first.outcome, Granted) and first.outcome.lease.lock_token == w1.lock_token


async def test_a_dead_waiter_does_not_block_the_line(store, clock):
    holder = token()
    await grant(store, tok=holder)
    ghost = await store.acquire_lock(P, "k", req(), wait_alive_ms=2_000)
    w2 = req()
    r2 = await store.acquire_lock(P, "k", w2, wait_alive_ms=10_000)
    await store.release_lock(P, "k", holder)
    clock.advance(2_000)  # the ghost stopped refreshing its place
    assert ghost.ticket is not None
    granted = await store.retry_waiter(P, "k", w2, r2.ticket, 5_000)
    assert isinstance(granted.outcome, Granted)


async def test_the_sweep_keeps_the_places_it_is_given(store, clock):
    await grant(store)
    await store.put_pool(P, "api", PoolConfig(limit=1, queue_size=5))
    assert (await store.acquire_slot(P, "api", wait_alive_ms=None)).slot is not None
    lock_place = await store.acquire_lock(P, "k", req(), wait_alive_ms=2_000)
    slot_place = await store.acquire_slot(P, "api", wait_ms=2_000, wait_alive_ms=2_000)
    other = await store.acquire_lock(P, "k", req(), wait_alive_ms=2_000)
    clock.advance(1_500)
    gone = await store.keep_waiting(
        {("lock", P, "k"): [lock_place.ticket], ("pool", P, "api"): [slot_place.ticket]}, 10_000
    )
    assert gone == {}
    clock.advance(9_000)  # past the places' own end, within the refreshed end
    await store.reap()
    assert (await store.get_lock(P, "k")).waiters == 1  # the other place lapsed
    assert (await store.get_pool(P, "api")).queued == 1
    clock.advance(1_000)  # past the refreshed end
    await store.reap()
    assert (await store.get_lock(P, "k")).waiters == 0
    assert (await store.get_pool(P, "api")).queued == 0
    assert other.ticket != lock_place.ticket


async def test_leaving_the_line_wakes_the_next(store):
    events: list[Freed] = []
    store.add_freed_listener(events.append)
    await grant(store)
    r = await store.acquire_lock(P, "k", req(), wait_alive_ms=5_000)
    await store.leave_line(P, "k", r.ticket)
    await asyncio.sleep(0)
    assert lock_freed(P, "k") in events
    assert (await store.get_lock(P, "k")).waiters == 0


async def test_list_locks_pages_by_key(store):
    for name in ["b", "a", "c", "ab", "x"]:
        await grant(store, name)
    page = await store.list_locks(P, "a", None, 10)
    assert [v.key for v in page] == ["a", "ab"]
    first = await store.list_locks(P, "", None, 2)
    assert [v.key for v in first] == ["a", "ab"]
    rest = await store.list_locks(P, "", "ab", 10)
    assert [v.key for v in rest] == ["b", "c", "x"]


async def test_projects_are_isolated(store):
    secret = await store.create_project("other")
    other = await store.find_key(secret)
    assert other is not None and other.project == "other" and other.role is Role.ADMIN
    await grant(store, "same")
    result = await store.acquire_lock("other", "same", req(), wait_alive_ms=None)
    assert isinstance(result.outcome, Granted)
    with pytest.raises(Conflict):
        await store.create_project("other")


async def test_keys_bootstrap_create_find_revoke(store, clock):
    secret = await store.bootstrap("b" * 40)
    assert secret == "b" * 40
    assert await store.bootstrap(None) is None  # only once
    admin = await store.find_key(secret)
    assert admin is not None and admin.role is Role.ADMIN and admin.project == "default"
    clock.advance(1)  # keys are listed in creation order
    record, member_secret = await store.create_key(
        "default", NewKey(Role.MEMBER, name="ci", expires_in_ms=1_000, rpm_quota=5)
    )
    assert record.secret_hash != member_secret and member_secret not in repr(record)
    found = await store.find_key(member_secret)
    assert found == record and found.expires_ms == clock.now + 1_000
    assert await store.find_key("nope") is None
    assert await store.revoke_key("elsewhere", record.id) is False
    assert await store.revoke_key("default", record.id) is True
    assert (await store.find_key(member_secret)).revoked_ms is not None
    assert [k.id for k in await store.list_keys("default")] == [admin.id, record.id]


async def test_request_quota_is_counted_in_the_store(store, clock):
    assert [await store.admit_request("key_a", 2) for _ in range(2)] == [None, None]
    assert await store.admit_request("key_a", 2) == 30_000
    assert await store.admit_request("key_b", 2) is None  # per key
    clock.advance(30_000)
    assert await store.admit_request("key_a", 2) is None


async def test_the_sweep_reports_the_places_the_store_dropped(store, clock):
    # A place that ran out and was reaped cannot be refreshed back: the sweep
    # is told, so that its waiter rejoins instead of waiting on a dead ticket.
    await grant(store)
    await store.put_pool(P, "api", PoolConfig(limit=1, queue_size=5))
    assert (await store.acquire_slot(P, "api", wait_alive_ms=None)).slot is not None
    lapsed = await store.acquire_lock(P, "k", req(), wait_alive_ms=1_000)
    kept = await store.acquire_lock(P, "k", req(), wait_alive_ms=5_000)
    lapsed_slot = await store.acquire_slot(P, "api", wait_ms=5_000, wait_alive_ms=1_000)
    assert lapsed.ticket is not None and kept.ticket is not None
    assert lapsed_slot.ticket is not None
    clock.advance(2_000)
    await store.reap()
    gone = await store.keep_waiting(
        {("lock", P, "k"): [lapsed.ticket, kept.ticket], ("pool", P, "api"): [lapsed_slot.ticket]},
        10_000,
    )
    assert gone == {("lock", P, "k"): [lapsed.ticket], ("pool", P, "api"): [lapsed_slot.ticket]}
    assert (await store.get_lock(P, "k")).waiters == 1


async def test_a_waiter_dropped_from_the_line_rejoins_behind_those_who_kept_their_place(
    store, clock
):
    # Its retry finds its place gone and rejoins at the back: it is decided
    # from its new place (behind the waiter that was after it), not from what
    # it read under its old ticket, with nobody ahead.
    holder = await grant(store)
    lapsed_request, kept_request = req(), req()
    lapsed = await store.acquire_lock(P, "k", lapsed_request, wait_alive_ms=1_000)
    kept = await store.acquire_lock(P, "k", kept_request, wait_alive_ms=60_000)
    assert lapsed.ticket is not None and kept.ticket is not None
    clock.advance(2_000)
    await store.reap()
    assert await store.release_lock(P, "k", holder.lock_token)
    again = await store.retry_waiter(P, "k", lapsed_request, lapsed.ticket, 60_000)
    assert isinstance(again.outcome, Busy)
    assert again.ticket is not None and again.ticket > kept.ticket
    granted = await store.retry_waiter(P, "k", kept_request, kept.ticket, 60_000)
    assert isinstance(granted.outcome, Granted)
    assert (await store.get_lock(P, "k")).waiters == 1


@pytest.mark.parametrize("case", ["dead lease in the way", "own lease", "a set"])
async def test_a_waiting_acquire_granted_by_its_general_case_leaves_no_place_in_line(
    store, clock, case
):
    # A caller that may wait sends its place in line with the reads it is
    # decided on; granted after all (a dead lease ended on the way, its own
    # lease acquired again), it must not stay in line, where it would hold
    # back everyone behind it.
    mine = req(wait_ms=60_000)
    if case == "own lease":
        await grant(store, "k", mine.lock_token)
    else:
        await grant(store, "k", ttl=5)
        clock.advance(6_000)  # expired, not reaped yet
    if case == "a set":
        result = await store.acquire_lock_set(P, ["j", "k"], mine, wait_alive_ms=10_000)
        assert not isinstance(result.outcome, Busy)
    else:
        result = await store.acquire_lock(P, "k", mine, wait_alive_ms=10_000)
        assert isinstance(result.outcome, Granted)
        assert result.outcome.created == (case != "own lease")
    assert result.ticket is None
    assert (await store.get_lock(P, "k")).waiters == 0
    behind = req(wait_ms=60_000)
    later = await store.acquire_lock(P, "k", behind, wait_alive_ms=10_000)
    assert isinstance(later.outcome, Busy) and later.ticket is not None
    assert await store.release_lock(P, "k", mine.lock_token)
    granted = await store.retry_waiter(P, "k", behind, later.ticket, 10_000)
    assert isinstance(granted.outcome, Granted)  # nobody left ahead of it


async def test_the_sweep_keeps_a_sets_place_only_in_the_lines_it_is_given(store, clock):
    await grant(store, "a")
    await grant(store, "b")
    waiting = await store.acquire_lock_set(P, ["a", "b"], req(), wait_alive_ms=2_000)
    assert waiting.ticket is not None
    await store.keep_waiting({("lock", P, "a"): [waiting.ticket]}, 10_000)
    clock.advance(3_000)
    await store.reap()
    assert (await store.get_lock(P, "a")).waiters == 1
    assert (await store.get_lock(P, "b")).waiters == 0
