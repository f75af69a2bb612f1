"""Shared locks (SPEC §3.6) and lock sets (§3.7), identical on every backend."""

from __future__ import annotations

import asyncio

import pytest

from fencepost.core.leases import Busy, Granted, Mode, SetGranted
from fencepost.errors import Forbidden, LeaseLost
from fencepost.store.base import ForceReleaser, Freed, lock_freed

from .store_support import ADMIN, P, req

SHARED = Mode.SHARED

async def try_lock(store, key="k", request=None, wait=False):
    request = request or req()
    return await store.acquire_lock(P, key, request, wait_alive_ms=60_000 if wait else None)


async def grant(store, key="k", request=None):
    result = await try_lock(store, key, request)
    assert isinstance(result.outcome, Granted) and result.outcome.created, result
    return result.outcome.lease


async def refused(store, key="k", request=None) -> Busy:
    result = await try_lock(store, key, request)
    assert isinstance(result.outcome, Busy), result
    return result.outcome


async def test_shared_leases_live_together_each_with_its_own_rising_token(store):
    first = await grant(store, request=req(mode=SHARED))
    second = await grant(store, request=req(mode=SHARED))
    assert second.fencing_token > first.fencing_token
    assert first.mode is second.mode is SHARED
    busy = await refused(store)  # an exclusive acquire waits for every reader
    assert busy.holder is not None and busy.holder.mode is SHARED
    for lease in (first, second):
        verdict = await store.fence_check(P, "k", lease.fencing_token)
        assert verdict.current and verdict.live_token == lease.fencing_token
    assert await store.release_lock(P, "k", first.lock_token)
    await refused(store)  # one reader left
    assert await store.release_lock(P, "k", second.lock_token)
    third = await grant(store)
    assert third.fencing_token > second.fencing_token


async def test_an_exclusive_lease_keeps_readers_out(store):
    await grant(store)
    await refused(store, request=req(mode=SHARED))


async def test_a_retried_shared_acquire_keeps_its_lease(store):
    request = req(mode=SHARED)
    lease = await grant(store, request=request)
    again = await try_lock(store, request=request)
    assert isinstance(again.outcome, Granted) and not again.outcome.created
    assert again.outcome.lease == lease


async def test_a_reader_arriving_behind_a_waiting_writer_waits_behind_it(store):
    reader = await grant(store, request=req(mode=SHARED))
    writer = req()
    waiting = await try_lock(store, request=writer, wait=True)
    assert waiting.ticket is not None
    # Writers never starve: later readers neither jump ahead fail-fast...
    await refused(store, request=req(mode=SHARED))
    # ...nor when waiting.
    late = req(mode=SHARED)
    late_place = await try_lock(store, request=late, wait=True)
    assert late_place.ticket is not None
    assert isinstance(
        (await store.retry_waiter(P, "k", late, late_place.ticket, 60_000)).outcome, Busy
    )
    await store.release_lock(P, "k", reader.lock_token)
    granted = await store.retry_waiter(P, "k", writer, waiting.ticket, 60_000)
    assert isinstance(granted.outcome, Granted)
    assert isinstance(
        (await store.retry_waiter(P, "k", late, late_place.ticket, 60_000)).outcome, Busy
    )
    await store.release_lock(P, "k", writer.lock_token)
    after = await store.retry_waiter(P, "k", late, late_place.ticket, 60_000)
    assert isinstance(after.outcome, Granted)


async def test_shared_waiters_at_the_head_are_granted_together_and_wake_each_other(store):
    events: list[Freed] = []
    store.add_freed_listener(events.append)
    holder = await grant(store)
    readers = [req(mode=SHARED), req(mode=SHARED)]
    writer = req()
    places = [await try_lock(store, request=r, wait=True) for r in [*readers, writer]]
    await store.release_lock(P, "k", holder.lock_token)
    for request, place in zip(readers, places, strict=False):
        events.clear()
        outcome = (await store.retry_waiter(P, "k", request, place.ticket, 60_000)).outcome
        assert isinstance(outcome, Granted) and outcome.lease.mode is SHARED
        await asyncio.sleep(0)
        assert lock_freed(P, "k") in events  # the next in line is told to look
    blocked = await store.retry_waiter(P, "k", writer, places[2].ticket, 60_000)
    assert isinstance(blocked.outcome, Busy)
    view = await store.get_lock(P, "k")
    assert view.holders == 2 and view.waiters == 1


async def test_the_view_shows_the_oldest_holder_and_the_count(store, clock):
    first = await grant(store, request=req(mode=SHARED, operation="report"))
    clock.advance(10)
    await grant(store, request=req(mode=SHARED, operation="backup"))
    view = await store.get_lock(P, "k")
    assert view.holders == 2 and view.lease == first
    assert view.lease.mode is SHARED
    listed = await store.list_locks(P, "", None, 10)
    assert [(v.key, v.holders, v.lease.operation) for v in listed] == [("k", 2, "report")]


async def test_lists_page_by_lock_not_by_lease(store):
    for key in ["a", "b", "c"]:
        for _ in range(3):
            await grant(store, key, req(mode=SHARED))
    page = await store.list_locks(P, "", None, 2)
    assert [(v.key, v.holders) for v in page] == [("a", 3), ("b", 3)]
    rest = await store.list_locks(P, "", "b", 2)
    assert [(v.key, v.holders) for v in rest] == [("c", 3)]


async def test_renewals_and_releases_are_per_lease(store, clock):
    first = await grant(store, request=req(mode=SHARED))
    second = await grant(store, request=req(mode=SHARED, ttl=10))
    renewed = await store.renew_lock(P, "k", second.lock_token, 60)
    assert renewed.fencing_token == second.fencing_token
    assert renewed.expires_ms == clock.now + 60_000
    assert await store.release_lock(P, "k", first.lock_token)
    with pytest.raises(LeaseLost) as lost:
        await store.renew_lock(P, "k", first.lock_token, 30)
    assert lost.value.extra["reason"] == "released"
    assert (await store.renew_lock(P, "k", second.lock_token, 30)).lock_token == second.lock_token


async def test_force_release_ends_every_shared_lease(store):
    leases = [await grant(store, request=req(mode=SHARED, key_id="k1")) for _ in range(3)]
    result = await store.force_release(P, "k", ADMIN)
    assert result.released_count == 3 and result.lease == leases[0]
    assert (await store.get_lock(P, "k")).lease is None
    for lease in leases:
        with pytest.raises(LeaseLost) as lost:
            await store.renew_lock(P, "k", lease.lock_token, 30)
        assert lost.value.extra["reason"] == "force_released"
        verdict = await store.fence_check(P, "k", lease.fencing_token)
        assert not verdict.current and verdict.reason == "force_released"


async def test_a_member_force_releases_a_shared_lock_only_when_it_took_every_lease(store):
    await grant(store, request=req(mode=SHARED, key_id="mine"))
    await grant(store, request=req(mode=SHARED, key_id="theirs"))
    with pytest.raises(Forbidden):
        await store.force_release(P, "k", ForceReleaser("mine", is_admin=False))
    assert (await store.get_lock(P, "k")).holders == 2  # nothing changed


async def test_a_shared_lease_ending_in_its_delay_keeps_readers_out_too(store, clock):
    lease = await grant(store, request=req(mode=SHARED, ttl=5, lock_delay_seconds=10))
    clock.advance(5_000)
    busy = await refused(store, request=req(mode=SHARED))
    assert busy.delay_until_ms == lease.expires_ms + 10_000
    clock.advance(10_000)
    await grant(store, request=req(mode=SHARED))


async def test_force_release_of_shared_leases_keeps_the_longest_delay(store, clock):
    await grant(store, request=req(mode=SHARED, lock_delay_seconds=20))
    await grant(store, request=req(mode=SHARED, lock_delay_seconds=5))
    await store.force_release(P, "k", ADMIN)
    clock.advance(19_999)
    await refused(store, request=req(mode=SHARED))
    clock.advance(1)
    await grant(store)


# --- lock sets ----------------------------------------------------------------


async def lock_set(store, keys, request=None, wait=False):
    return await store.acquire_lock_set(
        P, keys, request or req(), wait_alive_ms=60_000 if wait else None
    )


async def test_a_free_set_is_granted_in_the_order_given(store):
    request = req()
    result = await lock_set(store, ["c", "a", "b"], request)
    assert isinstance(result.outcome, SetGranted) and result.outcome.created
    leases = result.outcome.leases
    assert [lease.key for lease in leases] == ["c", "a", "b"]
    assert leases[0].fencing_token < leases[1].fencing_token < leases[2].fencing_token
    assert {lease.lock_token for lease in leases} == {request.lock_token}
    for lease in leases:  # renewal and release go per key with the one token
        assert (await store.renew_lock(P, lease.key, request.lock_token, 60)).key == lease.key
    assert await store.release_lock(P, "a", request.lock_token)
    assert (await store.get_lock(P, "a")).lease is None
    assert (await store.get_lock(P, "b")).lease is not None


async def test_a_set_with_one_busy_key_holds_nothing(store):
    await grant(store, "b")
    result = await lock_set(store, ["a", "b", "c"])
    assert isinstance(result.outcome, Busy) and result.outcome.key == "b"
    for key in ("a", "c"):
        assert (await store.get_lock(P, key)).lease is None


async def test_a_retried_set_gets_the_same_leases(store):
    request = req()
    first = await lock_set(store, ["a", "b"], request)
    again = await lock_set(store, ["a", "b"], request)
    assert isinstance(again.outcome, SetGranted) and not again.outcome.created
    assert again.outcome.leases == first.outcome.leases


async def test_a_waiting_set_stands_in_every_line_and_leaves_them_all(store):
    await grant(store, "b")
    place = await lock_set(store, ["a", "b"], wait=True)
    assert place.ticket is not None
    assert (await store.get_lock(P, "a")).waiters == 1
    assert (await store.get_lock(P, "b")).waiters == 1
    await refused(store, "a")  # the free key waits for the set ahead in its line
    await store.leave_line(P, "a", place.ticket)
    assert (await store.get_lock(P, "a")).waiters == 0
    assert (await store.get_lock(P, "b")).waiters == 0
    await grant(store, "a")


async def test_crossing_sets_are_granted_in_ticket_order_without_deadlock(store):
    holder = await grant(store, "a")
    first, second = req(), req()
    one = await lock_set(store, ["a", "b"], first, wait=True)
    two = await lock_set(store, ["b", "a"], second, wait=True)
    assert one.ticket is not None and two.ticket is not None and one.ticket < two.ticket
    # "b" is free, but the first set is ahead of the second in b's line.
    assert isinstance((await store.retry_set_waiter(
        P, ["b", "a"], second, two.ticket, 60_000)).outcome, Busy)
    await store.release_lock(P, "a", holder.lock_token)
    assert isinstance((await store.retry_set_waiter(
        P, ["b", "a"], second, two.ticket, 60_000)).outcome, Busy)
    granted = await store.retry_set_waiter(P, ["a", "b"], first, one.ticket, 60_000)
    assert isinstance(granted.outcome, SetGranted) and granted.ticket is None
    for key in ("a", "b"):
        await store.release_lock(P, key, first.lock_token)
    last = await store.retry_set_waiter(P, ["b", "a"], second, two.ticket, 60_000)
    assert isinstance(last.outcome, SetGranted)
    assert [lease.key for lease in last.outcome.leases] == ["b", "a"]


async def test_a_shared_set_joins_readers(store):
    await grant(store, "a", req(mode=SHARED))
    result = await lock_set(store, ["a", "b"], req(mode=SHARED))
    assert isinstance(result.outcome, SetGranted)
    assert (await store.get_lock(P, "a")).holders == 2


async def test_a_set_waiter_dropped_from_its_lines_rejoins_all_of_them(store, clock):
    holder = await grant(store, "a")
    request = req()
    place = await store.acquire_lock_set(P, ["a", "b"], request, wait_alive_ms=1_000)
    clock.advance(1_000)
    await store.reap()  # the place was not refreshed in time
    assert (await store.get_lock(P, "b")).waiters == 0
    again = await store.retry_set_waiter(P, ["a", "b"], request, place.ticket, 60_000)
    assert again.ticket is not None and again.ticket > place.ticket
    assert (await store.get_lock(P, "a")).waiters == 1
    assert (await store.get_lock(P, "b")).waiters == 1
    await store.release_lock(P, "a", holder.lock_token)
    granted = await store.retry_set_waiter(P, ["a", "b"], request, again.ticket, 60_000)
    assert isinstance(granted.outcome, SetGranted)
    assert (await store.get_lock(P, "b")).waiters == 0
