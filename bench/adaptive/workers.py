"""The three client strategies of the adaptive-admission benchmark (issue 6).

Each strategy is a *job function*: `await job(worker_index)` does one job (one
successful upstream call, retried as that strategy retries) and returns a
`JobRecord`. `run_workers` runs many workers of one strategy until a deadline.

1. `direct_job`: call the upstream, and on a 429 retry with exponential backoff
   and full jitter, honouring `retry-after-ms` / `retry-after` when the answer
   has one: what users do today (the logic of common SDKs such as openai-python).
2. `pool_job` with a fixed pool: acquire a fencepost slot, call the upstream,
   release the slot reporting `{"status", "headers"}`; on a 429 back off as in
   (1) after releasing, then acquire again.
3. `pool_job` with an adaptive pool (`adaptive: true`): the same, but without
   the client-side backoff by default: the pool's learned limit and its pause
   on retry hints do the pacing.

Loopback only: every URL must name 127.0.0.1, ::1 or localhost. Every loop is
bounded (attempts, acquire tries). Times are `time.monotonic()` seconds.
"""

from __future__ import annotations

import asyncio
import importlib.util
import ipaddress
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

# httpcore asks `import sniffio` on every lock operation; when sniffio is not
# installed that failed import searches sys.path each time (a tenth of the client's
# CPU in a profile). Recording it as absent makes the same ImportError immediate.
if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
    sys.modules["sniffio"] = None  # type: ignore[assignment]

import httpx  # noqa: E402

from fencepost.core.ratelimit_headers import parse_rate_limit_headers

JobFn = Callable[[int], Awaitable["JobRecord"]]
# One client shared by every worker, or one per worker (see make_clients).
Clients = httpx.AsyncClient | Sequence[httpx.AsyncClient]


@dataclass(frozen=True, slots=True)
class JobRecord:
    start: float  # time.monotonic() when the job began
    end: float  # ... and when it finished (success or given up)
    status: int  # the last upstream status; 0 when the upstream never answered
    attempts: int  # upstream calls made
    throttled: int = 0  # of which answered 429
    acquire_s: float = 0.0  # time spent acquiring fencepost slots (strategies 2 and 3)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def latency_s(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter (AWS Architecture Blog, "Exponential
    Backoff And Jitter", 2015): sleep uniform(0, min(cap, base * 2**n))."""

    base_s: float = 0.1
    cap_s: float = 8.0
    max_attempts: int = 8  # upstream calls per job, the first included
    honour_retry_after: bool = True
    max_retry_after_s: float = 60.0  # as openai-python: a longer hint is not trusted

    def delay(self, retry: int, hint_s: float | None, rng: random.Random) -> float:
        if self.honour_retry_after and hint_s is not None and 0 < hint_s <= self.max_retry_after_s:
            return hint_s
        return rng.uniform(0.0, min(self.cap_s, self.base_s * 2**retry))


def retry_hint_s(headers: httpx.Headers) -> float | None:
    """The upstream's retry hint in seconds (`retry-after-ms`, `retry-after`), if any."""
    hint_ms = parse_rate_limit_headers(headers, int(time.time() * 1000)).retry_after_ms
    return None if hint_ms is None else hint_ms / 1000.0


def require_loopback(url: str) -> str:
    host = httpx.URL(url).host
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(f"the benchmark talks to loopback only, not {url!r}")
    return url.rstrip("/")


def make_client(workers: int, timeout_s: float = 30.0) -> httpx.AsyncClient:
    """One client for a whole run: enough connections for every worker to hold one to
    fencepost and one to the upstream; no proxies from the environment. Fine for a
    few workers; for many, use make_clients: httpcore scans every connection of its
    pool on each request, which at 100 connections cost ~15 ms of CPU per request."""
    size = 2 * workers + 8
    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
        timeout=httpx.Timeout(timeout_s),
        trust_env=False,
    )


def make_clients(workers: int, timeout_s: float = 30.0) -> list[httpx.AsyncClient]:
    """One small client per worker (a connection to fencepost and one to the upstream),
    as separate processes would have: ~1.3 ms of CPU per request instead of ~15 ms for
    one client with 100 connections. Close them with close_clients."""
    return [httpx.AsyncClient(limits=httpx.Limits(max_connections=4,
                                                  max_keepalive_connections=4),
                              timeout=httpx.Timeout(timeout_s), trust_env=False)
            for _ in range(workers)]


async def close_clients(clients: Clients) -> None:
    for client in [clients] if isinstance(clients, httpx.AsyncClient) else clients:
        await client.aclose()


def client_for(clients: Clients, worker: int) -> httpx.AsyncClient:
    if isinstance(clients, httpx.AsyncClient):
        return clients
    return clients[worker % len(clients)]


# --- strategy 1: direct calls with backoff ---------------------------------------------------


def direct_job(clients: Clients, upstream_url: str, *, backoff: Backoff = Backoff(),
               seed: int = 0) -> JobFn:
    """Strategy (1). `upstream_url` is the call to make, e.g. http://127.0.0.1:8900/work."""
    url = require_loopback(upstream_url)
    rngs: dict[int, random.Random] = {}

    async def job(worker: int) -> JobRecord:
        rng = rngs.setdefault(worker, random.Random(seed * 100_003 + worker))
        http = client_for(clients, worker)
        start = time.monotonic()
        status = attempts = throttled = 0
        while attempts < backoff.max_attempts:
            attempts += 1
            hint: float | None = None
            try:
                response = await http.post(url)
                status = response.status_code
                hint = retry_hint_s(response.headers)
            except httpx.HTTPError:
                status = 0
            if status == 429:
                throttled += 1
            elif status != 0:
                break  # success, or an error that retrying would not mend
            if attempts < backoff.max_attempts:
                await asyncio.sleep(backoff.delay(attempts - 1, hint, rng))
        return JobRecord(start, time.monotonic(), status, attempts, throttled)

    return job


# --- strategies 2 and 3: through a fencepost pool --------------------------------------------


def pool_job(
    clients: Clients,
    fencepost_url: str,
    api_key: str,
    pool: str,
    upstream_url: str,
    *,
    wait_ms: int = 30_000,
    client_backoff: bool = True,
    backoff: Backoff = Backoff(),
    max_acquire_tries: int = 50,
    seed: int = 0,
) -> JobFn:
    """Strategies (2) and (3): acquire a slot of `pool` (waiting up to `wait_ms`), call
    the upstream, release the slot with the upstream's status and headers.

    With `client_backoff` a 429 is followed by the backoff of strategy (1) before the
    next acquire (what a user would add around a fixed pool); without it the next
    acquire follows at once and the pool alone paces the calls (strategy 3)."""
    base = require_loopback(fencepost_url)
    url = require_loopback(upstream_url)
    auth = {"Authorization": f"Bearer {api_key}"}
    acquire_url = f"{base}/v1/pools/{pool}/lock/acquire"
    rngs: dict[int, random.Random] = {}

    async def acquire(http: httpx.AsyncClient, rng: random.Random) -> str | None:
        """A slot id, or None after `max_acquire_tries` refusals."""
        for _ in range(max_acquire_tries):
            try:
                response = await http.post(acquire_url, json={"wait_ms": wait_ms}, headers=auth,
                                           timeout=wait_ms / 1000 + 10)
            except httpx.TransportError:
                await asyncio.sleep(0.1 + rng.uniform(0.0, 0.1))
                continue
            if response.status_code == 200:
                return str(response.json()["slot_id"])
            if response.status_code in (429, 503, 504):  # full, paused, or waited in vain
                hint = _seconds(response.headers.get("retry-after"))
                pause = min(hint, backoff.max_retry_after_s) if hint is not None else 0.05
                await asyncio.sleep(pause + rng.uniform(0.0, 0.05))  # spread the wake-ups
                continue
            raise RuntimeError(f"acquire on {pool!r}: {response.status_code} {response.text}")
        return None

    async def release(http: httpx.AsyncClient, slot_id: str, status: int,
                      headers: httpx.Headers | None) -> None:
        report: dict[str, Any] = {}
        if status:
            report["status"] = status
        if headers is not None:
            report["headers"] = dict(headers)
        try:
            await http.post(f"{base}/v1/pools/{pool}/lock/{slot_id}/release", json=report,
                            headers=auth)
        except httpx.HTTPError:
            pass  # the slot is reclaimed within one term anyway

    async def job(worker: int) -> JobRecord:
        rng = rngs.setdefault(worker, random.Random(seed * 100_003 + worker))
        http = client_for(clients, worker)
        start = time.monotonic()
        status = attempts = throttled = 0
        acquire_s = 0.0
        while attempts < backoff.max_attempts:
            before = time.monotonic()
            slot_id = await acquire(http, rng)
            acquire_s += time.monotonic() - before
            if slot_id is None:
                break  # the pool never let us in: the job fails with the last status
            attempts += 1
            hint: float | None = None
            headers: httpx.Headers | None = None
            try:
                response = await http.post(url)
                status, headers = response.status_code, response.headers
                hint = retry_hint_s(response.headers)
            except httpx.HTTPError:
                status = 0
            finally:
                await release(http, slot_id, status, headers)
            if status == 429:
                throttled += 1
            elif status != 0:
                break
            if attempts < backoff.max_attempts and (client_backoff or status == 0):
                await asyncio.sleep(backoff.delay(attempts - 1, hint, rng))
        return JobRecord(start, time.monotonic(), status, attempts, throttled, acquire_s)

    return job


def _seconds(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 3600 else None


# --- running many workers, and the admin calls a driver needs --------------------------------


async def run_workers(job: JobFn, *, workers: int, duration_s: float,
                      max_jobs_per_worker: int = 1_000_000,
                      stop: asyncio.Event | None = None) -> list[JobRecord]:
    """Run `workers` copies of `job` back to back until `duration_s` has passed (or
    `stop` is set); a job under way then finishes. Records in completion order."""
    deadline = time.monotonic() + duration_s
    records: list[JobRecord] = []

    async def worker(index: int) -> None:
        for _ in range(max_jobs_per_worker):
            if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                return
            records.append(await job(index))

    await asyncio.gather(*(worker(i) for i in range(workers)))
    return records


async def configure_pool(http: httpx.AsyncClient, fencepost_url: str, admin_key: str, pool: str,
                         *, limit: int, adaptive: bool = False, min_limit: int | None = None,
                         rpm: int | None = None, queue_size: int = 1000,
                         queue_timeout_ms: int = 60_000) -> dict[str, Any]:
    """PUT /v1/pools/{pool} (SPEC §4.1); the later fields are sent only when asked for."""
    body: dict[str, Any] = {"limit": limit, "queue_size": queue_size,
                            "queue_timeout_ms": queue_timeout_ms}
    if adaptive:
        body["adaptive"] = True
    if min_limit is not None:
        body["min_limit"] = min_limit
    if rpm is not None:
        body["rpm"] = rpm
    response = await http.put(f"{require_loopback(fencepost_url)}/v1/pools/{pool}", json=body,
                              headers={"Authorization": f"Bearer {admin_key}"})
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


async def pool_state(http: httpx.AsyncClient, fencepost_url: str, key: str,
                     pool: str) -> dict[str, Any]:
    """GET /v1/pools/{pool}: configuration and live state, `effective_limit` included."""
    response = await http.get(f"{require_loopback(fencepost_url)}/v1/pools/{pool}",
                              headers={"Authorization": f"Bearer {key}"})
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


async def upstream_admin(http: httpx.AsyncClient, upstream_base: str, action: str,
                         limits: dict[str, float] | None = None) -> dict[str, Any]:
    """The simulated upstream's admin routes: action "stats", "reset" or "limits"."""
    base = require_loopback(upstream_base)
    if action == "stats":
        response = await http.get(f"{base}/admin/stats")
    elif action in ("reset", "limits"):
        response = await http.post(f"{base}/admin/{action}", json=limits or {})
    else:
        raise ValueError(f"unknown action {action!r}")
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result
