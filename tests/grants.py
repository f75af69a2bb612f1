"""A bounded load of lock holders over HTTP, and the check of every grant it
saw (SPEC §7.1-7.3, §7.9): used by the failover tests, where the database
under the servers crashes, freezes or is cut off while the load runs.

Each worker takes a lock with a fresh lock token, holds it briefly, and
releases it; every answer is recorded with the moment its request was sent
and the moment its answer came. The checks then ask, lock by lock:

- no fencing token twice (on any lock: every lock draws from one counter);
- no token at or below one already answered for that lock before the request
  was sent (a grant is judged against what a client could have known);
- with `exclusive=True` (synchronous replication), no two acknowledged leases
  of a lock at once, and no acknowledged lease forgotten (its first release
  answered `released: false`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from support import ServerProcess, lock_headers


def _started(work: Callable[[int], None], count: int) -> list[threading.Thread]:
    """`count` daemon threads running `work(index)`."""
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


def _stopped(stop: threading.Event, threads: list[threading.Thread], timeout_s: float) -> None:
    stop.set()
    for thread in threads:
        thread.join(timeout=timeout_s)
    assert not any(thread.is_alive() for thread in threads), "a worker hung"


@dataclass
class Grant:
    key: str
    token: int
    sent: float  # monotonic: when the acquire was sent
    answered: float  # when its 201 came
    server: str
    released: float | None = None  # when the release was sent (end of holding)
    forgotten: bool = False  # the release answered released: false


@dataclass
class LockLoad:
    servers: list[ServerProcess]
    keys: list[str]
    workers: int = 4
    ttl_seconds: int = 30
    hold_s: float = 0.005
    client_timeout_s: float = 30.0
    grants: list[Grant] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # error codes of non-2xx
    transport_errors: list[str] = field(default_factory=list)
    slowest_s: float = 0.0
    # (start, end) of each stretch in which no acquire succeeded anywhere.
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self._threads = _started(self._work, self.workers)

    def stop(self) -> None:
        _stopped(self._stop, self._threads, self.client_timeout_s + 10)

    def granted_since(self, instant: float) -> int:
        with self._lock:
            return sum(1 for grant in self.grants if grant.answered > instant)

    def wait_for_grants(self, count: int, after: float, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.granted_since(after) < count:
            assert time.monotonic() < deadline, (
                f"fewer than {count} grants within {timeout_s} s after the fault: "
                f"{self.granted_since(after)}; statuses {dict(self.statuses)}, "
                f"errors {dict(self.errors)}")
            time.sleep(0.05)

    def _call(self, client: httpx.Client, method: str, url: str,
              **kwargs: object) -> httpx.Response | None:
        started = time.monotonic()
        try:
            resp = client.request(method, url, **kwargs)  # type: ignore[arg-type]
        except httpx.HTTPError as exc:
            with self._lock:
                self.transport_errors.append(f"{method} {url}: {type(exc).__name__}: {exc}")
                self.slowest_s = max(self.slowest_s, time.monotonic() - started)
            return None
        with self._lock:
            self.slowest_s = max(self.slowest_s, time.monotonic() - started)
            self.statuses[resp.status_code] += 1
            if resp.status_code >= 400:
                try:
                    self.errors[resp.json()["error"]["code"]] += 1
                except (ValueError, KeyError, TypeError):
                    self.errors["(no envelope)"] += 1
        return resp

    def switch_keys(self, keys: list[str]) -> None:
        """From the next acquire on, the workers take these locks instead."""
        self.keys = list(keys)

    def _work(self, index: int) -> None:
        server = self.servers[index % len(self.servers)]
        with server.client(timeout=self.client_timeout_s) as client:
            while not self._stop.is_set():
                keys = self.keys
                key = keys[index % len(keys)]
                token = str(uuid.uuid4())
                sent = time.monotonic()
                resp = self._call(client, "PUT", f"/v1/locks/{key}/lease",
                                  headers=lock_headers(token),
                                  json={"ttl_seconds": self.ttl_seconds})
                if resp is None or resp.status_code not in (200, 201):
                    time.sleep(0.02)
                    continue
                grant = Grant(key, int(resp.json()["fencing_token"]), sent, time.monotonic(),
                              server.base_url)
                with self._lock:
                    self.grants.append(grant)
                time.sleep(self.hold_s)
                self._release(client, key, token, grant)

    def _release(self, client: httpx.Client, key: str, token: str, grant: Grant) -> None:
        grant.released = time.monotonic()
        # Retried with the same lock token until an answer says what happened
        # (a 503 during a failover leaves the outcome unknown). Only a first
        # answer of `released: false` says the lease was forgotten: after an
        # unknown outcome, the earlier attempt may have released it.
        for attempt in range(200):
            resp = self._call(client, "DELETE", f"/v1/locks/{key}/lease",
                              headers={"X-Lock-Token": token})
            if resp is not None and resp.status_code == 200:
                grant.forgotten = attempt == 0 and not resp.json()["released"]
                return
            if self._stop.is_set():
                return
            time.sleep(0.05)

    def violations(self, exclusive: bool) -> list[str]:
        """What the grants break (see the module docstring)."""
        # Tokens come from one counter (SQLite) or sequence (PostgreSQL) for
        # every lock: a value seen twice, on any two locks, was issued twice.
        issued = Counter(grant.token for grant in self.grants)
        found = [f"token {token} granted {n} times" for token, n in issued.items() if n > 1]
        by_key: dict[str, list[Grant]] = defaultdict(list)
        for grant in self.grants:
            by_key[grant.key].append(grant)
        for key, grants in by_key.items():
            answered = sorted(grants, key=lambda g: g.answered)
            for grant in grants:
                known = [g.token for g in answered if g.answered < grant.sent]
                if known and grant.token <= max(known):
                    found.append(f"{key}: token {grant.token} (sent at {grant.sent:.3f}) not "
                                 f"above {max(known)}, answered before it was asked")
            if not exclusive:
                continue
            found += [f"{key}: acknowledged lease {g.token} forgotten"
                      for g in grants if g.forgotten]
            for earlier, later in zip(answered, answered[1:], strict=False):
                end = earlier.released if earlier.released is not None else float("inf")
                if later.answered < end:
                    found.append(f"{key}: {later.token} granted while {earlier.token} was held")
        return found


@dataclass
class Slot:
    slot_id: str
    sent: float
    answered: float
    released: float | None = None
    forgotten: bool = False


@dataclass
class SlotLoad:
    """Workers taking slots of one pool (fail fast), holding them briefly and
    releasing them; `violations` checks the pool's bound (SPEC §7.5) against
    every acknowledged slot."""

    servers: list[ServerProcess]
    pool: str
    limit: int
    workers: int = 4
    hold_s: float = 0.02
    client_timeout_s: float = 30.0
    slots: list[Slot] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        with self.servers[0].client(timeout=self.client_timeout_s) as admin:
            made = admin.put(f"/v1/pools/{self.pool}", json={"limit": self.limit})
            assert made.status_code in (200, 201), made.text
        self._threads = _started(self._work, self.workers)

    def stop(self) -> None:
        _stopped(self._stop, self._threads, self.client_timeout_s + 10)

    def _post(self, client: httpx.Client, url: str) -> httpx.Response | None:
        try:
            resp = client.post(url)
        except httpx.HTTPError:
            return None
        with self._lock:
            self.statuses[resp.status_code] += 1
        return resp

    def _work(self, index: int) -> None:
        server = self.servers[index % len(self.servers)]
        with server.client(timeout=self.client_timeout_s) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                resp = self._post(client, f"/v1/pools/{self.pool}/lock/acquire")
                if resp is None or resp.status_code != 200:
                    time.sleep(0.02)
                    continue
                slot = Slot(resp.json()["slot_id"], sent, time.monotonic())
                with self._lock:
                    self.slots.append(slot)
                time.sleep(self.hold_s)
                slot.released = time.monotonic()
                for attempt in range(200):  # as LockLoad._release
                    done = self._post(client, f"/v1/pools/{self.pool}/lock/{slot.slot_id}/release")
                    if done is not None and done.status_code == 200:
                        slot.forgotten = attempt == 0 and not done.json()["released"]
                        break
                    if self._stop.is_set():
                        break
                    time.sleep(0.05)

    def violations(self) -> list[str]:
        """More acknowledged slots held at once than the limit, and slots the
        store forgot (released: false for a slot its holder still held)."""
        found = [f"slot {slot.slot_id[:12]} forgotten" for slot in self.slots if slot.forgotten]
        edges: list[tuple[float, int]] = []
        for slot in self.slots:
            edges.append((slot.answered, 1))
            edges.append((slot.released if slot.released is not None else float("inf"), -1))
        held = 0
        for _, change in sorted(edges, key=lambda edge: (edge[0], edge[1])):
            held += change
            if held > self.limit:
                found.append(f"{held} slots held at once, limit {self.limit}")
                break
        return found
