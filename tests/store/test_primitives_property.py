"""Random schedules over a real store with a fake clock (SQLite: many examples
are cheap there; the conformance suite holds PostgreSQL to the same rules):
never two live leases of one lock, fencing tokens of a lock only rise, a lock
in its delay is granted to nobody, a fence check names exactly the live token."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fencepost.core import leases as rules
from fencepost.core.leases import AcquireRequest, Granted, Lease
from fencepost.errors import LeaseExpired, LeaseLost
from fencepost.store.sqlite import SqliteStore

from .conftest import FakeClock
from .store_support import ADMIN, P

KEYS = ("a", "b")
@dataclass
class Waiter:
    key: str
    request: AcquireRequest
    ticket: int


class StoreSchedules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="fp-prop-"))
        self.clock = FakeClock()
        self.loop = asyncio.new_event_loop()
        self.store = SqliteStore(str(self.folder / "prop.db"), clock_ms=self.clock)
        self.run(self.store.open())
        self.leases: dict[str, Lease] = {}  # the model's latest lease per key
        self.free_from = {key: 0 for key in KEYS}  # no grant before (lock delay)
        self.last_token = {key: 0 for key in KEYS}
        self.waiters: list[Waiter] = []

    def run(self, work):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(work)

    def teardown(self) -> None:
        self.run(self.store.close())
        self.loop.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _ended_by_expiry(self, lease: Lease) -> None:
        self.free_from[lease.key] = max(
            self.free_from[lease.key], rules.end_of_life_ms(lease) + lease.lock_delay_ms
        )

    def _granted(self, outcome: object) -> None:
        if not (isinstance(outcome, Granted) and outcome.created):
            return
        lease, now = outcome.lease, self.clock.now
        previous = self.leases.get(lease.key)
        if previous is not None:
            assert not rules.is_live(previous, now), "two live leases of one lock"
            self._ended_by_expiry(previous)
        assert now >= self.free_from[lease.key], "granted during a lock delay"
        assert lease.fencing_token > self.last_token[lease.key], "fencing token did not rise"
        self.last_token[lease.key] = lease.fencing_token
        self.leases[lease.key] = lease

    @rule(key=st.sampled_from(KEYS), ttl=st.integers(5, 20), delay=st.integers(0, 10),
          wait=st.booleans())
    def acquire(self, key: str, ttl: int, delay: int, wait: bool) -> None:
        request = AcquireRequest(str(uuid.uuid4()), ttl, lock_delay_seconds=delay)
        result = self.run(self.store.acquire_lock(
            P, key, request, wait_alive_ms=60_000 if wait else None))
        self._granted(result.outcome)
        if result.ticket is not None:
            self.waiters.append(Waiter(key, request, result.ticket))

    @precondition(lambda self: self.waiters)
    @rule(index=st.integers(0, 100))
    def retry_waiter(self, index: int) -> None:
        waiter = self.waiters[index % len(self.waiters)]
        result = self.run(self.store.retry_waiter(
            P, waiter.key, waiter.request, waiter.ticket, 60_000))
        self._granted(result.outcome)
        if result.ticket is None:
            self.waiters.remove(waiter)
        else:
            waiter.ticket = result.ticket

    @rule(ms=st.sampled_from([0, 1, 999, 1_000, 4_000, 5_000, 9_999, 15_000]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def reap(self) -> None:
        self.run(self.store.reap())

    @rule(key=st.sampled_from(KEYS))
    def release(self, key: str) -> None:
        lease = self.leases.get(key)
        if lease is None:
            return
        was_live = rules.is_live(lease, self.clock.now)
        released = self.run(self.store.release_lock(P, key, lease.lock_token))
        assert released == was_live
        if not was_live:
            self._ended_by_expiry(lease)
        del self.leases[key]

    @rule(key=st.sampled_from(KEYS))
    def force_release(self, key: str) -> None:
        result = self.run(self.store.force_release(P, key, ADMIN))
        lease = self.leases.pop(key, None)
        if lease is None:
            assert result.lease is None
            return
        if rules.is_live(lease, self.clock.now):
            assert result.lease is not None
            assert result.lease.fencing_token == lease.fencing_token
            self.free_from[key] = max(self.free_from[key], self.clock.now + lease.lock_delay_ms)
        else:
            self._ended_by_expiry(lease)

    @rule(key=st.sampled_from(KEYS), ttl=st.integers(5, 20))
    def renew(self, key: str, ttl: int) -> None:
        lease = self.leases.get(key)
        if lease is None:
            return
        try:
            self.leases[key] = self.run(self.store.renew_lock(P, key, lease.lock_token, ttl))
        except (LeaseLost, LeaseExpired):
            pass

    @invariant()
    def fence_check_names_the_live_token(self) -> None:
        for key in KEYS:
            lease = self.leases.get(key)
            if lease is None:
                continue
            verdict = self.run(self.store.fence_check(P, key, lease.fencing_token))
            assert verdict.current == rules.is_live(lease, self.clock.now)


TestStoreSchedules = StoreSchedules.TestCase
TestStoreSchedules.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
