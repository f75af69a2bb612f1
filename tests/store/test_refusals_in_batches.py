"""Refusals answered as values (batch.Refused): a batch that holds refused
renewals, releases, force releases and session calls beside good operations
commits once, is never replayed, and answers every caller as before. An
operation that raises still makes its batch replay, and the observer is told.
Every backend."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable

import pytest

from fencepost.core.leases import AcquireRequest, Busy, Granted, Lease
from fencepost.core.sessions import Session
from fencepost.core.slots import PoolConfig, Slot
from fencepost.errors import (
    Capped,
    Forbidden,
    LeaseExpired,
    LeaseLost,
    NotFound,
    SessionExpired,
    SessionLost,
)
from fencepost.store.base import ForceReleaser
from fencepost.store.batch import TEST_HOOKS_VARIABLE, Key, Keys
from fencepost.store.sql import locks, pools, sessions

from .store_support import GUARD_S, P, grant, token


class Batches:
    """Every batch the store reports: (writes, size, failed, replayed)."""

    def __init__(self, store: Any) -> None:
        self.seen: list[tuple[bool, int, bool, bool]] = []
        store.watch_batches(
            lambda writes, size, seconds, failed, replayed: self.seen.append(
                (writes, size, failed, replayed)
            )
        )

    def replays(self) -> int:
        return sum(replayed for *_, replayed in self.seen)


async def in_one_batch(store: Any, keys: Keys, calls: list[Awaitable[Any]]) -> list[Any]:
    """Run `calls` (each one write operation on some of `keys`) in one batch, and
    return what each answered (its result or its error). A first batch holding
    every key waits on the writer thread until all of them are queued, so none
    can start before (a job waits for a batch holding its keys, on every
    connection), and then one batch takes them all. An inline writer (SQLite)
    is paused instead until all of them are queued."""
    writer = store._writer
    if writer.inline:
        writer.pause_for_tests(True)
        try:
            answers = asyncio.gather(*calls, return_exceptions=True)
            await _until_queued(writer, len(calls))
        finally:
            writer.pause_for_tests(False)
        return list(await answers)
    holding, queued = threading.Event(), threading.Event()
    first = True

    def hold(_keys: list[Key]) -> None:
        nonlocal first
        if first:
            first = False
            holding.set()
            assert queued.wait(GUARD_S), "the calls were never all queued"

    writer.hold_for_tests(hold)
    try:
        gate = asyncio.ensure_future(writer.run(lambda tx: None, keys))
        assert await asyncio.to_thread(holding.wait, GUARD_S)
        answers = asyncio.gather(*calls, return_exceptions=True)
        await _until_queued(writer, len(calls))
        queued.set()
        await gate
        return list(await answers)
    finally:
        queued.set()
        writer.hold_for_tests(None)


async def _until_queued(writer: Any, count: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GUARD_S
    while writer.waiting_for_tests() < count:
        assert loop.time() < deadline, "the calls were never all queued"
        await asyncio.sleep(0.001)


@pytest.fixture(autouse=True)
def test_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEST_HOOKS_VARIABLE, "1")


async def test_refusals_share_a_batch_with_good_operations_and_nothing_is_replayed(store, clock):
    holder, late = token(), token()
    held = await grant(store, "held", holder, key_id="key_a")
    await grant(store, "late", late, ttl=5)
    await store.put_pool(P, "api", PoolConfig(limit=10))
    await store.put_pool(P, "other", PoolConfig(limit=10))
    # A slot whose first term already reaches its request deadline: capped.
    await store.put_pool(P, "short", PoolConfig(limit=10, term_ms=6_000,
                                                request_timeout_ms=6_000))
    good_slot = (await store.acquire_slot(P, "api", wait_alive_ms=None)).slot
    foreign_slot = (await store.acquire_slot(P, "other", wait_alive_ms=None)).slot
    capped_slot = (await store.acquire_slot(P, "short", wait_alive_ms=None)).slot
    live = await store.create_session(P, "key_a", 30, None)
    near = await store.create_session(P, "key_a", 5, None)
    ended = await store.create_session(P, "key_a", 30, None)
    await store.end_session(P, "key_a", ended.session_id)
    unknown = "ses_" + "x" * 32
    clock.advance(4_500)  # `late` and `near` are inside their last second now
    batches = Batches(store)

    def attached(session_id: str) -> AcquireRequest:
        return AcquireRequest(token(), 30, key_id="key_a", session_id=session_id)

    calls: dict[str, Awaitable[Any]] = {
        "renew": store.renew_lock(P, "held", holder, 60),
        "renew by a stranger": store.renew_lock(P, "held", token(), 60),
        "renew of a free lock": store.renew_lock(P, "free", token(), 60),
        "renew too late": store.renew_lock(P, "late", late, 60),
        "force release by a stranger": store.force_release(
            P, "held", ForceReleaser("key_b", is_admin=False)),
        "acquire": store.acquire_lock(P, "fresh", AcquireRequest(token(), 30),
                                      wait_alive_ms=None),
        "acquire with an ended session": store.acquire_lock(
            P, "s1", attached(ended.session_id), wait_alive_ms=None),
        "acquire with an unknown session": store.acquire_lock(
            P, "s2", attached(unknown), wait_alive_ms=None),
        "set with an ended session": store.acquire_lock_set(
            P, ["s3", "s4"], attached(ended.session_id), wait_alive_ms=None),
        "slot renew": store.renew_slot(P, "api", good_slot.slot_id),
        "slot renew, unknown": store.renew_slot(P, "api", "slot_" + "y" * 32),
        "slot renew, other pool": store.renew_slot(P, "api", foreign_slot.slot_id),
        "slot renew, no pool": store.renew_slot(P, "nope", good_slot.slot_id),
        "slot renew, capped": store.renew_slot(P, "short", capped_slot.slot_id),
        "slot release, other pool": store.release_slot(P, "api", foreign_slot.slot_id, None),
        "slot release, unknown": store.release_slot(P, "api", "slot_" + "z" * 32, None),
        "slot acquire": store.acquire_slot(P, "api", wait_alive_ms=None),
        "slot acquire, no pool": store.acquire_slot(P, "nope", wait_alive_ms=None),
        "slot acquire, ended session": store.acquire_slot(
            P, "api", wait_alive_ms=None, key_id="key_a", session_id=ended.session_id),
        "session renew": store.renew_session(P, "key_a", live.session_id, 30),
        "session renew, another key's": store.renew_session(P, "key_b", live.session_id, 30),
        "session renew, unknown": store.renew_session(P, "key_a", unknown, 30),
        "session renew, ended": store.renew_session(P, "key_a", ended.session_id, 30),
        "session renew, too late": store.renew_session(P, "key_a", near.session_id, 30),
        "session end, unknown": store.end_session(P, "key_a", unknown),
    }
    keys = (
        locks.keys_of(P, ["held", "free", "late", "fresh", "s1", "s2", "s3", "s4"])
        + tuple(k for pool in ("api", "other", "short", "nope") for k in pools.key_of(P, pool))
        + tuple(k for s in (live, near, ended) for k in sessions.key_of(P, s.session_id))
        + sessions.key_of(P, unknown)
    )
    answers = dict(zip(calls, await in_one_batch(store, keys, list(calls.values())),
                       strict=True))

    assert [(size, failed, replayed) for writes, size, failed, replayed in batches.seen
            if writes and size > 1] == [(len(calls), False, False)], batches.seen
    assert batches.replays() == 0
    refused = {
        "renew by a stranger": LeaseLost, "renew of a free lock": LeaseLost,
        "renew too late": LeaseExpired, "force release by a stranger": Forbidden,
        "acquire with an ended session": SessionLost,
        "acquire with an unknown session": NotFound,
        "set with an ended session": SessionLost,
        "slot renew, unknown": NotFound, "slot renew, other pool": NotFound,
        "slot renew, no pool": NotFound, "slot renew, capped": Capped,
        "slot release, other pool": NotFound, "slot acquire, no pool": NotFound,
        "slot acquire, ended session": SessionLost,
        "session renew, another key's": NotFound, "session renew, unknown": NotFound,
        "session renew, ended": SessionLost, "session renew, too late": SessionExpired,
        "session end, unknown": NotFound,
    }
    assert {name: type(answers[name]) for name in refused} == refused
    assert answers["session renew, ended"].extra["reason"] == "session_ended"
    # The good operations committed, beside the refusals.
    renewed = answers["renew"]
    assert isinstance(renewed, Lease) and renewed.expires_ms == clock.now + 60_000
    assert (await store.get_lock(P, "held")).lease == renewed
    assert renewed.fencing_token == held.fencing_token
    assert isinstance(answers["acquire"].outcome, Granted)
    assert (await store.get_lock(P, "fresh")).lease == answers["acquire"].outcome.lease
    assert isinstance(answers["slot renew"], Slot)
    assert answers["slot release, unknown"] is False
    assert answers["slot acquire"].slot is not None
    assert (await store.get_pool(P, "api")).in_use == 2  # the first slot and the new one
    assert isinstance(answers["session renew"], Session)
    assert answers["session renew"].expires_ms == clock.now + 30_000
    # The refusals changed nothing.
    assert (await store.get_lock(P, "s1")).lease is None
    assert (await store.get_lock(P, "s3")).lease is None
    assert (await store.get_pool(P, "other")).in_use == 1
    stranger = await store.acquire_lock(P, "held", AcquireRequest(token(), 30),
                                        wait_alive_ms=None)
    assert isinstance(stranger.outcome, Busy)  # not force-released


async def test_refused_reads_are_not_replayed(store):
    await store.put_pool(P, "api", PoolConfig(limit=1))
    live = await store.create_session(P, "key_a", 30, None)
    batches = Batches(store)
    answers = await asyncio.gather(
        *(store.get_session(P, "key_a", live.session_id) for _ in range(5)),
        *(store.get_session(P, "key_b", live.session_id) for _ in range(5)),
        *(store.list_slots(P, "api") for _ in range(5)),
        *(store.list_slots(P, "nope") for _ in range(5)),
        return_exceptions=True,
    )
    assert [type(a).__name__ for a in answers] == (
        ["SessionView"] * 5 + ["NotFound"] * 5 + ["list"] * 5 + ["NotFound"] * 5
    )
    assert batches.seen and batches.replays() == 0


async def test_an_operation_that_raises_still_replays_its_batch_and_says_so(store):
    """What is not a value (a failure that may follow a write) still rolls the
    batch back and replays it isolated; the observer counts that replay."""
    holder = token()
    await grant(store, "k", holder)
    batches = Batches(store)

    def fails(tx: Any) -> None:
        tx.execute("UPDATE locks SET expires_ms = expires_ms + 1 WHERE key = 'k'")
        raise RuntimeError("failed after a write")

    answers = await in_one_batch(store, locks.key_of(P, "k") + locks.key_of(P, "j"), [
        store.renew_lock(P, "k", holder, 60),
        store._writer.run(fails, locks.key_of(P, "k")),
        store.renew_lock(P, "j", token(), 60),
    ])
    assert isinstance(answers[0], Lease) and isinstance(answers[2], LeaseLost)
    assert isinstance(answers[1], RuntimeError)
    assert (await store.get_lock(P, "k")).lease == answers[0]  # the failed write undone
    assert [(size, replayed) for writes, size, _, replayed in batches.seen
            if writes and size > 1] == [(3, True)]
    assert batches.replays() == 1
