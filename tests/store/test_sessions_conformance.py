"""Sessions (SPEC §3.10), identical on every backend: one heartbeat for many
leases and slots, owned by one key, ending everything attached when it ends."""

from __future__ import annotations

import uuid

import pytest

from fencepost.core.keys import Role
from fencepost.core.leases import AcquireRequest, Busy, Granted, Mode, SetGranted
from fencepost.core.sessions import Session
from fencepost.core.slots import PoolConfig
from fencepost.errors import LeaseLost, NotFound, SessionExpired, SessionLost
from fencepost.events import Ended, SessionChanged
from fencepost.store.base import ForceReleaser, NewKey

from .conftest import reopen

P = "default"


def token() -> str:
    return str(uuid.uuid4())


async def member(store, project: str = P) -> str:
    if project == P:
        await store.bootstrap("b" * 40)
    else:
        secret = await store.create_project(project)
        admin = await store.find_key(secret)
        project = admin.project
    record, _ = await store.create_key(project, NewKey(Role.MEMBER, name="worker"))
    return record.id


async def attach(store, key_id: str, session: Session, key: str = "k", tok: str | None = None,
                 **kw) -> AcquireRequest:
    wanted = AcquireRequest(tok or token(), 30, key_id=key_id, session_id=session.session_id,
                            **kw)
    result = await store.acquire_lock(P, key, wanted, wait_alive_ms=None)
    assert isinstance(result.outcome, Granted), result
    return wanted


async def test_a_session_is_created_live_and_seen_only_by_its_key(store, clock):
    alice = await member(store)
    bob = (await store.create_key(P, NewKey(Role.MEMBER)))[0].id
    session = await store.create_session(P, alice, 30, "batch")
    assert session.session_id.startswith("ses_") and len(session.session_id) >= 32
    assert (session.name, session.ttl_ms, session.expires_ms) == ("batch", 30_000,
                                                                 clock.now + 30_000)
    view = await store.get_session(P, alice, session.session_id)
    assert view.session == session and (view.keys, view.leases, view.slots) == ([], 0, 0)
    for stranger in (bob, "key_unknown"):
        with pytest.raises(NotFound):
            await store.get_session(P, stranger, session.session_id)
        with pytest.raises(NotFound):
            await store.renew_session(P, stranger, session.session_id, 30)
        with pytest.raises(NotFound):
            await store.end_session(P, stranger, session.session_id)
    with pytest.raises(NotFound):
        await store.get_session("other", alice, session.session_id)
    assert (await store.get_session(P, alice, session.session_id)).session.ended is None


async def test_a_session_follows_its_key_through_refresh(store):
    alice = await member(store)
    session = await store.create_session(P, alice, 30, None)
    successor, _ = await store.refresh_key(alice, None)
    renewed = await store.renew_session(P, successor.id, session.session_id, 60)
    assert renewed.ttl_ms == 60_000
    await attach(store, successor.id, session)


async def test_another_projects_key_never_finds_the_session(store):
    alice = await member(store)
    session = await store.create_session(P, alice, 30, None)
    outsider = await member(store, "acme")
    with pytest.raises(NotFound):
        await store.get_session("acme", outsider, session.session_id)
    with pytest.raises(NotFound):
        await attach(store, outsider, session)


async def test_attached_leases_follow_the_session_expiry(store, clock):
    alice = await member(store)
    session = await store.create_session(P, alice, 10, None)
    for key in ("a", "b"):
        await attach(store, alice, session, key)
    assert (await store.get_lock(P, "a")).lease.expires_ms == session.expires_ms
    clock.advance(8_000)
    renewed = await store.renew_session(P, alice, session.session_id, 20)
    assert renewed.expires_ms == clock.now + 20_000
    for key in ("a", "b"):
        assert (await store.get_lock(P, key)).lease.expires_ms == renewed.expires_ms
    clock.advance(15_000)  # past the first expiry, within the renewed one
    assert await store.reap() == 0
    view = await store.get_session(P, alice, session.session_id)
    assert (view.keys, view.leases) == (["a", "b"], 2)


async def test_renewing_an_attached_lease_changes_nothing(store, clock):
    alice = await member(store)
    session = await store.create_session(P, alice, 10, None)
    wanted = await attach(store, alice, session)
    clock.advance(2_000)
    lease = await store.renew_lock(P, "k", wanted.lock_token, 3600)
    assert lease.expires_ms == session.expires_ms and lease.session_id == session.session_id


async def test_an_expired_session_frees_everything_attached(store, clock):
    alice = await member(store)
    ended = []
    store.add_event_listener(ended.append)
    session = await store.create_session(P, alice, 10, None)
    wanted = await attach(store, alice, session, lock_delay_seconds=2)
    await store.put_pool(P, "api", PoolConfig(limit=1, term_ms=60_000, request_timeout_ms=600_000))
    slot = (await store.acquire_slot(P, "api", wait_alive_ms=None, key_id=alice,
                                     session_id=session.session_id)).slot
    assert slot.lease_deadline_ms == session.expires_ms
    clock.advance(10_000)
    assert await store.reap() == 2
    assert (await store.get_lock(P, "k")).lease is None
    assert (await store.get_pool(P, "api")).in_use == 0
    with pytest.raises(LeaseLost) as lost:
        await store.renew_lock(P, "k", wanted.lock_token, 30)
    assert lost.value.reason == "session_expired"
    with pytest.raises(SessionLost) as gone:
        await store.renew_session(P, alice, session.session_id, 30)
    assert gone.value.reason == "session_expired"
    with pytest.raises(SessionLost):
        await attach(store, alice, session, "other")
    # An expiry starts the lease's lock delay, as any expiry does (SPEC §3.9).
    refused = await store.acquire_lock(P, "k", AcquireRequest(token(), 30), wait_alive_ms=None)
    assert isinstance(refused.outcome, Busy) and refused.outcome.delay_until_ms is not None
    view = await store.get_session(P, alice, session.session_id)
    assert view.session.ended == "session_expired" and view.leases == 0
    assert {(e.kind, e.reason) for e in ended if isinstance(e, Ended)} == {
        ("lock", "session_expired"), ("slot", "session_expired")}
    assert [e.reason for e in ended if isinstance(e, SessionChanged) and e.action == "ended"] \
        == ["session_expired"]
    assert await store.reap() == 0  # nothing ends twice


async def test_a_lease_dead_with_its_session_says_so_before_the_reaper_runs(store, clock):
    alice = await member(store)
    session = await store.create_session(P, alice, 10, None)
    wanted = await attach(store, alice, session)
    fencing_token = (await store.get_lock(P, "k")).lease.fencing_token
    clock.advance(10_000)
    assert (await store.fence_check(P, "k", fencing_token)).reason == "session_expired"
    with pytest.raises(LeaseLost) as lost:
        await store.renew_lock(P, "k", wanted.lock_token, 30)
    assert lost.value.reason == "session_expired"
    taken = await store.acquire_lock(P, "k", AcquireRequest(token(), 30), wait_alive_ms=None)
    assert isinstance(taken.outcome, Granted)
    with pytest.raises(LeaseLost) as lost:
        await store.renew_lock(P, "k", wanted.lock_token, 30)
    assert lost.value.reason == "session_expired"  # not only "superseded"
    verdict = await store.fence_check(P, "k", fencing_token)
    assert (verdict.current, verdict.reason) == (False, "session_expired")


async def test_ending_a_session_ends_its_leases_and_slots(store, clock):
    alice = await member(store)
    session = await store.create_session(P, alice, 30, None)
    other = await store.create_session(P, alice, 30, None)
    first = await attach(store, alice, session, "a", lock_delay_seconds=5)
    await attach(store, alice, session, "b")
    kept = await attach(store, alice, other, "c")
    await store.put_pool(P, "api", PoolConfig(limit=3))
    for _ in range(2):
        await store.acquire_slot(P, "api", wait_alive_ms=None, key_id=alice,
                                 session_id=session.session_id)
    view = await store.get_session(P, alice, session.session_id)
    assert (view.leases, view.pools, view.slots) == (2, [("api", 2)], 2)
    ended_token = (await store.get_lock(P, "a")).lease.fencing_token
    result = await store.end_session(P, alice, session.session_id)
    assert (result.ended, result.leases, result.slots) == (True, 2, 2)
    assert [v.key for v in await store.list_locks(P, "", None, 10)] == ["c"]
    assert (await store.get_pool(P, "api")).in_use == 0
    with pytest.raises(LeaseLost) as lost:
        await store.renew_lock(P, "a", first.lock_token, 30)
    assert lost.value.reason == "session_ended"
    assert (await store.fence_check(P, "a", ended_token)).reason == "session_ended"
    # The holder's own end starts no lock delay.
    assert isinstance((await store.acquire_lock(
        P, "a", AcquireRequest(token(), 30), wait_alive_ms=None)).outcome, Granted)
    with pytest.raises(SessionLost) as gone:
        await store.renew_session(P, alice, session.session_id, 30)
    assert gone.value.reason == "session_ended"
    again = await store.end_session(P, alice, session.session_id)
    assert (again.ended, again.leases, again.slots) == (False, 0, 0)
    assert (await store.renew_lock(P, "c", kept.lock_token, 30)).session_id == other.session_id


async def test_renewal_inside_the_last_second_is_refused(store, clock):
    alice = await member(store)
    session = await store.create_session(P, alice, 5, None)
    clock.advance(4_000)
    with pytest.raises(SessionExpired):
        await store.renew_session(P, alice, session.session_id, 30)
    clock.advance(1_000)
    with pytest.raises(SessionLost):
        await store.renew_session(P, alice, session.session_id, 30)
    assert (await store.end_session(P, alice, session.session_id)).ended is False


async def test_a_shorter_ttl_shortens_the_session_and_its_leases(store, clock):
    alice = await member(store)
    session = await store.create_session(P, alice, 600, None)
    await attach(store, alice, session)
    renewed = await store.renew_session(P, alice, session.session_id, 5)
    assert (await store.get_lock(P, "k")).lease.expires_ms == renewed.expires_ms == clock.now + 5000


async def test_attaching_needs_the_callers_live_session(store):
    alice = await member(store)
    bob = (await store.create_key(P, NewKey(Role.MEMBER)))[0].id
    session = await store.create_session(P, alice, 30, None)
    with pytest.raises(NotFound):
        await attach(store, bob, session)
    fake = Session("ses_" + "x" * 32, None, 1, 0, 0, None)
    with pytest.raises(NotFound):
        await attach(store, alice, fake)
    await store.put_pool(P, "api", PoolConfig(limit=1))
    with pytest.raises(NotFound):
        await store.acquire_slot(P, "api", wait_alive_ms=None, key_id=bob,
                                 session_id=session.session_id)
    await store.end_session(P, alice, session.session_id)
    with pytest.raises(SessionLost):
        await store.acquire_slot(P, "api", wait_alive_ms=None, key_id=alice,
                                 session_id=session.session_id)
    assert (await store.get_pool(P, "api")).in_use == 0
    assert (await store.get_lock(P, "k")).lease is None


async def test_a_waiter_whose_session_ended_is_refused(store):
    alice = await member(store)
    await store.acquire_lock(P, "k", AcquireRequest(token(), 30), wait_alive_ms=None)
    session = await store.create_session(P, alice, 30, None)
    wanted = AcquireRequest(token(), 30, key_id=alice, session_id=session.session_id,
                            wait_ms=10_000)
    queued = await store.acquire_lock(P, "k", wanted, wait_alive_ms=5_000)
    assert queued.ticket is not None
    await store.end_session(P, alice, session.session_id)
    with pytest.raises(SessionLost):
        await store.retry_waiter(P, "k", wanted, queued.ticket, 5_000)


async def test_a_lock_set_attaches_every_lease_and_ends_with_the_session(store, clock):
    alice = await member(store)
    session = await store.create_session(P, alice, 10, None)
    wanted = AcquireRequest(token(), 30, key_id=alice, session_id=session.session_id,
                            mode=Mode.SHARED)
    granted = (await store.acquire_lock_set(P, ["b", "a"], wanted, wait_alive_ms=None)).outcome
    assert isinstance(granted, SetGranted)
    assert {(lease.session_id, lease.expires_ms) for lease in granted.leases} == {
        (session.session_id, session.expires_ms)}
    reader = await attach(store, alice, session, "a", mode=Mode.SHARED)  # a second reader
    assert (await store.get_lock(P, "a")).holders == 2
    view = await store.get_session(P, alice, session.session_id)
    assert (view.keys, view.leases) == (["a", "b"], 3)  # each key once, every lease counted
    renewed = await store.renew_session(P, alice, session.session_id, 60)
    assert (await store.get_lock(P, "b")).lease.expires_ms == renewed.expires_ms
    clock.advance(60_000)
    assert await store.reap() == 3
    for tok, key in ((wanted.lock_token, "a"), (wanted.lock_token, "b"),
                     (reader.lock_token, "a")):
        with pytest.raises(LeaseLost) as lost:
            await store.renew_lock(P, key, tok, 30)
        assert lost.value.reason == "session_expired"


async def test_a_lock_set_needs_the_callers_live_session(store):
    alice = await member(store)
    bob = (await store.create_key(P, NewKey(Role.MEMBER)))[0].id
    session = await store.create_session(P, alice, 30, None)
    wanted = AcquireRequest(token(), 30, key_id=bob, session_id=session.session_id)
    with pytest.raises(NotFound):
        await store.acquire_lock_set(P, ["a", "b"], wanted, wait_alive_ms=None)
    await store.end_session(P, alice, session.session_id)
    mine = AcquireRequest(token(), 30, key_id=alice, session_id=session.session_id)
    with pytest.raises(SessionLost):
        await store.acquire_lock_set(P, ["a", "b"], mine, wait_alive_ms=None)
    assert await store.list_locks(P, "", None, 10) == []


async def test_a_set_waiter_whose_session_ended_is_refused(store):
    alice = await member(store)
    await store.acquire_lock(P, "b", AcquireRequest(token(), 30), wait_alive_ms=None)
    session = await store.create_session(P, alice, 30, None)
    wanted = AcquireRequest(token(), 30, key_id=alice, session_id=session.session_id,
                            wait_ms=10_000)
    queued = await store.acquire_lock_set(P, ["a", "b"], wanted, wait_alive_ms=5_000)
    assert queued.ticket is not None
    await store.end_session(P, alice, session.session_id)
    with pytest.raises(SessionLost):
        await store.retry_set_waiter(P, ["a", "b"], wanted, queued.ticket, 5_000)


async def test_force_releasing_a_lease_dead_with_its_session_records_why(store, clock):
    alice = await member(store)
    session = await store.create_session(P, alice, 10, None)
    wanted = await attach(store, alice, session)
    clock.advance(10_000)
    released = await store.force_release(P, "k", ForceReleaser("key_admin", is_admin=True))
    assert released.lease is None
    with pytest.raises(LeaseLost) as lost:
        await store.renew_lock(P, "k", wanted.lock_token, 30)
    assert lost.value.reason == "session_expired"


async def test_an_attached_slot_renews_to_nothing_new_and_its_cap_holds(store, clock):
    alice = await member(store)
    session = await store.create_session(P, alice, 60, None)
    await store.put_pool(P, "api", PoolConfig(limit=1, term_ms=10_000, request_timeout_ms=20_000))
    slot = (await store.acquire_slot(P, "api", wait_alive_ms=None, key_id=alice,
                                     session_id=session.session_id)).slot
    assert slot.lease_deadline_ms == slot.request_deadline_ms == clock.now + 20_000
    clock.advance(15_000)
    await store.renew_session(P, alice, session.session_id, 60)
    clock.advance(5_000)  # the request deadline caps the slot, session or not
    assert await store.reap() == 1
    assert (await store.get_session(P, alice, session.session_id)).slots == 0


async def test_a_session_renewal_moves_many_leases_at_once(store, clock):
    alice = await member(store)
    session = await store.create_session(P, alice, 10, None)
    keys = [f"k{i:03}" for i in range(300)]
    for key in keys:
        await attach(store, alice, session, key)
    clock.advance(8_000)
    await store.renew_session(P, alice, session.session_id, 10)
    clock.advance(8_000)
    assert await store.reap() == 0
    view = await store.get_session(P, alice, session.session_id)
    assert view.leases == 300 and view.keys == keys
    assert len(await store.list_locks(P, "", None, 1000)) == 300


async def test_sessions_survive_a_restart(store, clock):
    alice = await member(store)
    session = await store.create_session(P, alice, 30, "kept")
    await attach(store, alice, session)
    await store.close()
    again = reopen(store, clock)
    await again.open()
    try:
        view = await again.get_session(P, alice, session.session_id)
        assert view.session == session and view.keys == ["k"]
    finally:
        await again.close()
        await store.open()  # the fixture closes it again
