"""A family of simulated upstreams with the limits real providers use, for the
adaptive-admission benchmark (`family.py`). The pool under test is told none
of these limits; it sees only the answers, with the headers a real provider
of that kind sends.

Kinds (`KINDS`; windows scaled down in time where they would not fit a short run):

- `continuous`: a per-minute budget refilling continuously (a token bucket
  holding one second of refill: OpenAI documents that its per-minute limits
  are enforced over shorter periods). OpenAI headers
  `x-ratelimit-{limit,remaining,reset}-requests` (reset: a Go duration until
  the budget is full again); a 429 carries a whole-second `retry-after` only.
- `fixed-window`: a fixed one-minute window that resets on the minute, with a
  "minute" of 6 s. IETF structured headers `ratelimit-policy: "default";q=Q;w=6`
  and `ratelimit: "default";r=R;t=T` (t in whole seconds); 429 with `retry-after`.
- `concurrency-cap`: a cap on calls in progress only: 429 with `retry-after: 1`
  and no rate headers.
- `budget-and-cap`: a continuous budget and a concurrency cap at once (OpenAI
  headers); the driver changes which one binds mid-run.
- `hourly-github`: a fixed hourly window in GitHub's dialect, with an "hour" of
  12 s: `x-ratelimit-{limit,remaining,used,reset,resource}` (reset in epoch
  seconds) and `ratelimit-policy: "core";q=Q;w=12`; over the limit 429 with
  `x-ratelimit-remaining: 0`, no `retry-after` (as GitHub's primary limit).
- `halving`: a concurrency cap that the driver halves mid-run and later
  restores; Anthropic headers (`anthropic-ratelimit-requests-*`, reset an RFC
  3339 time) for a budget that does not bind; 429 with a whole-second `retry-after`.
- `slowdown`: never says 429; past its capacity each call takes longer
  (latency = service * (in progress / capacity) ** 1.5: contention makes the
  upstream do less in total, as a thrashing database or GPU server does).

Routes, as upstream.py: `POST /work`, `POST /admin/limits` ({"concurrency",
"quota"}, each optional), `GET /admin/stats` (with `capacity_rps`, the most a
perfect client could get through now), `POST /admin/reset`.

    python bench/adaptive/providers.py --kind fixed-window --port 8901
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.applications import Starlette


@dataclass
class Limits:
    dialect: str  # "openai", "ietf", "github", "anthropic" or "none"
    concurrency: int | None = None  # cap on calls in progress
    quota: int | None = None  # calls per window
    window_s: float = 60.0  # the window the quota is stated for
    continuous: bool = False  # refill continuously (bucket) instead of fixed windows
    burst_s: float = 1.0  # a continuous budget holds this many seconds of refill
    slowdown: bool = False  # past `concurrency`, calls get slower instead of 429
    service_ms: float = 200.0
    jitter_ms: float = 20.0

    @property
    def capacity_rps(self) -> float:
        rates = []
        if self.concurrency is not None:
            rates.append(self.concurrency * 1000.0 / self.service_ms)
        if self.quota is not None:
            rates.append(self.quota / self.window_s)
        return min(rates) if rates else math.inf


SCALED_MINUTE_S = 6.0
SCALED_HOUR_S = 12.0

KINDS: dict[str, Limits] = {
    "continuous": Limits("openai", quota=1500, window_s=60.0, continuous=True),
    "fixed-window": Limits("ietf", quota=150, window_s=SCALED_MINUTE_S),
    "concurrency-cap": Limits("none", concurrency=8),
    "budget-and-cap": Limits("openai", concurrency=8, quota=1200, window_s=60.0,
                             continuous=True),
    "hourly-github": Limits("github", quota=300, window_s=SCALED_HOUR_S),
    "halving": Limits("anthropic", concurrency=8, quota=6000, window_s=60.0, continuous=True),
    "slowdown": Limits("none", concurrency=8, slowdown=True),
}


class Upstream:
    """The hidden state. Single-threaded: every method runs on the event loop."""

    def __init__(self, limits: Limits, rng: random.Random) -> None:
        self.limits = limits
        self.rng = rng
        self.reset()

    def reset(self) -> None:
        self.tokens = self._bucket_size()
        self.refilled = time.monotonic()
        self.origin = time.time()  # fixed windows start here, one after another
        self.window_index = -1
        self.window_used = 0
        self.in_flight = 0
        self.served = 0
        self.throttled_concurrency = 0
        self.throttled_budget = 0
        self.max_in_flight = 0

    # --- the budget ---------------------------------------------------------------------------

    def _rate(self) -> float:
        assert self.limits.quota is not None
        return self.limits.quota / self.limits.window_s

    def _bucket_size(self) -> float:
        if self.limits.quota is None or not self.limits.continuous:
            return 0.0
        return max(1.0, self._rate() * self.limits.burst_s)

    def _refill(self, now: float) -> None:
        if self.limits.quota is None:
            return
        if self.limits.continuous:
            size = self._bucket_size()
            self.tokens = min(size, self.tokens + (now - self.refilled) * self._rate())
            self.refilled = now
            return
        # Fixed windows reset every window_s from the reset (the "minute"), so a
        # driver that starts right after a reset measures whole windows.
        index = math.floor((time.time() - self.origin) / self.limits.window_s)
        if index != self.window_index:
            self.window_index, self.window_used = index, 0

    def remaining(self) -> int:
        q = self.limits.quota
        if q is None:
            return 0
        return int(self.tokens) if self.limits.continuous else max(0, q - self.window_used)

    def _spend(self) -> bool:
        if self.limits.quota is None:
            return True
        if self.limits.continuous:
            if self.tokens < 1.0:
                return False
            self.tokens -= 1.0
            return True
        if self.window_used >= self.limits.quota:
            return False
        self.window_used += 1
        return True

    def window_end(self) -> float:
        """Epoch seconds when the fixed window resets."""
        return self.origin + (self.window_index + 1) * self.limits.window_s

    def until_full_s(self) -> float:
        return max(0.0, (self._bucket_size() - self.tokens) / self._rate())

    def until_next_s(self) -> float:
        """Seconds until one more call fits the budget."""
        if self.limits.continuous:
            return max(0.0, (1.0 - self.tokens) / self._rate())
        return max(0.0, self.window_end() - time.time())

    # --- one call ------------------------------------------------------------------------------

    def admit(self) -> str | float:
        """The throttle reason ("concurrency", "budget"), or the call's service seconds."""
        now = time.monotonic()
        self._refill(now)
        cap = self.limits.concurrency
        if cap is not None and not self.limits.slowdown and self.in_flight >= cap:
            self.throttled_concurrency += 1
            return "concurrency"
        if not self._spend():
            self.throttled_budget += 1
            return "budget"
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        jitter = self.rng.uniform(-self.limits.jitter_ms, self.limits.jitter_ms)
        service = max(0.0, self.limits.service_ms + jitter) / 1000.0
        if self.limits.slowdown and cap is not None and self.in_flight > cap:
            service *= (self.in_flight / cap) ** 1.5
        return service

    def headers(self, throttle: str | None) -> dict[str, str]:
        self._refill(time.monotonic())
        d = self.limits.dialect
        h: dict[str, str] = {}
        q = self.limits.quota
        if d == "openai" and q is not None:
            h["x-ratelimit-limit-requests"] = str(q)
            h["x-ratelimit-remaining-requests"] = str(self.remaining())
            h["x-ratelimit-reset-requests"] = go_duration(self.until_full_s())
        elif d == "anthropic" and q is not None:
            h["anthropic-ratelimit-requests-limit"] = str(q)
            h["anthropic-ratelimit-requests-remaining"] = str(self.remaining())
            full_at = datetime.fromtimestamp(time.time() + self.until_full_s(), UTC)
            h["anthropic-ratelimit-requests-reset"] = full_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        elif d == "ietf" and q is not None:
            w = int(self.limits.window_s)
            h["ratelimit-policy"] = f'"default";q={q};w={w}'
            t = math.ceil(max(0.0, self.window_end() - time.time()))
            h["ratelimit"] = f'"default";r={self.remaining()};t={t}'
        elif d == "github" and q is not None:
            h["x-ratelimit-limit"] = str(q)
            h["x-ratelimit-remaining"] = str(self.remaining())
            h["x-ratelimit-used"] = str(q - self.remaining())
            h["x-ratelimit-reset"] = str(math.ceil(self.window_end()))
            h["x-ratelimit-resource"] = "core"
            h["ratelimit-policy"] = f'"core";q={q};w={int(self.limits.window_s)}'
        if throttle is not None and d != "github":
            # Whole seconds, rounded up, as most providers send it.
            wait = 1.0 if throttle == "concurrency" or q is None else self.until_next_s()
            h["retry-after"] = str(max(1, math.ceil(wait)))
        return h

    def finish(self) -> None:
        self.in_flight -= 1
        self.served += 1

    def stats(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "throttled": self.throttled_concurrency + self.throttled_budget,
            "throttled_concurrency": self.throttled_concurrency,
            "throttled_budget": self.throttled_budget,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "capacity_rps": round(self.limits.capacity_rps, 3),
            "limits": asdict(self.limits),
        }


def go_duration(seconds: float) -> str:
    """A Go time.Duration string as OpenAI sends it: `20ms`, `1.5s`, `6m0s`."""
    ms = max(0, math.ceil(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def create_app(upstream: Upstream) -> Starlette:
    # Imported here: the limits and headers above need nothing beyond the stdlib.
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def work(request: Request) -> Response:
        admitted = upstream.admit()
        if isinstance(admitted, str):
            body = {"error": {"type": "rate_limit_exceeded", "message": admitted}}
            headers = upstream.headers(admitted)
            headers["x-throttle-reason"] = admitted  # for the benchmark's own analysis
            return JSONResponse(body, status_code=429, headers=headers)
        try:
            await asyncio.sleep(admitted)
        finally:
            upstream.finish()
        return JSONResponse({"ok": True}, headers=upstream.headers(None))

    async def set_limits(request: Request) -> Response:
        body = await request.json()
        if not isinstance(body, dict) or set(body) - {"concurrency", "quota"}:
            return JSONResponse({"error": "fields: concurrency, quota"}, status_code=400)
        for name, value in body.items():
            if not isinstance(value, int) or value < 1:
                return JSONResponse({"error": f"{name} must be an integer >= 1"},
                                    status_code=400)
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
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--kind", choices=sorted(KINDS), required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8901)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    upstream = Upstream(KINDS[args.kind], random.Random(args.seed))
    uvicorn.run(create_app(upstream), host=args.host, port=args.port, log_level="warning",
                access_log=False)


if __name__ == "__main__":
    main()
