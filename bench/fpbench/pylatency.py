"""The number users feel: one uncontended acquire+release from Python, one at a time.

fencepost: plain httpx (acquire PUT + release DELETE), and `fencepost.Client().lock()`
when that client exists. etcd: httpx against the JSON gateway (lease granted
once, txn create-if-absent + txn compare-and-delete). Redis: SET NX PX +
EVALSHA compare-and-delete over a plain socket (no client library needed).
Each probe runs for at most `seconds` and at most MAX_CYCLES cycles.
"""

from __future__ import annotations

import base64
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from fpbench.resp import Resp
from fpbench.systems import BENCH_KEY, Etcd, Fencepost, Redis, System

MAX_CYCLES = 20000


@dataclass
class Latency:
    method: str
    cycles: int
    seconds: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    error: str = ""

    @property
    def cycles_per_s(self) -> float:
        return self.cycles / self.seconds if self.seconds > 0 else 0.0


def _time(method: str, cycle: Callable[[int], None], seconds: float) -> Latency:
    for i in range(5):  # warm the connection and caches
        cycle(-1 - i)
    took: list[float] = []
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline and len(took) < MAX_CYCLES:
        t0 = time.perf_counter()
        cycle(len(took))
        took.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    took.sort()
    return Latency(method, len(took), elapsed, 1000 * took[len(took) // 2],
                   1000 * took[min(len(took) - 1, int(len(took) * 0.99))],
                   1000 * statistics.fmean(took))


def _guarded(method: str, probe: Callable[[], Latency]) -> Latency:
    try:
        return probe()
    except Exception as exc:  # noqa: BLE001 - reported in the table, not fatal
        return Latency(method, 0, 0.0, 0.0, 0.0, 0.0, error=f"{type(exc).__name__}: {exc}"[:200])


def measure(system: System, seconds: float, nonce: str) -> list[Latency]:
    if isinstance(system, Fencepost):
        return _fencepost(system, seconds, nonce)
    if isinstance(system, Etcd):
        return [_guarded("httpx, gateway txn", lambda: _etcd(system, seconds, nonce))]
    if isinstance(system, Redis):
        return [_guarded("socket, SET NX + EVALSHA", lambda: _redis(system, seconds, nonce))]
    return []


def _fencepost(system: Fencepost, seconds: float, nonce: str) -> list[Latency]:
    import httpx

    def raw() -> Latency:
        with httpx.Client(base_url=system.base_url,
                          headers={"Authorization": f"Bearer {BENCH_KEY}"}) as http:
            def cycle(i: int) -> None:
                path, token = f"/v1/locks/py-{nonce}-{i}/lease", str(uuid.uuid4())
                got = http.put(path, json={"ttl_seconds": 30}, headers={
                    "X-Lock-Token": token, "X-Request-Id": str(uuid.uuid4())})
                assert got.status_code == 201, got.text
                got = http.delete(path, headers={"X-Lock-Token": token})
                assert got.status_code == 200 and got.json()["released"], got.text
            return _time("httpx, PUT + DELETE", cycle, seconds)

    results = [_guarded("httpx, PUT + DELETE", raw)]
    try:
        from fencepost import Client
    except ImportError:
        return results
    if not hasattr(Client, "lock"):
        return results

    def client() -> Latency:
        fp = Client(url=system.base_url, api_key=BENCH_KEY)
        try:
            def cycle(i: int) -> None:
                with fp.lock(f"pyc-{nonce}-{i}", ttl=30):
                    pass
            return _time("fencepost.Client().lock()", cycle, seconds)
        finally:
            close = getattr(fp, "close", None)
            if close:
                close()

    results.append(_guarded("fencepost.Client().lock()", client))
    return results


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _etcd(system: Etcd, seconds: float, nonce: str) -> Latency:
    import httpx

    with httpx.Client(base_url=system.base_url + system.api) as http:
        lease = http.post("/lease/grant", json={"TTL": 60}).json()["ID"]

        def cycle(i: int) -> None:
            key, value = _b64(f"py-{nonce}-{i}"), _b64(str(uuid.uuid4()))
            got = http.post("/kv/txn", json={
                "compare": [{"key": key, "target": "CREATE", "result": "EQUAL",
                             "create_revision": "0"}],
                "success": [{"requestPut": {"key": key, "value": value, "lease": lease}}]})
            assert got.json().get("succeeded"), got.text
            got = http.post("/kv/txn", json={
                "compare": [{"key": key, "target": "VALUE", "result": "EQUAL", "value": value}],
                "success": [{"requestDeleteRange": {"key": key}}]})
            assert got.json().get("succeeded"), got.text
        return _time("httpx, gateway txn", cycle, seconds)


def _redis(system: Redis, seconds: float, nonce: str) -> Latency:
    with Resp(system.port) as redis:
        def cycle(i: int) -> None:
            key, token = f"py-{nonce}-{i}", uuid.uuid4().hex
            assert redis.call("SET", key, token, "NX", "PX", 30000) == "OK"
            assert redis.call("EVALSHA", system.shas["del"], 1, key, token) == 1
        return _time("socket, SET NX + EVALSHA", cycle, seconds)
