"""What the hand-off workload (g) waits on, per system: a `Door` (one lock, or
one pool) and its `Seat`s (one client each, on a connection of its own).

- fencepost: a lock (`PUT …/lease` with `wait_seconds`, `DELETE …/lease`) or
  a pool of limit 1 (`…/lock/acquire` with `wait_ms`, `…/release`).
- etcd: its lock service through the JSON gateway (`lock/lock` with the
  seat's own lease, `lock/unlock` with the key it answered); the line is
  the lock's keys, granted in revision order.
- Redis: a list holding one token; `BLPOP` waits for it (Redis serves blocked
  clients first come, first served), `RPUSH` gives it back. No lease, no
  fencing token: the simplest fair queue Redis has.
"""

from __future__ import annotations

import base64
import datetime as dt
import time
import uuid
from dataclasses import dataclass
from typing import Protocol

from fpbench.aioconn import ConnError, HttpConn, RedisConn
from fpbench.systems import BENCH_KEY, Etcd, Fencepost, Redis, System

_AUTH = {"Authorization": f"Bearer {BENCH_KEY}"}
ETCD_NO_POOL = "etcd has no counting semaphore primitive (its recipe is several round trips)"
REDIS_NO_EXPIRY = "a list of tokens has no lease: a holder that dies keeps the token for good"
REDIS_NO_POOL = "a pool of limit 1 is the lock's list of one token: nothing new to measure"


@dataclass(frozen=True)
class Grant:
    """When the granted lease ends, by the wall clock (ns since the epoch), if known."""

    expires_ns: int | None = None


class Seat(Protocol):
    async def take(self, wait_s: float) -> Grant:
        """Wait up to `wait_s` in line (0: fail fast); raise unless granted."""

    async def give_back(self) -> None: ...

    def close(self) -> None: ...


class Door(Protocol):
    async def seat(self, ttl_s: int) -> Seat:
        """A new client whose grants last `ttl_s` (where the system has leases)."""

    async def waiting(self) -> int:
        """How many wait in line now, the holder not counted."""

    def close(self) -> None: ...


def _refused(what: str, status: int, body: object) -> ConnError:
    return ConnError(f"{what} answered {status}: {str(body)[:300]}")


def _wall_ns(rfc3339: str) -> int:
    """`2026-11-29T06:43:26.123Z` as ns since the epoch (whole milliseconds)."""
    at = dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    return round(at.timestamp() * 1000) * 1_000_000


class _Probe:
    """A door's own connection for asking how long the line is, opened on first use."""

    def __init__(self, port: int, headers: dict[str, str] | None = None) -> None:
        self.port, self.headers = port, headers or {}
        self.conn: HttpConn | None = None

    async def get(self, path: str, body: object = None, method: str = "GET") -> object:
        if self.conn is None:
            self.conn = await HttpConn.open(self.port)
        status, answer = await self.conn.call(method, path, body, self.headers)
        if status not in (200, 201):  # 201: a pool created
            raise _refused(path, status, answer)
        return answer

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class _FencepostLockSeat:
    def __init__(self, conn: HttpConn, path: str, ttl_s: int) -> None:
        self.conn, self.path, self.ttl_s, self.token = conn, path, ttl_s, ""

    async def take(self, wait_s: float) -> Grant:
        self.token = str(uuid.uuid4())
        status, body = await self.conn.call(
            "PUT", self.path, {"ttl_seconds": self.ttl_s, "wait_seconds": wait_s},
            {**_AUTH, "X-Lock-Token": self.token, "X-Request-Id": str(uuid.uuid4())})
        if status != 201:
            raise _refused("acquire", status, body)
        return Grant(_wall_ns(body["expires_at"]))

    async def give_back(self) -> None:
        status, body = await self.conn.call("DELETE", self.path, None,
                                            {**_AUTH, "X-Lock-Token": self.token})
        if status != 200 or not body.get("released"):
            raise _refused("release", status, body)

    def close(self) -> None:
        self.conn.close()


class FencepostLock:
    def __init__(self, port: int, name: str) -> None:
        self.port, self.name, self.probe = port, name, _Probe(port, _AUTH)

    async def seat(self, ttl_s: int) -> Seat:
        return _FencepostLockSeat(await HttpConn.open(self.port), f"/v1/locks/{self.name}/lease",
                                  ttl_s)

    async def waiting(self) -> int:
        answer = await self.probe.get(f"/v1/locks/{self.name}")
        assert isinstance(answer, dict)
        return int(answer["waiters"])

    def close(self) -> None:
        self.probe.close()


class _FencepostPoolSeat:
    def __init__(self, conn: HttpConn, pool: str) -> None:
        self.conn, self.pool, self.slot = conn, pool, ""

    async def take(self, wait_s: float) -> Grant:
        status, body = await self.conn.call("POST", f"/v1/pools/{self.pool}/lock/acquire",
                                            {"wait_ms": int(wait_s * 1000)}, _AUTH)
        if status != 200:
            raise _refused("pool acquire", status, body)
        self.slot = body["slot_id"]
        return Grant()

    async def give_back(self) -> None:
        status, body = await self.conn.call(
            "POST", f"/v1/pools/{self.pool}/lock/{self.slot}/release", None, _AUTH)
        if status != 200 or not body.get("released"):
            raise _refused("pool release", status, body)

    def close(self) -> None:
        self.conn.close()


class FencepostPool:
    """A pool of limit 1, so that each release admits exactly one waiter."""

    def __init__(self, port: int, name: str) -> None:
        self.port, self.name, self.probe = port, name, _Probe(port, _AUTH)

    async def create(self) -> FencepostPool:
        await self.probe.get(f"/v1/pools/{self.name}", {
            "limit": 1, "queue_size": 1000, "queue_timeout_ms": 600_000, "term_ms": 600_000,
            "request_timeout_ms": 3_600_000}, method="PUT")
        return self

    async def seat(self, ttl_s: int) -> Seat:
        return _FencepostPoolSeat(await HttpConn.open(self.port), self.name)

    async def waiting(self) -> int:
        answer = await self.probe.get(f"/v1/pools/{self.name}")
        assert isinstance(answer, dict)
        return int(answer["queued"])

    def close(self) -> None:
        self.probe.close()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class _EtcdSeat:
    def __init__(self, conn: HttpConn, api: str, name: str, lease: str,
                 expires_ns: int) -> None:
        self.conn, self.api, self.name, self.lease = conn, api, name, lease
        self.expires_ns, self.key = expires_ns, ""

    async def take(self, wait_s: float) -> Grant:
        # The gateway has no wait limit of its own: the call waits until granted.
        status, body = await self.conn.call("POST", f"{self.api}/lock/lock",
                                            {"name": _b64(self.name.encode()), "lease": self.lease})
        if status != 200 or "key" not in body:
            raise _refused("lock", status, body)
        self.key = body["key"]
        return Grant(self.expires_ns)

    async def give_back(self) -> None:
        status, body = await self.conn.call("POST", f"{self.api}/lock/unlock", {"key": self.key})
        if status != 200:
            raise _refused("unlock", status, body)

    def close(self) -> None:
        self.conn.close()


class EtcdLock:
    def __init__(self, port: int, api: str, name: str) -> None:
        # etcd's gateway refuses an Authorization header it did not issue.
        self.port, self.api, self.name, self.probe = port, api, name, _Probe(port)

    async def seat(self, ttl_s: int) -> Seat:
        """A connection and a lease of its own (etcd's lock keys are one per lease)."""
        conn = await HttpConn.open(self.port)
        status, body = await conn.call("POST", f"{self.api}/lease/grant", {"TTL": ttl_s})
        # The lease's TTL runs from its grant: this answer is its start, to
        # within the request's own round trip.
        granted = time.time_ns()
        if status != 200 or "ID" not in body:
            conn.close()
            raise _refused("lease grant", status, body)
        return _EtcdSeat(conn, self.api, self.name, body["ID"], granted + ttl_s * 1_000_000_000)

    async def waiting(self) -> int:
        prefix = f"{self.name}/".encode()
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        answer = await self.probe.get(f"{self.api}/kv/range", {
            "key": _b64(prefix), "range_end": _b64(end), "count_only": True}, method="POST")
        assert isinstance(answer, dict)
        return max(int(answer.get("count", 0)) - 1, 0)

    def close(self) -> None:
        self.probe.close()


class _RedisSeat:
    def __init__(self, conn: RedisConn, name: str) -> None:
        self.conn, self.name, self.token = conn, name, ""

    async def take(self, wait_s: float) -> Grant:
        popped: object
        if wait_s <= 0:
            got = await self.conn.call("LPOP", self.name)
            popped = None if got is None else [self.name, got]
        else:
            popped = await self.conn.call("BLPOP", self.name, max(1, round(wait_s)))
        if not isinstance(popped, list):
            raise ConnError(f"BLPOP {self.name}: no token within {wait_s} s")
        self.token = str(popped[1])
        return Grant()

    async def give_back(self) -> None:
        await self.conn.call("RPUSH", self.name, self.token)

    def close(self) -> None:
        self.conn.close()


class RedisQueue:
    def __init__(self, port: int, name: str) -> None:
        self.port, self.name = port, name
        self.probe: RedisConn | None = None

    async def create(self) -> RedisQueue:
        self.probe = await RedisConn.open(self.port)
        await self.probe.call("DEL", self.name)
        await self.probe.call("RPUSH", self.name, uuid.uuid4().hex)
        return self

    async def seat(self, ttl_s: int) -> Seat:
        return _RedisSeat(await RedisConn.open(self.port), self.name)

    async def waiting(self) -> int:
        assert self.probe is not None
        info = str(await self.probe.call("INFO", "clients"))
        return next(int(line.split(":", 1)[1]) for line in info.splitlines()
                    if line.startswith("blocked_clients:"))

    def close(self) -> None:
        if self.probe is not None:
            self.probe.close()


async def open_door(system: System, case: str, name: str) -> Door | str:
    """The door `case` waits on in `system`, or why the system has none (n/a)."""
    if isinstance(system, Fencepost):
        if case == "pool":
            return await FencepostPool(system.port, name).create()
        return FencepostLock(system.port, name)
    if isinstance(system, Etcd):
        return ETCD_NO_POOL if case == "pool" else EtcdLock(system.port, system.api, name)
    if isinstance(system, Redis):
        if case == "expiry":
            return REDIS_NO_EXPIRY
        if case == "pool":
            return REDIS_NO_POOL
        return await RedisQueue(system.port, name).create()
    return f"no hand-off recipe for {system.name}"
