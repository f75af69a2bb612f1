"""Who holds and who waits (SPEC §3.4, §4.1), identical on every backend."""

from __future__ import annotations

import uuid

import pytest

from fencepost.core.keys import Role
from fencepost.core.leases import AcquireRequest, Granted
from fencepost.core.slots import PoolConfig
from fencepost.errors import NotFound
from fencepost.store.base import LINE_SHOWN, KeyRef, NewKey

from .store_support import P


def req(key_id: str | None, wait_ms: int = 0) -> AcquireRequest:
    return AcquireRequest(str(uuid.uuid4()), 30, key_id=key_id, wait_ms=wait_ms)


async def keys(store, *names: str) -> list[str]:
    await store.bootstrap("b" * 40)
    return [(await store.create_key(P, NewKey(Role.MEMBER, name=n)))[0].id for n in names]


async def test_free_lock_has_no_holder_and_no_line(store):
    view = await store.get_lock(P, "free")
    assert view.lease is None and view.holder is None and view.line == ()


async def test_holder_and_line_in_arrival_order(store, clock):
    alice, bob, carol = await keys(store, "alice", "bob", None)
    held = await store.acquire_lock(P, "k", req(alice), wait_alive_ms=None)
    assert isinstance(held.outcome, Granted) and held.outcome.lease.key_id == alice
    joined = clock.now
    await store.acquire_lock(P, "k", req(bob, wait_ms=20_000), wait_alive_ms=5_000)
    clock.advance(7)
    await store.acquire_lock(P, "k", req(carol, wait_ms=3_000), wait_alive_ms=5_000)
    view = await store.get_lock(P, "k")
    assert view.holder == KeyRef(alice, "alice")
    assert view.waiters == 2
    assert [(w.key, w.since_ms, w.gives_up_ms) for w in view.line] == [
        (KeyRef(bob, "bob"), joined, joined + 20_000),
        (KeyRef(carol, None), joined + 7, joined + 7 + 3_000),
    ]
    [listed] = await store.list_locks(P, "", None, 10)
    assert listed.holder == view.holder and listed.line == view.line


async def test_line_shows_only_live_waiters(store, clock):
    [alice] = await keys(store, "alice")
    await store.acquire_lock(P, "k", req(alice), wait_alive_ms=None)
    await store.acquire_lock(P, "k", req(alice, wait_ms=60_000), wait_alive_ms=1_000)
    clock.advance(500)
    await store.acquire_lock(P, "k", req(None, wait_ms=60_000), wait_alive_ms=5_000)
    clock.advance(600)  # the first waiter's place ran out unrefreshed
    view = await store.get_lock(P, "k")
    assert view.waiters == 1 and [w.key for w in view.line] == [KeyRef(None, None)]


async def test_line_lists_at_most_the_first_hundred(store):
    [alice] = await keys(store, "alice")
    await store.acquire_lock(P, "k", req(alice), wait_alive_ms=None)
    tickets = [
        (await store.acquire_lock(P, "k", req(alice, 1_000), wait_alive_ms=60_000)).ticket
        for _ in range(LINE_SHOWN + 2)
    ]
    assert all(t is not None for t in tickets)
    await store.acquire_lock(P, "other", req(alice), wait_alive_ms=None)
    view = await store.get_lock(P, "k")
    assert view.waiters == LINE_SHOWN + 2 and len(view.line) == LINE_SHOWN
    by_key = {v.key: v for v in await store.list_locks(P, "", None, 10)}
    assert len(by_key["k"].line) == LINE_SHOWN and by_key["other"].line == ()


async def test_list_pairs_each_lock_with_its_own_line(store):
    alice, bob = await keys(store, "alice", "bob")
    for key in ("a", "b", "c"):
        await store.acquire_lock(P, key, req(alice), wait_alive_ms=None)
    await store.acquire_lock(P, "a", req(bob, 1_000), wait_alive_ms=60_000)
    await store.acquire_lock(P, "c", req(alice, 1_000), wait_alive_ms=60_000)
    await store.acquire_lock(P, "c", req(bob, 1_000), wait_alive_ms=60_000)
    listed = await store.list_locks(P, "", None, 10)
    assert [(v.key, [w.key.key_name for w in v.line]) for v in listed] == [
        ("a", ["bob"]), ("b", []), ("c", ["alice", "bob"]),
    ]


async def test_another_project_sees_neither_holder_nor_line(store):
    [alice] = await keys(store, "alice")
    await store.create_project("other")
    await store.acquire_lock(P, "k", req(alice), wait_alive_ms=None)
    await store.acquire_lock(P, "k", req(alice, 1_000), wait_alive_ms=60_000)
    view = await store.get_lock("other", "k")
    assert view.lease is None and view.holder is None and view.line == () and view.waiters == 0
    assert await store.list_locks("other", "", None, 10) == []


async def test_slots_list_their_holders_without_the_slot_id(store, clock):
    alice, bob = await keys(store, "alice", "bob")
    await store.put_pool(P, "api", PoolConfig(limit=3, term_ms=10_000))
    first = await store.acquire_slot(P, "api", wait_alive_ms=None, key_id=alice)
    clock.advance(5)
    second = await store.acquire_slot(P, "api", wait_alive_ms=None, key_id=bob)
    assert first.slot is not None and second.slot is not None
    slots = await store.list_slots(P, "api")
    assert [(s.key, s.acquired_ms) for s in slots] == [
        (KeyRef(alice, "alice"), first.slot.acquired_ms),
        (KeyRef(bob, "bob"), first.slot.acquired_ms + 5),
    ]
    for shown, granted in zip(slots, (first.slot, second.slot), strict=True):
        assert granted.slot_id.startswith(shown.slot_id_prefix)
        assert len(shown.slot_id_prefix) < len(granted.slot_id) - 16
        assert shown.lease_deadline_ms == granted.lease_deadline_ms
        assert shown.request_deadline_ms == granted.request_deadline_ms
    await store.release_slot(P, "api", first.slot.slot_id, None)
    assert [s.key.key_name for s in await store.list_slots(P, "api")] == ["bob"]
    clock.advance(10_000)  # bob's slot outlived its term: no longer live
    assert await store.list_slots(P, "api") == []


async def test_a_waiter_admitted_to_a_slot_is_its_holder(store):
    alice, bob = await keys(store, "alice", "bob")
    await store.put_pool(P, "api", PoolConfig(limit=1))
    held = await store.acquire_slot(P, "api", wait_alive_ms=None, key_id=alice)
    queued = await store.acquire_slot(P, "api", wait_ms=5_000, wait_alive_ms=5_000, key_id=bob)
    assert held.slot is not None and queued.ticket is not None
    await store.release_slot(P, "api", held.slot.slot_id, None)
    admitted = await store.retry_slot_waiter(P, "api", queued.ticket, 5_000, bob)
    assert admitted.slot is not None
    assert [s.key for s in await store.list_slots(P, "api")] == [KeyRef(bob, "bob")]


async def test_slots_of_an_unknown_or_foreign_pool_are_not_found(store):
    [alice] = await keys(store, "alice")
    await store.create_project("other")
    await store.put_pool(P, "api", PoolConfig(limit=1))
    await store.acquire_slot(P, "api", wait_alive_ms=None, key_id=alice)
    with pytest.raises(NotFound):
        await store.list_slots(P, "nope")
    with pytest.raises(NotFound):
        await store.list_slots("other", "api")
