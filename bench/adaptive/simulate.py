"""The adaptive-admission simulation (issue 6): three ways for many workers to share
an upstream whose limits nobody told them, side by side.

    .venv/bin/python bench/adaptive/simulate.py [--quick] [--workers 50] [--only 1,2,3]

It starts the simulated upstream (upstream.py) and a `fencepost serve` (SQLite in
a temp dir, its own bootstrap key, free loopback ports) itself, then for each
strategy, on a freshly reset upstream:

    warm-up + steady   the upstream's hidden limits as configured (concurrency 8,
                       service 200 +- 20 ms: 40 calls/s; an rpm that does not bind)
    halved             the hidden concurrency halved (20 calls/s)
    restored           back to the configured limits

with N workers doing jobs back to back (strategy 1: direct calls with backoff and
jitter; 2: a fencepost pool with a fixed, too-high limit; 3: an adaptive pool).
It records every upstream answer (time, status), every job, and (strategies 2
and 3) the pool's effective limit every 250 ms, then reports per strategy:
goodput as a share of the upstream's true capacity, the share of calls answered
429 (overall and after settling), job latency, and the settling time after each
change. Settled = the first instant from which every 3 s window until the end of
the phase has goodput >= 90 % of capacity and <= 5 % of its calls throttled
(windows slide in 0.25 s steps); and, in parentheses, the same judged against
what the harness reaches at best with perfect knowledge (its "ceiling",
measured first), which tells the control law's convergence from the machine's
limits.

Writes bench/results/adaptive-<timestamp>.json and .md, adaptive-latest.md and
adaptive-latest.png (needs matplotlib: the `bench` extra). Loopback only; every
loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"

BIN_S = 0.25  # resolution of the settling analysis
WINDOW_S = 3.0  # the rolling window that must look settled
GOODPUT_OK = 0.90  # ... with goodput at least this share of capacity
THROTTLED_OK = 0.05  # ... and at most this share of calls answered 429
SETTLE_TARGET_S = 10.0
POLL_S = 0.25  # how often the pool's effective limit is sampled

STRATEGIES = {
    1: ("direct", "1 direct + backoff/jitter"),
    2: ("fixed", "2 fixed pool"),
    3: ("adaptive", "3 adaptive pool"),
}


def _reexec_in_venv() -> None:
    try:
        import httpx  # noqa: F401
        import uvicorn  # noqa: F401

        import fencepost  # noqa: F401
    except ImportError:
        if VENV_PYTHON.exists() and Path(sys.executable) != VENV_PYTHON:
            os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), *sys.argv])
        raise


# --- what one strategy's run recorded ---------------------------------------------------------


@dataclass
class Phase:
    name: str
    start: float  # seconds since the strategy's t0
    end: float
    concurrency: int
    rpm: int
    capacity_rps: float
    measured_from: float  # goodput and throttling count from here (after the warm-up)


@dataclass
class Run:
    number: int
    key: str
    label: str
    phases: list[Phase]
    calls: list[tuple[float, int]] = field(default_factory=list)  # (t, upstream status)
    jobs: list[tuple[float, float, int, int, int]] = field(
        default_factory=list)  # (start, end, status, attempts, throttled)
    limits: list[tuple[float, int, int, int]] = field(
        default_factory=list)  # (t, effective_limit, in_use, queued)
    learned: list[tuple[float, float]] = field(default_factory=list)  # (t, learned limit)
    cpu: dict[str, float] = field(default_factory=dict)  # share of one core, by process
    upstream: dict[str, Any] = field(default_factory=dict)  # /admin/stats at the end
    pool: dict[str, Any] = field(default_factory=dict)  # the pool's state at the end
    duration_s: float = 0.0


# --- processes -------------------------------------------------------------------------------


class Stack:
    """The simulated upstream and a fencepost server on free loopback ports."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        from fpbench import procs

        self.procs = procs
        self.workdir = workdir
        self.admin_key = "fpsim_" + secrets.token_urlsafe(33)
        self.up_port = procs.free_port()
        self.fp_port = procs.free_port()
        self.upstream_base = f"http://127.0.0.1:{self.up_port}"
        self.fencepost_url = f"http://127.0.0.1:{self.fp_port}"
        self.up_log = workdir / "upstream.log"
        self.fp_log = workdir / "fencepost.log"
        self.upstream = procs.start(
            [sys.executable, str(HERE / "upstream.py"), "--host", "127.0.0.1",
             "--port", str(self.up_port), "--concurrency", str(args.concurrency),
             "--rpm", str(args.rpm), "--service-ms", str(args.service_ms),
             "--jitter-ms", str(args.jitter_ms), "--seed", str(args.seed)],
            self.up_log)
        self.fencepost = procs.start(
            [sys.executable, "-m", "fencepost", "serve",
             "--store", f"sqlite:///{workdir / 'fencepost.db'}", "--host", "127.0.0.1",
             "--port", str(self.fp_port), "--access-log", str(workdir / "access.log")],
            self.fp_log, env=self._server_env(args), cwd=workdir)
        try:
            procs.wait_port(self.up_port, self.upstream)
            procs.wait_port(self.fp_port, self.fencepost)
        except RuntimeError:
            self.stop()
            raise RuntimeError("could not start the stack:\nupstream: "
                               f"{procs.tail(self.up_log)}\nfencepost: "
                               f"{procs.tail(self.fp_log)}") from None

    def _server_env(self, args: argparse.Namespace) -> dict[str, str]:
        env = {"FENCEPOST_BOOTSTRAP_KEY": self.admin_key}
        if args.server_src:  # A/B runs of a changed server without touching this tree
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(Path(args.server_src).resolve()), os.environ.get("PYTHONPATH"))
                if p)
        return env

    def cpu(self) -> dict[str, float]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {"upstream": self.procs.cpu_seconds(self.upstream.pid),
                "fencepost": self.procs.cpu_seconds(self.fencepost.pid),
                "driver": usage.ru_utime + usage.ru_stime}

    def stop(self) -> None:
        for proc in (self.upstream, self.fencepost):
            self.procs.stop(proc)


# --- running one strategy --------------------------------------------------------------------


def plan_phases(args: argparse.Namespace, capacity: float, halved_capacity: float) -> list[Phase]:
    w, s, h, r = args.warmup_s, args.steady_s, args.halved_s, args.restored_s
    half = max(1, args.concurrency // 2)
    return [
        Phase("steady", 0.0, w + s, args.concurrency, args.rpm, capacity, w),
        Phase("halved", w + s, w + s + h, half, args.rpm, halved_capacity, w + s),
        Phase("restored", w + s + h, w + s + h + r, args.concurrency, args.rpm, capacity,
              w + s + h),
    ]


def admin_client() -> Any:
    """The driver's own client (limits, stats, pool state), without keep-alive: its
    calls are seconds apart, and a request sent on a connection that the upstream's
    uvicorn is closing after its 5 s keep-alive timeout fails with a ReadError."""
    import httpx

    return httpx.AsyncClient(limits=httpx.Limits(max_connections=4, max_keepalive_connections=0),
                             timeout=httpx.Timeout(30.0), trust_env=False)


async def run_strategy(number: int, args: argparse.Namespace, stack: Stack) -> Run:
    import httpx
    from workers import (
        close_clients,
        configure_pool,
        direct_job,
        make_clients,
        pool_job,
        pool_state,
        run_workers,
        upstream_admin,
    )

    key, label = STRATEGIES[number]
    http = admin_client()  # the driver's own calls: limits, stats, pool state
    clients = make_clients(args.workers)  # one per worker, as separate processes would have
    try:
        full = {"concurrency": args.concurrency, "rpm": args.rpm}
        half = {"concurrency": max(1, args.concurrency // 2), "rpm": args.rpm}
        # What each phase's true capacity is, as the upstream itself computes it.
        halved_cap = (await upstream_admin(http, stack.upstream_base, "limits",
                                           half))["capacity_rps"]
        capacity = (await upstream_admin(http, stack.upstream_base, "limits",
                                         full))["capacity_rps"]
        await upstream_admin(http, stack.upstream_base, "reset")
        phases = plan_phases(args, capacity, halved_cap)
        run = Run(number, key, label, phases)
        upstream_url = f"{stack.upstream_base}/work"
        pool = f"sim-{key}"
        if key == "direct":
            job = direct_job(clients, upstream_url, seed=args.seed)
        else:
            adaptive = key == "adaptive"
            await configure_pool(
                http, stack.fencepost_url, stack.admin_key, pool,
                limit=args.adaptive_limit if adaptive else args.fixed_limit,
                adaptive=adaptive, min_limit=1 if adaptive else None)
            job = pool_job(clients, stack.fencepost_url, stack.admin_key, pool, upstream_url,
                           client_backoff=not adaptive, seed=args.seed)

        total = phases[-1].end
        t0 = time.monotonic()

        async def record(response: httpx.Response) -> None:
            if response.request.url.path == "/work":
                run.calls.append((time.monotonic() - t0, response.status_code))

        for client in clients:
            client.event_hooks = {"request": [], "response": [record]}
        stop = asyncio.Event()

        async def change_limits() -> None:
            for phase, limits in zip(phases[1:], (half, full), strict=True):
                await asyncio.sleep(max(0.0, t0 + phase.start - time.monotonic()))
                stats = await upstream_admin(http, stack.upstream_base, "limits", limits)
                phase.capacity_rps = stats["capacity_rps"]

        async def poll_pool() -> None:
            if key == "direct":
                return
            for _ in range(int(total / POLL_S) + 10):  # bounded
                if stop.is_set():
                    return
                try:
                    state = await pool_state(http, stack.fencepost_url, stack.admin_key, pool)
                except httpx.HTTPError:
                    state = None
                if state is not None:
                    now = time.monotonic() - t0
                    run.limits.append((now, int(state["effective_limit"]),
                                       int(state.get("in_use", 0)), int(state.get("queued", 0))))
                    learned = state.get("learned") or {}
                    if learned.get("limit") is not None:
                        run.learned.append((now, float(learned["limit"])))
                    run.pool = state
                await asyncio.sleep(POLL_S)

        cpu_before = stack.cpu()
        poller = asyncio.create_task(poll_pool())
        changer = asyncio.create_task(change_limits())
        records = await run_workers(job, workers=args.workers, duration_s=total, stop=stop)
        stop.set()
        run.duration_s = time.monotonic() - t0
        await changer
        await poller
        cpu_after = stack.cpu()
        run.cpu = {name: (cpu_after[name] - cpu_before[name]) / run.duration_s
                   for name in cpu_before}
        run.upstream = await upstream_admin(http, stack.upstream_base, "stats")
        run.jobs = [(r.start - t0, r.end - t0, r.status, r.attempts, r.throttled)
                    for r in records]
        return run
    finally:
        await http.aclose()
        await close_clients(clients)


async def calibrate(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    """Sanity checks of the harness, on the configured limits, with nothing throttled:

    - direct: as many direct workers as the upstream's concurrency. Their goodput is
      what the client and the machine can do (a check that CPU is not the bottleneck);
    - perfect pool: all the workers through a fencepost pool whose fixed limit is the
      upstream's true concurrency (what a perfectly informed pool would do). A slot is
      held a little longer than the call (the release and the next admission are round
      trips to fencepost), so this is the ceiling for strategies 2 and 3."""
    from workers import (
        close_clients,
        configure_pool,
        direct_job,
        make_clients,
        pool_job,
        run_workers,
        upstream_admin,
    )

    http = admin_client()
    out: dict[str, Any] = {}
    try:
        stats = await upstream_admin(http, stack.upstream_base, "limits",
                                     {"concurrency": args.concurrency, "rpm": args.rpm})
        capacity = float(stats["capacity_rps"])
        await configure_pool(http, stack.fencepost_url, stack.admin_key, "sim-calibrate",
                             limit=args.concurrency)
        url = f"{stack.upstream_base}/work"
        for name, workers in (("direct", args.concurrency), ("perfect_pool", args.workers)):
            await upstream_admin(http, stack.upstream_base, "reset")
            clients = make_clients(workers)
            try:
                job = (direct_job(clients, url, seed=args.seed) if name == "direct" else
                       pool_job(clients, stack.fencepost_url, stack.admin_key, "sim-calibrate",
                                url, seed=args.seed))
                start = time.monotonic()
                records = await run_workers(job, workers=workers, duration_s=args.calibrate_s)
                elapsed = time.monotonic() - start
            finally:
                await close_clients(clients)
            rate = sum(1 for r in records if r.ok) / elapsed
            out[name] = {"workers": workers, "seconds": round(elapsed, 2),
                         "goodput_rps": round(rate, 2), "capacity_rps": capacity,
                         "share_of_capacity": round(rate / capacity, 4),
                         "throttled": sum(r.throttled for r in records)}
        return out
    finally:
        await http.aclose()


# --- analysis ---------------------------------------------------------------------------------


def _count(calls: list[tuple[float, int]], lo: float, hi: float) -> tuple[int, int, int]:
    """(200s, 429s, all answers) with lo <= t < hi."""
    good = thr = total = 0
    for t, status in calls:
        if lo <= t < hi:
            total += 1
            if status == 200:
                good += 1
            elif status == 429:
                thr += 1
    return good, thr, total


def _bins(calls: list[tuple[float, int]], length: float, width: float) -> tuple[
        list[int], list[int], list[int]]:
    n = int(math.ceil(length / width - 1e-9))
    good, thr, total = [0] * n, [0] * n, [0] * n
    for t, status in calls:
        i = int(t / width)
        if 0 <= i < n and t < length:
            total[i] += 1
            good[i] += status == 200
            thr[i] += status == 429
    return good, thr, total


def settle_time(phase: Phase, bins: tuple[list[int], list[int], list[int]],
                reachable: float = 1.0) -> float | None:
    """Seconds from the phase's start to the first instant from which every WINDOW_S
    window inside the phase has goodput >= GOODPUT_OK * capacity * `reachable` and
    <= THROTTLED_OK of its calls throttled; None when even the last window fails.
    `reachable` < 1 judges goodput against what the harness can reach at best (the
    ceiling measured by calibrate) instead of the true capacity."""
    good, thr, total = bins
    per = int(round(WINDOW_S / BIN_S))
    first = int(round(phase.start / BIN_S))
    last = int(round(phase.end / BIN_S)) - per  # the last window's first bin
    need = GOODPUT_OK * phase.capacity_rps * reachable * WINDOW_S
    settled_from: int | None = None
    for s in range(last, first - 1, -1):
        g, th, n = sum(good[s:s + per]), sum(thr[s:s + per]), sum(total[s:s + per])
        if g >= need and (n == 0 or th / n <= THROTTLED_OK):
            settled_from = s
        else:
            break
    return None if settled_from is None else (settled_from - first) * BIN_S


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def analyse(run: Run, ceiling: float | None = None) -> dict[str, Any]:
    """`ceiling`: the share of capacity the harness reaches for this kind of strategy with
    perfect knowledge (calibrate), to tell the control law's losses from the harness's."""
    length = run.phases[-1].end
    bins = _bins(run.calls, length, BIN_S)
    phases: list[dict[str, Any]] = []
    sum_good = sum_thr = sum_calls = 0
    sum_capacity = 0.0
    after_thr = after_calls = 0
    for phase in run.phases:
        lo, hi = phase.measured_from, phase.end
        good, thr, total = _count(run.calls, lo, hi)
        capacity_calls = phase.capacity_rps * (hi - lo)
        settle = settle_time(phase, bins)
        settle_rel = settle_time(phase, bins, min(1.0, ceiling or 1.0))
        # "After settling": from the settle point (the earlier of the two: the controller
        # has converged), or, when the phase never settled, from SETTLE_TARGET_S after its
        # start (judged on what it did after the target).
        known = [t for t in (settle, settle_rel) if t is not None]
        since = phase.start + (min(known) if known else SETTLE_TARGET_S)
        since = max(since, phase.measured_from)
        _, a_thr, a_total = _count(run.calls, since, hi)
        after_thr += a_thr
        after_calls += a_total
        latencies = [end - start for start, end, status, *_ in run.jobs
                     if lo <= end < hi and 200 <= status < 300]
        phases.append({
            "name": phase.name, "start_s": phase.start, "end_s": phase.end,
            "measured_from_s": lo, "concurrency": phase.concurrency, "rpm": phase.rpm,
            "capacity_rps": phase.capacity_rps, "served": good, "throttled": thr,
            "calls": total, "goodput_rps": good / (hi - lo),
            "goodput_share": good / capacity_calls if capacity_calls else None,
            "throttled_share": thr / total if total else 0.0,
            "settle_s": settle,
            "settle_vs_ceiling_s": settle_rel,
            "p99_latency_s": _percentile(latencies, 0.99),
        })
        sum_good += good
        sum_thr += thr
        sum_calls += total
        sum_capacity += capacity_calls
    start = run.phases[0].measured_from
    jobs = [j for j in run.jobs if start <= j[1] < length]
    # Latency of the jobs that succeeded: a job given up (strategy 1 after its 8 calls)
    # is not done, and counting its quick failure would flatter the strategy.
    latencies = [end - begin for begin, end, status, *_ in jobs if 200 <= status < 300]
    return {
        "strategy": run.number, "key": run.key, "label": run.label,
        "goodput_share": sum_good / sum_capacity if sum_capacity else None,
        "ceiling_share": ceiling,
        "goodput_of_ceiling": (sum_good / sum_capacity / ceiling
                               if sum_capacity and ceiling else None),
        "throttled_share": sum_thr / sum_calls if sum_calls else 0.0,
        "throttled_share_settled": after_thr / after_calls if after_calls else 0.0,
        "calls": sum_calls, "served": sum_good, "throttled": sum_thr,
        "jobs": len(jobs), "jobs_failed": sum(1 for j in jobs if not 200 <= j[2] < 300),
        "p50_latency_s": _percentile(latencies, 0.50),
        "p99_latency_s": _percentile(latencies, 0.99),
        "settle_cold_s": phases[0]["settle_s"],
        "settle_halved_s": phases[1]["settle_s"],
        "settle_restored_s": phases[2]["settle_s"],
        "settle_halved_vs_ceiling_s": phases[1]["settle_vs_ceiling_s"],
        "settle_restored_vs_ceiling_s": phases[2]["settle_vs_ceiling_s"],
        "phases": phases,
        "cpu_share_of_core": {k: round(v, 3) for k, v in run.cpu.items()},
        "upstream_max_in_flight": run.upstream.get("max_in_flight"),
    }


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets for the adaptive pool (strategy 3)."""
    by = {r["strategy"]: r for r in results}
    a = by.get(3)
    if a is None:
        return []
    checks = [
        ("goodput >= 90 % of capacity (whole measured run)",
         a["goodput_share"] is not None and a["goodput_share"] >= GOODPUT_OK,
         f"{_pct(a['goodput_share'])}"),
        ("<= 5 % of calls throttled after settling",
         a["throttled_share_settled"] <= THROTTLED_OK, _pct(a["throttled_share_settled"])),
        ("settles within 10 s after halving",
         a["settle_halved_s"] is not None and a["settle_halved_s"] <= SETTLE_TARGET_S,
         _secs(a["settle_halved_s"])),
        ("settles within 10 s after restoring",
         a["settle_restored_s"] is not None and a["settle_restored_s"] <= SETTLE_TARGET_S,
         _secs(a["settle_restored_s"])),
    ]
    others = [by[n] for n in (1, 2) if n in by]
    if others:
        better = all(a["throttled_share"] < o["throttled_share"] for o in others)
        checks.append(("throttled share below strategies 1 and 2", better,
                       " vs ".join(_pct(r["throttled_share"]) for r in [a, *others])))
    return [{"target": t, "met": bool(m), "measured": v} for t, m, v in checks]


# --- report -----------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _secs(x: float | None) -> str:
    return "not settled" if x is None else f"{x:.2f} s"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.0f} ms"


HEADERS = ["strategy", "goodput", "steady", "halved", "restored", "of ceiling", "429 share",
           "429 after settling", "p99 job (ok)", "settle after halving", "settle after restoring",
           "failed jobs"]


def table_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        p = r["phases"]
        rows.append([
            r["label"], _pct(r["goodput_share"]), _pct(p[0]["goodput_share"]),
            _pct(p[1]["goodput_share"]), _pct(p[2]["goodput_share"]),
            _pct(r["goodput_of_ceiling"]), _pct(r["throttled_share"]),
            _pct(r["throttled_share_settled"]),
            _ms(r["p99_latency_s"]),
            f"{_secs(r['settle_halved_s'])} ({_secs(r['settle_halved_vs_ceiling_s'])})",
            f"{_secs(r['settle_restored_s'])} ({_secs(r['settle_restored_vs_ceiling_s'])})",
            f"{r['jobs_failed']}/{r['jobs']}",
        ])
    return rows


def text_table(results: list[dict[str, Any]]) -> str:
    rows = [HEADERS, *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(results: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    return "\n".join(lines)


def calibration_line(cal: dict[str, Any]) -> str:
    d, p = cal["direct"], cal["perfect_pool"]
    return (f"Harness check (no throttling): {d['workers']} direct workers get "
            f"{d['goodput_rps']:.1f} calls/s = {_pct(d['share_of_capacity'])} of capacity; "
            f"{p['workers']} workers through a pool whose fixed limit is the true "
            f"concurrency get {p['goodput_rps']:.1f} calls/s = "
            f"{_pct(p['share_of_capacity'])} (the ceiling for strategies 2 and 3: a slot is "
            f"held for the release and the next admission too).")


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    cal = report["calibration"]
    out = [
        f"# Adaptive admission simulation, {report['started_at']}",
        "",
        f"{cfg['workers']} workers per strategy; upstream concurrency {cfg['concurrency']} "
        f"(halved to {max(1, cfg['concurrency'] // 2)}, then restored), service "
        f"{cfg['service_ms']:g} ± {cfg['jitter_ms']:g} ms, rpm {cfg['rpm']} (does not bind); "
        f"phases: {cfg['warmup_s']:g} s warm-up + {cfg['steady_s']:g} s steady, "
        f"{cfg['halved_s']:g} s halved, {cfg['restored_s']:g} s restored"
        f"{' (--quick)' if cfg['quick'] else ''}. Fixed pool limit {cfg['fixed_limit']}; "
        f"adaptive pool limit {cfg['adaptive_limit']}, min_limit 1. Server: "
        f"{report['server']}.",
        "",
        markdown_table(report["results"]),
        "",
        "Goodput = upstream 200s as a share of the true capacity (concurrency × 1000 / "
        "service_ms) over each phase, the warm-up excluded; 'of ceiling' = goodput as a "
        "share of what the harness check below reached with perfect knowledge (direct "
        "workers for 1, a pool limited to the true concurrency for 2 and 3). Settled = "
        "the first instant after the change from which every 3 s window to the end of the "
        "phase has goodput ≥ 90 % of capacity and ≤ 5 % of calls answered 429 (0.25 s "
        "steps); in parentheses, the same with goodput ≥ 90 % of the ceiling. '429 after "
        "settling' counts each phase (the first from the first call) from the earlier "
        "settle point, or from 10 s after the change when it never settled. p99 job (ok): "
        "from a job's first attempt to its success, over the jobs that succeeded (a job "
        "gives up after 8 upstream calls: 'failed jobs').",
        "",
        calibration_line(cal),
        "",
        "CPU (share of one core) during each strategy: " + "; ".join(
            f"{r['label']}: " + ", ".join(f"{k} {100 * v:.0f} %"
                                          for k, v in r["cpu_share_of_core"].items())
            for r in report["results"]) + f" (of {report['machine']['cpus']} cores).",
        "",
    ]
    if report["targets"]:
        out += ["Targets for the adaptive pool (issue 6):", ""]
        out += [f"- {'met' if t['met'] else 'MISSED'}: {t['target']} ({t['measured']})"
                for t in report["targets"]]
        out.append("")
    out.append("Chart: `bench/results/adaptive-latest.png`.")
    return "\n".join(out) + "\n"


STRATEGY_COLOURS = {1: "#7a7a7a", 2: "#8e44ad", 3: "#1f5fa8"}


def chart(runs: list[Run], path: Path) -> None:
    """One panel per strategy (goodput per second against the true capacity; for the
    pools, the effective limit on a second axis), and one panel of the share of calls
    answered 429 per second, all strategies together."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(runs) + 1
    fig, axes = plt.subplots(rows, 1, figsize=(11, 2.5 * rows + 1.0), sharex=True,
                             squeeze=False, gridspec_kw={"hspace": 0.28})
    length = max(run.phases[-1].end for run in runs)
    legend: dict[str, Any] = {}
    for ax, run in zip(axes[:len(runs), 0], runs, strict=True):
        good, _, _ = _bins(run.calls, run.phases[-1].end, 1.0)
        xs = [i + 0.5 for i in range(len(good))]
        cap_x: list[float] = []
        cap_y: list[float] = []
        conc_y: list[int] = []
        for phase in run.phases:
            cap_x += [phase.start, phase.end]
            cap_y += [phase.capacity_rps, phase.capacity_rps]
            conc_y += [phase.concurrency, phase.concurrency]
        ax.plot(cap_x, cap_y, color="black", ls="--", lw=1.2, label="true capacity")
        ax.plot(cap_x, [GOODPUT_OK * c for c in cap_y], color="grey", ls=":", lw=1,
                label="90 % of capacity")
        ax.plot(xs, good, color=STRATEGY_COLOURS.get(run.number, "#1f5fa8"), lw=1.8,
                marker=".", ms=4, label="goodput (200s per second)")
        for phase in run.phases[1:]:
            ax.axvline(phase.start, color="grey", lw=0.8, alpha=0.6)
        if run.phases[0].measured_from > 0:
            ax.axvspan(0, run.phases[0].measured_from, color="grey", alpha=0.08)
        ax.set_ylim(0, max(max(good, default=0), max(cap_y)) * 1.2)
        ax.set_ylabel("calls / s")
        ax.set_title(run.label, loc="left", fontsize=10)
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label if "goodput" not in label else "goodput (200s per second)",
                              handle)
        if run.limits:
            ax2 = ax.twinx()
            ts = [t for t, *_ in run.limits if t <= length]
            limits = [lim for t, lim, *_ in run.limits if t <= length]
            ax2.step(ts, limits, where="post", color="#d07000", lw=1.4,
                     label="pool's effective limit (right axis)")
            ax2.plot(cap_x, conc_y, color="#d07000", ls=":", lw=1.2,
                     label="upstream's hidden concurrency (right axis)")
            top = max(conc_y) * 2 + 2
            ax2.set_ylim(0, top)
            ax2.set_ylabel("slots", color="#d07000")
            if max(limits, default=0) > top:
                ax2.annotate(f"starts at {max(limits)}", xy=(ts[0], top), xytext=(4, -12),
                             textcoords="offset points", fontsize=7, color="#d07000")
            for handle, label in zip(*ax2.get_legend_handles_labels(), strict=True):
                legend.setdefault(label, handle)
    share_ax = axes[-1, 0]
    for run in runs:
        _, thr, total = _bins(run.calls, run.phases[-1].end, 1.0)
        xs = [i + 0.5 for i in range(len(thr))]
        share_ax.plot(xs, [100.0 * t / n if n else 0.0 for t, n in zip(thr, total, strict=True)],
                      color=STRATEGY_COLOURS.get(run.number, "black"), lw=1.4, marker=".",
                      ms=4, label=run.label)
    share_ax.axhline(100 * THROTTLED_OK, color="red", ls=":", lw=1, label="5 %")
    for phase in runs[0].phases[1:]:
        share_ax.axvline(phase.start, color="grey", lw=0.8, alpha=0.6)
    share_ax.set_ylim(0, 100)
    share_ax.set_ylabel("% of calls\nanswered 429")
    share_ax.set_title("throttled share per second", loc="left", fontsize=10)
    share_ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=7, ncol=len(runs) + 1,
                    frameon=False)
    share_ax.set_xlim(0, length)
    share_ax.set_xlabel("seconds (warm-up shaded; the upstream's concurrency is halved and "
                        "restored at the vertical lines)")
    fig.legend(list(legend.values()), list(legend.keys()), loc="upper center", ncol=3,
               fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.965))
    fig.suptitle("fencepost adaptive admission: goodput against the upstream's hidden capacity",
                 fontsize=11, y=0.995)
    fig.subplots_adjust(top=0.9, bottom=0.06, left=0.08, right=0.92)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- main -------------------------------------------------------------------------------------


async def simulate(args: argparse.Namespace, stack: Stack) -> tuple[dict[str, Any], list[Run]]:
    started = dt.datetime.now(dt.UTC)
    calibration = await calibrate(args, stack)
    print(calibration_line(calibration), flush=True)
    runs: list[Run] = []
    for number in args.only:
        print(f"running {STRATEGIES[number][1]} ({args.phase_total:g} s) ...", flush=True)
        run = await run_strategy(number, args, stack)
        runs.append(run)
    results = [analyse(run, calibration["direct" if run.key == "direct" else "perfect_pool"]
                       ["share_of_capacity"]) for run in runs]
    report = {
        "started_at": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "config": {k: getattr(args, k) for k in (
            "workers", "concurrency", "service_ms", "jitter_ms", "rpm", "warmup_s", "steady_s",
            "halved_s", "restored_s", "fixed_limit", "adaptive_limit", "seed", "quick",
            "server_src")},
        "definitions": {
            "goodput_share": "upstream 200s / (capacity_rps x seconds), per phase after warm-up",
            "settled": f"first instant from which every {WINDOW_S:g} s window to the end of "
                       f"the phase has goodput >= {GOODPUT_OK:.0%} of capacity and <= "
                       f"{THROTTLED_OK:.0%} of calls answered 429 ({BIN_S:g} s steps)",
            "settled_vs_ceiling": "the same with goodput >= "
                                  f"{GOODPUT_OK:.0%} of capacity x the harness ceiling "
                                  "(calibration share_of_capacity)",
            "throttled_share_settled": "429s / calls from each phase's earlier settle point "
                                       f"(or {SETTLE_TARGET_S:g} s after its start if it "
                                       "never settled) to its end",
        },
        "machine": {"cpus": os.cpu_count(), "load_before": _load()},
        "server": _server_source(args),
        "calibration": calibration,
        "results": results,
        "targets": targets(results),
        "series": [{
            "strategy": run.number, "phases": [asdict(p) for p in run.phases],
            "per_second": dict(zip(("served", "throttled", "calls"),
                                   _bins(run.calls, run.phases[-1].end, 1.0), strict=True)),
            f"per_{BIN_S:g}_s": dict(zip(("served", "throttled", "calls"),
                                        _bins(run.calls, run.phases[-1].end, BIN_S),
                                        strict=True)),
            "effective_limit": [[round(t, 3), lim, used, queued]
                                for t, lim, used, queued in run.limits],
            "learned_limit": [[round(t, 3), round(v, 3)] for t, v in run.learned],
        } for run in runs],
    }
    return report, runs


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _server_source(args: argparse.Namespace) -> str:
    """Which fencepost ran: this tree's commit (and whether its src/ had changes), or
    the folder given by --server-src."""
    if args.server_src:
        return f"--server-src {args.server_src}"

    def git(*cmd: str) -> str:
        try:
            done = subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10, check=False)
        except OSError:
            return ""
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "src")
    return f"commit {head}" + (" with uncommitted changes in src/" if dirty else "")


def write_results(report: dict[str, Any], runs: list[Run], results_dir: Path) -> list[Path]:
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = report["started_at"].replace(":", "").replace("-", "")
    base = results_dir / f"adaptive-{stamp}"
    json_path = base.with_suffix(".json")
    md_path = base.with_suffix(".md")
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    md_path.write_text(markdown(report))
    latest = results_dir / "adaptive-latest.md"
    shutil.copyfile(md_path, latest)
    written = [json_path, md_path, latest]
    png = results_dir / "adaptive-latest.png"
    try:
        chart(runs, png)
        written.append(png)
    except ImportError:
        print("matplotlib is missing (pip install -e '.[bench]'): no chart", file=sys.stderr)
    return written


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="short phases (under a minute in all) for a smoke test")
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--only", default="1,2,3", help="strategies to run, e.g. 3 or 1,3")
    parser.add_argument("--concurrency", type=int, default=8, help="upstream's hidden cap")
    parser.add_argument("--service-ms", type=float, default=200.0,
                        help="upstream's mean service time (default 200: see the README)")
    parser.add_argument("--jitter-ms", type=float, default=20.0)
    parser.add_argument("--rpm", type=int, default=12_000,
                        help="upstream's hidden rpm (default high enough not to bind)")
    parser.add_argument("--fixed-limit", type=int, default=16,
                        help="strategy 2's pool limit (too high: twice the hidden cap)")
    parser.add_argument("--adaptive-limit", type=int, default=50,
                        help="strategy 3's configured (upper) limit")
    parser.add_argument("--phase-s", default=None,
                        help="warm-up,steady,halved,restored seconds (default 5,15,20,20; "
                             "--quick 1,3,4,4)")
    parser.add_argument("--calibrate-s", type=float, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results-dir", default=str(BENCH / "results"))
    parser.add_argument("--server-src", default=None,
                        help="run `fencepost serve` from this source folder (one holding the "
                             "fencepost package, e.g. a copy's src/): A/B tests of the server")
    args = parser.parse_args(argv)
    phases = args.phase_s or ("1,3,4,4" if args.quick else "5,15,20,20")
    try:
        args.warmup_s, args.steady_s, args.halved_s, args.restored_s = (
            float(x) for x in phases.split(","))
        args.only = [int(x) for x in args.only.split(",") if x.strip()]
    except ValueError:
        parser.error("--phase-s takes four numbers, --only numbers from 1..3")
    if not args.only or any(n not in STRATEGIES for n in args.only):
        parser.error("--only takes numbers from 1..3")
    if min(args.steady_s, args.halved_s, args.restored_s) < WINDOW_S or args.warmup_s < 0:
        parser.error(f"each measured phase must last at least {WINDOW_S:g} s")
    if args.workers < 1 or args.workers > 500 or args.concurrency < 2:
        parser.error("--workers 1..500, --concurrency >= 2")
    if args.calibrate_s is None:
        args.calibrate_s = 1.0 if args.quick else 4.0
    args.phase_total = args.warmup_s + args.steady_s + args.halved_s + args.restored_s
    return args


def _run_loop(coro: Any) -> Any:
    """uvloop when it is there (it comes with uvicorn[standard]): a cheaper client loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A SIGTERM unwinds like Ctrl-C, so that the upstream and the server are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(BENCH))
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fencepost-adaptive-") as tmp:
        stack = Stack(args, Path(tmp))
        try:
            report, runs = _run_loop(simulate(args, stack))
        finally:
            stack.stop()
    print()
    print(text_table(report["results"]))
    print()
    for r in report["results"]:
        print(f"{r['label']}: CPU " + ", ".join(
            f"{k} {100 * v:.0f} %" for k, v in r["cpu_share_of_core"].items())
            + f"; upstream max in flight {r['upstream_max_in_flight']}")
    if report["targets"]:
        print("\ntargets for the adaptive pool:")
        for t in report["targets"]:
            print(f"  {'met   ' if t['met'] else 'MISSED'} {t['target']}: {t['measured']}")
    written = write_results(report, runs, Path(args.results_dir))
    print("\nwrote " + ", ".join(str(p) for p in written))
    print(f"({time.monotonic() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    _reexec_in_venv()
    sys.exit(main())
