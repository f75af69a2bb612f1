"""A simulated rate-limited upstream for the adaptive-admission benchmark (issue 6).

It has two limits that its clients are not told: a concurrency cap (calls in
progress at once) and a requests-per-minute limit over a sliding window (a log
of the admission times of the last `window_s` seconds; only admitted calls
count). A call over either limit is answered 429 at once, with the headers a
real API sends: `retry-after` (whole seconds, rounded up), `retry-after-ms`
(OpenAI's precise variant; `--no-retry-after-ms` leaves it out), and OpenAI's
`x-ratelimit-{limit,remaining,reset}-requests`, reset being a Go-style duration
until the oldest admission leaves the window (when `remaining` next grows).
An admitted call answers 200 after a service time of `service_ms` plus or minus
a uniform `jitter_ms`; it carries the `x-ratelimit-*` headers too.

Routes (loopback only by default):
    POST|GET /work           one call of the simulated API
    POST /admin/limits       {"concurrency": n, "rpm": m, "service_ms": x, "jitter_ms": y}
                             (each optional) change the hidden limits now
    GET  /admin/stats        counters, limits and the true capacity
    POST /admin/reset        zero the counters and forget the window (a fresh upstream)

True capacity, in calls per second, is min(concurrency * 1000 / service_ms,
rpm / window_s): the most a perfect client could get through.

    python bench/adaptive/upstream.py --port 8900 --concurrency 10 --rpm 1200
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


@dataclass(slots=True)
class Limits:
    concurrency: int = 10
    rpm: int = 1200
    service_ms: float = 40.0
    jitter_ms: float = 10.0
    window_s: float = 60.0
    retry_after_ms_header: bool = True

    @property
    def capacity_rps(self) -> float:
        by_concurrency = self.concurrency * 1000.0 / max(self.service_ms, 0.001)
        return min(by_concurrency, self.rpm / self.window_s)


@dataclass(frozen=True, slots=True)
class Throttle:
    reason: str  # "concurrency" or "rpm"
    retry_after_s: float


class Upstream:
    """The hidden state. Single-threaded: every method runs on the event loop."""

    def __init__(self, limits: Limits, *, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.limits = limits
        self.clock = clock
        self.rng = rng or random.Random()
        self.reset()

    def reset(self) -> None:
        self.admitted: deque[float] = deque()  # admission times inside the window
        self.ends: dict[int, float] = {}  # expected end time of each call in progress
        self.next_call = 0
        self.served = 0
        self.throttled_concurrency = 0
        self.throttled_rpm = 0
        self.max_in_flight = 0
        self.started = self.clock()

    @property
    def in_flight(self) -> int:
        return len(self.ends)

    def _prune(self, now: float) -> None:
        horizon = now - self.limits.window_s
        while self.admitted and self.admitted[0] <= horizon:
            self.admitted.popleft()

    def remaining(self, now: float) -> int:
        self._prune(now)
        return max(0, self.limits.rpm - len(self.admitted))

    def reset_s(self, now: float) -> float:
        """Seconds until the oldest admission leaves the window (0 when it is empty)."""
        self._prune(now)
        if not self.admitted:
            return 0.0
        return max(0.0, self.admitted[0] + self.limits.window_s - now)

    def try_admit(self, now: float) -> Throttle | tuple[int, float]:
        """A Throttle, or (call id, service seconds) for an admitted call."""
        if self.in_flight >= self.limits.concurrency:
            self.throttled_concurrency += 1
            soonest = min(self.ends.values(), default=now)
            return Throttle("concurrency", max(0.001, soonest - now))
        if self.remaining(now) <= 0:
            self.throttled_rpm += 1
            return Throttle("rpm", max(0.001, self.reset_s(now)))
        jitter = self.rng.uniform(-self.limits.jitter_ms, self.limits.jitter_ms)
        service_s = max(0.0, self.limits.service_ms + jitter) / 1000.0
        call = self.next_call
        self.next_call += 1
        self.admitted.append(now)
        self.ends[call] = now + service_s
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return call, service_s

    def finish(self, call: int) -> None:
        if self.ends.pop(call, None) is not None:
            self.served += 1

    def rate_headers(self, now: float) -> dict[str, str]:
        return {
            "x-ratelimit-limit-requests": str(self.limits.rpm),
            "x-ratelimit-remaining-requests": str(self.remaining(now)),
            "x-ratelimit-reset-requests": go_duration(self.reset_s(now)),
        }

    def stats(self) -> dict[str, Any]:
        now = self.clock()
        return {
            "served": self.served,
            "throttled": self.throttled_concurrency + self.throttled_rpm,
            "throttled_concurrency": self.throttled_concurrency,
            "throttled_rpm": self.throttled_rpm,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "in_window": len(self.admitted),
            "uptime_s": round(now - self.started, 3),
            "capacity_rps": round(self.limits.capacity_rps, 3),
            "limits": asdict(self.limits),
        }


def go_duration(seconds: float) -> str:
    """A Go time.Duration string as OpenAI sends it: `20ms`, `1.5s`, `6m0s`, `1h2m3s`."""
    ms = max(0, math.ceil(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def create_app(upstream: Upstream) -> Starlette:
    async def work(request: Request) -> Response:
        now = upstream.clock()
        admitted = upstream.try_admit(now)
        if isinstance(admitted, Throttle):
            headers = upstream.rate_headers(now)
            headers["retry-after"] = str(max(1, math.ceil(admitted.retry_after_s)))
            if upstream.limits.retry_after_ms_header:
                headers["retry-after-ms"] = str(max(1, math.ceil(admitted.retry_after_s * 1000)))
            headers["x-throttle-reason"] = admitted.reason  # for the benchmark's own analysis
            body = {"error": {"type": "rate_limit_exceeded",
                              "message": f"Rate limit reached ({admitted.reason})."}}
            return JSONResponse(body, status_code=429, headers=headers)
        call, service_s = admitted
        try:
            await asyncio.sleep(service_s)
        finally:
            upstream.finish(call)
        done = upstream.clock()
        return JSONResponse({"ok": True, "service_ms": round(service_s * 1000, 3)},
                            headers=upstream.rate_headers(done))

    async def set_limits(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "body must be JSON"}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "body must be a JSON object"}, status_code=400)
        changes: dict[str, Any] = {}
        for name, minimum in (("concurrency", 1), ("rpm", 1), ("service_ms", 0), ("jitter_ms", 0)):
            if name not in body:
                continue
            value = body[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
                return JSONResponse({"error": f"{name} must be a number >= {minimum}"},
                                    status_code=400)
            changes[name] = int(value) if name in ("concurrency", "rpm") else float(value)
        unknown = set(body) - {"concurrency", "rpm", "service_ms", "jitter_ms"}
        if unknown:
            return JSONResponse({"error": f"unknown fields: {sorted(unknown)}"}, status_code=400)
        for name, value in changes.items():
            setattr(upstream.limits, name, value)
        return JSONResponse(upstream.stats())

    async def stats(request: Request) -> Response:
        return JSONResponse(upstream.stats())

    async def reset(request: Request) -> Response:
        upstream.reset()
        return JSONResponse(upstream.stats())

    return Starlette(routes=[
        Route("/work", work, methods=["GET", "POST"]),
        Route("/admin/limits", set_limits, methods=["POST"]),
        Route("/admin/stats", stats, methods=["GET"]),
        Route("/admin/reset", reset, methods=["POST"]),
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--concurrency", type=int, default=10, help="hidden concurrency cap")
    parser.add_argument("--rpm", type=int, default=1200, help="hidden requests per window")
    parser.add_argument("--window-s", type=float, default=60.0, help="the rpm window (seconds)")
    parser.add_argument("--service-ms", type=float, default=40.0, help="mean service time")
    parser.add_argument("--jitter-ms", type=float, default=10.0, help="uniform +/- jitter")
    parser.add_argument("--no-retry-after-ms", action="store_true",
                        help="send only the whole-second retry-after on a 429")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.rpm < 1 or args.window_s <= 0:
        parser.error("--concurrency and --rpm must be >= 1, --window-s > 0")
    if args.service_ms < 0 or args.jitter_ms < 0:
        parser.error("--service-ms and --jitter-ms must be >= 0")
    limits = Limits(concurrency=args.concurrency, rpm=args.rpm, service_ms=args.service_ms,
                    jitter_ms=args.jitter_ms, window_s=args.window_s,
                    retry_after_ms_header=not args.no_retry_after_ms)
    upstream = Upstream(limits, rng=random.Random(args.seed))
    print(f"upstream on http://{args.host}:{args.port} (capacity "
          f"{limits.capacity_rps:.1f} calls/s)", flush=True)
    uvicorn.run(create_app(upstream), host=args.host, port=args.port, log_level="warning",
                access_log=False)


if __name__ == "__main__":
    main()
