"""Random schedules of shared, exclusive and lock-set acquires over a real
store with a fake clock (SQLite: many examples are cheap there; the
conformance suite holds PostgreSQL to the same rules). Checked at every grant:

- an exclusive lease is never live beside any other lease of its lock;
- the fencing tokens of a lock strictly rise, and no token is issued twice;
- a lock in its delay is granted to nobody;
- grants follow the line: nobody is granted a key while an incompatible live
  waiter stands ahead of it in that key's line (so a writer in line is never
  overtaken by readers that came later);

and by `drain`: once every lease is given back, the waiters are granted one
after another in ticket order, each set the moment it is at the head of all
its lines, so lock sets never deadlock.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from fencepost.core import leases as rules
from fencepost.core.leases import AcquireRequest, Busy, Granted, Lease, Mode, SetGranted
from fencepost.errors import LeaseExpired, LeaseLost
from fencepost.store.base import ForceReleaser
from fencepost.store.sqlite import SqliteStore

from .conftest import FakeClock

P = "default"
KEYS = ("a", "b", "c")
ADMIN = ForceReleaser("key_admin", is_admin=True)
ALIVE_MS = 60_000
MAX_DELAY_S = 10
modes = st.sampled_from([Mode.SHARED, Mode.EXCLUSIVE])
key_sets = st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True)


@dataclass
class Waiter:
    keys: list[str]
    request: AcquireRequest
    ticket: int
    alive_until: int
    is_set: bool


class SharedSchedules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="fp-shared-"))
        self.clock = FakeClock()
        self.loop = asyncio.new_event_loop()
        self.store = SqliteStore(str(self.folder / "prop.db"), clock_ms=self.clock)
        self.run(self.store.open())
        self.leases: dict[str, dict[str, Lease]] = {key: {} for key in KEYS}
        self.free_from = {key: 0 for key in KEYS}
        self.last_token = {key: 0 for key in KEYS}
        self.issued: set[int] = set()
        self.waiters: list[Waiter] = []

    def run(self, work):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(work)

    def teardown(self) -> None:
        self.run(self.store.close())
        self.loop.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    # --- the model -------------------------------------------------------
    def _prune(self, key: str) -> None:
        """Leases the model holds that are dead now ended by expiry."""
        now = self.clock.now
        for token, lease in list(self.leases[key].items()):
            if not rules.is_live(lease, now):
                self.free_from[key] = max(
                    self.free_from[key], rules.end_of_life_ms(lease) + lease.lock_delay_ms
                )
                del self.leases[key][token]

    def _check_line(self, keys: list[str], mode: Mode, ticket: int | None, me: Waiter | None):
        for waiter in self.waiters:
            if waiter is me or waiter.alive_until <= self.clock.now:
                continue
            if ticket is not None and waiter.ticket > ticket:
                continue
            for key in set(keys) & set(waiter.keys):
                assert mode is Mode.SHARED and waiter.request.mode is Mode.SHARED, (
                    f"granted {key} past an incompatible waiter ahead in its line"
                )

    def _granted(self, leases: tuple[Lease, ...], ticket: int | None, me: Waiter | None) -> None:
        now = self.clock.now
        keys = [lease.key for lease in leases]
        self._check_line(keys, leases[0].mode, ticket, me)
        for lease in leases:
            key = lease.key
            self._prune(key)
            if lease.lock_token in self.leases[key]:
                continue  # a retried acquire kept its lease
            others = self.leases[key].values()
            if lease.mode is Mode.EXCLUSIVE:
                assert not others, "an exclusive lease live beside another lease"
            else:
                assert all(o.mode is Mode.SHARED for o in others), "shared beside exclusive"
            assert now >= self.free_from[key], "granted during a lock delay"
            assert lease.fencing_token > self.last_token[key], "fencing token did not rise"
            assert lease.fencing_token not in self.issued, "fencing token issued twice"
            self.issued.add(lease.fencing_token)
            self.last_token[key] = lease.fencing_token
            self.leases[key][lease.lock_token] = lease

    def _outcome(self, outcome: object, ticket: int | None, me: Waiter | None) -> bool:
        if isinstance(outcome, Granted):
            self._granted((outcome.lease,), ticket, me)
            return True
        if isinstance(outcome, SetGranted):
            self._granted(outcome.leases, ticket, me)
            return True
        assert isinstance(outcome, Busy)
        return False

    # --- rules -----------------------------------------------------------
    @rule(key=st.sampled_from(KEYS), mode=modes, ttl=st.integers(5, 20),
          delay=st.integers(0, MAX_DELAY_S), wait=st.booleans())
    def acquire(self, key: str, mode: Mode, ttl: int, delay: int, wait: bool) -> None:
        request = AcquireRequest(str(uuid.uuid4()), ttl, lock_delay_seconds=delay, mode=mode)
        result = self.run(self.store.acquire_lock(
            P, key, request, wait_alive_ms=ALIVE_MS if wait else None))
        self._outcome(result.outcome, None, None)
        if result.ticket is not None:
            self.waiters.append(
                Waiter([key], request, result.ticket, self.clock.now + ALIVE_MS, False))

    @rule(keys=key_sets, mode=modes, ttl=st.integers(5, 20), wait=st.booleans())
    def acquire_set(self, keys: list[str], mode: Mode, ttl: int, wait: bool) -> None:
        request = AcquireRequest(str(uuid.uuid4()), ttl, mode=mode)
        result = self.run(self.store.acquire_lock_set(
            P, keys, request, wait_alive_ms=ALIVE_MS if wait else None))
        self._outcome(result.outcome, None, None)
        if result.ticket is not None:
            self.waiters.append(
                Waiter(keys, request, result.ticket, self.clock.now + ALIVE_MS, True))

    def _retry(self, waiter: Waiter) -> bool:
        alive = waiter.alive_until > self.clock.now
        if waiter.is_set:
            result = self.run(self.store.retry_set_waiter(
                P, waiter.keys, waiter.request, waiter.ticket, ALIVE_MS))
        else:
            result = self.run(self.store.retry_waiter(
                P, waiter.keys[0], waiter.request, waiter.ticket, ALIVE_MS))
        # A waiter whose place had died rejoined at the back: everyone alive is ahead.
        granted = self._outcome(result.outcome, waiter.ticket if alive else None, waiter)
        if granted:
            self.waiters.remove(waiter)
        else:
            assert result.ticket is not None
            waiter.ticket = result.ticket
            waiter.alive_until = self.clock.now + ALIVE_MS
        return granted

    @precondition(lambda self: self.waiters)
    @rule(index=st.integers(0, 100))
    def retry(self, index: int) -> None:
        self._retry(self.waiters[index % len(self.waiters)])

    @precondition(lambda self: self.waiters)
    @rule(index=st.integers(0, 100))
    def leave(self, index: int) -> None:
        waiter = self.waiters.pop(index % len(self.waiters))
        self.run(self.store.leave_line(P, waiter.keys[0], waiter.ticket))

    @rule(ms=st.sampled_from([0, 1, 999, 1_000, 4_000, 5_000, 9_999, 15_000, 30_000]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def reap(self) -> None:
        self.run(self.store.reap())

    def _release(self, key: str, lease: Lease) -> None:
        was_live = rules.is_live(lease, self.clock.now)
        released = self.run(self.store.release_lock(P, key, lease.lock_token))
        assert released == was_live
        if not was_live:
            self.free_from[key] = max(
                self.free_from[key], rules.end_of_life_ms(lease) + lease.lock_delay_ms)
        del self.leases[key][lease.lock_token]

    @rule(key=st.sampled_from(KEYS), index=st.integers(0, 10))
    def release(self, key: str, index: int) -> None:
        held = list(self.leases[key].values())
        if held:
            self._release(key, held[index % len(held)])

    @rule(key=st.sampled_from(KEYS))
    def force_release(self, key: str) -> None:
        self._prune(key)
        live = list(self.leases[key].values())
        result = self.run(self.store.force_release(P, key, ADMIN))
        assert result.released_count == len(live)
        for lease in live:
            self.free_from[key] = max(self.free_from[key], self.clock.now + lease.lock_delay_ms)
        self.leases[key].clear()

    @rule(key=st.sampled_from(KEYS), index=st.integers(0, 10), ttl=st.integers(5, 20))
    def renew(self, key: str, index: int, ttl: int) -> None:
        held = list(self.leases[key].values())
        if not held:
            return
        lease = held[index % len(held)]
        try:
            renewed = self.run(self.store.renew_lock(P, key, lease.lock_token, ttl))
        except (LeaseLost, LeaseExpired):
            return
        assert renewed.fencing_token == lease.fencing_token
        self.leases[key][lease.lock_token] = renewed

    @precondition(lambda self: self.waiters)
    @rule()
    def drain(self) -> None:
        """Give every lease back, let every delay pass, then serve the line:
        each waiter in ticket order is granted at once (and gives its leases
        back), the ones whose places died after them."""
        for key in KEYS:
            for lease in list(self.leases[key].values()):
                self._release(key, lease)
        self.clock.advance(MAX_DELAY_S * 1000 + 20_000)  # past every delay and expiry
        now = self.clock.now
        alive = sorted((w for w in self.waiters if w.alive_until > now), key=lambda w: w.ticket)
        dead = [w for w in self.waiters if w.alive_until <= now]
        for waiter in [*alive, *dead]:
            assert self._retry(waiter), "a waiter at the head of its lines was not granted"
            for key in waiter.keys:
                lease = self.leases[key].get(waiter.request.lock_token)
                assert lease is not None
                self._release(key, lease)
        assert not self.waiters


TestSharedSchedules = SharedSchedules.TestCase
TestSharedSchedules.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
