"""The adaptive-admission benchmark against a family of upstreams (providers.py):
for each kind of limit real providers use, three ways for 50 workers to share
the upstream, side by side, on a freshly reset upstream each:

    direct     calls with exponential backoff and full jitter, honouring Retry-After
    fixed      a fencepost pool with a fixed limit (16) plus that client backoff
    adaptive   a fencepost pool with `adaptive: true` (limit 50), no client backoff

and, for the upstreams with a concurrency cap, a reference that is not a
strategy: `told`, a pool configured with the upstream's true limits (changed
with PATCH when they change) plus the client backoff. It shows what the
harness reaches through any pool: a slot is held a little longer than the
upstream call (the release, then the next admission, are round trips to
fencepost), so a pool at the true cap leaves the upstream idle that long.

    .venv/bin/python bench/adaptive/family.py [--quick] [--only KIND,KIND] [--strategies ...]

Windows are scaled down in time so that a run fits in minutes: a "minute" of
6 s for the fixed window, an "hour" of 12 s for GitHub's hourly window; the
continuous budgets keep real minutes (their rate is what matters). Every
upstream call's time and status is recorded, and each pool's state every
250 ms. Reported per upstream and strategy, after settling (from each phase's
start plus one window for rate limits, 10 s for concurrency; the issue's
settling targets): goodput as a share of the upstream's true capacity and the
share of calls throttled; over the whole run: the throttled share; and the
settling time (the first instant from which every 3 s window of the phase has
goodput >= 90 % of capacity and <= 5 % throttled).

Writes bench/results/adaptive-family-<timestamp>.json and .md,
adaptive-family-latest.md, and one chart per upstream
(adaptive-family-<kind>.png: goodput, throttles, effective limit over time).
Loopback only; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import platform
import secrets
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(BENCH))

from providers import KINDS  # noqa: E402

WORKERS = 50
FIXED_LIMIT = 16
ADAPTIVE_LIMIT = 50
POLL_S = 0.25
ROLLING_S = 3.0
GOODPUT_OK = 0.90
THROTTLED_OK = 0.05
STRATEGIES = ("direct", "fixed", "adaptive", "told")


@dataclass(frozen=True)
class Plan:
    """One upstream's run: how long, when its limits change, how long it may settle."""

    kind: str
    title: str
    duration_s: float
    settle_s: float  # measured from each phase's start plus this
    changes: tuple[tuple[float, dict[str, int]], ...] = ()


PLANS = (
    Plan("continuous", "per-minute budget refilling continuously (OpenAI headers, "
         "whole-second Retry-After)", 30, 6),
    Plan("fixed-window", "fixed one-minute window, a minute of 6 s (IETF ratelimit, w=6)", 36, 6),
    Plan("concurrency-cap", "cap of 8 calls in progress (429, Retry-After: 1, no rate "
         "headers)", 30, 10),
    Plan("budget-and-cap", "budget 20/s and cap 8, then budget 60/s: the cap binds "
         "(OpenAI headers)", 40, 10, ((20.0, {"quota": 3600}),)),
    Plan("hourly-github", "hourly window in GitHub's dialect, an hour of 12 s", 36, 12),
    Plan("halving", "cap of 8 halved to 4, then restored (Anthropic headers)", 60, 10,
         ((20.0, {"concurrency": 4}), (40.0, {"concurrency": 8}))),
    Plan("slowdown", "never 429s; past 8 in progress every call gets slower", 30, 10),
)


def told_config(limits: dict[str, Any]) -> dict[str, Any]:
    """The pool configuration that knows an upstream's true limits."""
    config: dict[str, Any] = {"limit": limits.get("concurrency") or ADAPTIVE_LIMIT}
    if limits.get("quota"):
        config["rpm"] = round(limits["quota"] * 60 / limits["window_s"])
    return config


@dataclass
class Run:
    kind: str
    strategy: str
    phases: list[tuple[float, float, float]] = field(default_factory=list)  # start, end, cap
    calls: list[tuple[float, int]] = field(default_factory=list)
    samples: list[tuple[float, int, int | None, bool]] = field(
        default_factory=list)  # (t, effective_limit, effective_rpm, paused)
    jobs: list[tuple[float, float, int]] = field(default_factory=list)  # start, end, status


class Stack:
    """One fencepost server for the whole family, one upstream process per kind."""

    def __init__(self, workdir: Path) -> None:
        from fpbench import procs

        self.procs = procs
        self.workdir = workdir
        self.admin_key = "fpsim_" + secrets.token_urlsafe(33)
        port = procs.free_port()
        self.fencepost_url = f"http://127.0.0.1:{port}"
        self.log = workdir / "fencepost.log"
        self.fencepost = procs.start(
            [sys.executable, "-m", "fencepost", "serve",
             "--store", f"sqlite:///{workdir / 'fencepost.db'}", "--host", "127.0.0.1",
             "--port", str(port), "--access-log", str(workdir / "access.log")],
            self.log, env={"FENCEPOST_BOOTSTRAP_KEY": self.admin_key}, cwd=workdir)
        procs.wait_port(port, self.fencepost)

    def upstream(self, kind: str, seed: int) -> tuple[Any, str]:
        port = self.procs.free_port()
        proc = self.procs.start(
            [sys.executable, str(HERE / "providers.py"), "--kind", kind, "--port", str(port),
             "--seed", str(seed)], self.workdir / f"upstream-{kind}.log")
        self.procs.wait_port(port, proc)
        return proc, f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.procs.stop(self.fencepost)


def admin_client() -> Any:
    import httpx

    return httpx.AsyncClient(limits=httpx.Limits(max_connections=4, max_keepalive_connections=0),
                             timeout=httpx.Timeout(30.0), trust_env=False)


async def run_one(plan: Plan, strategy: str, stack: Stack, upstream: str, scale: float,
                  seed: int) -> Run:
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

    http = admin_client()
    clients = make_clients(WORKERS)
    run = Run(plan.kind, strategy)
    try:
        base = asdict(KINDS[plan.kind])  # as the kind starts, whatever the last run changed
        await upstream_admin(http, upstream, "limits",
                             {k: base[k] for k in ("concurrency", "quota") if base[k]})
        await upstream_admin(http, upstream, "reset")
        pool = f"family-{plan.kind}-{strategy}-{secrets.token_hex(3)}"
        url = f"{upstream}/work"
        if strategy == "direct":
            job = direct_job(clients, url, seed=seed)
        elif strategy == "told":
            await configure_pool(http, stack.fencepost_url, stack.admin_key, pool,
                                 **told_config(base))
            job = pool_job(clients, stack.fencepost_url, stack.admin_key, pool, url, seed=seed)
        else:
            adaptive = strategy == "adaptive"
            await configure_pool(http, stack.fencepost_url, stack.admin_key, pool,
                                 limit=ADAPTIVE_LIMIT if adaptive else FIXED_LIMIT,
                                 adaptive=adaptive, min_limit=1 if adaptive else None)
            job = pool_job(clients, stack.fencepost_url, stack.admin_key, pool, url,
                           client_backoff=not adaptive, seed=seed)
        duration = plan.duration_s * scale
        changes = [(t * scale, limits) for t, limits in plan.changes]
        t0 = time.monotonic()

        async def record(response: httpx.Response) -> None:
            if response.request.url.path == "/work":
                run.calls.append((time.monotonic() - t0, response.status_code))

        for client in clients:
            client.event_hooks = {"request": [], "response": [record]}
        stop = asyncio.Event()
        capacity = float((await upstream_admin(http, upstream, "stats"))["capacity_rps"])
        starts = [0.0] + [t for t, _ in changes]
        ends = [t for t, _ in changes] + [duration]
        caps = [capacity]

        async def change_limits() -> None:
            for at, limits in changes:
                await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
                stats = await upstream_admin(http, upstream, "limits", limits)
                caps.append(float(stats["capacity_rps"]))
                if strategy == "told":  # told of the change at once, with PATCH
                    response = await http.patch(
                        f"{stack.fencepost_url}/v1/pools/{pool}",
                        json=told_config(stats["limits"]),
                        headers={"Authorization": f"Bearer {stack.admin_key}"})
                    response.raise_for_status()

        async def poll() -> None:
            if strategy == "direct":
                return
            for _ in range(int(duration / POLL_S) + 20):  # bounded
                if stop.is_set():
                    return
                try:
                    state = await pool_state(http, stack.fencepost_url, stack.admin_key, pool)
                except httpx.HTTPError:
                    state = None
                if state is not None:
                    learned = state.get("learned") or {}
                    run.samples.append((time.monotonic() - t0, int(state["effective_limit"]),
                                        state.get("effective_rpm"),
                                        learned.get("paused_until_at") is not None))
                await asyncio.sleep(POLL_S)

        poller = asyncio.create_task(poll())
        changer = asyncio.create_task(change_limits())
        records = await run_workers(job, workers=WORKERS, duration_s=duration, stop=stop)
        stop.set()
        await changer
        await poller
        run.phases = list(zip(starts, ends, caps, strict=True))
        run.jobs = [(r.start - t0, r.end - t0, r.status) for r in records]
        return run
    finally:
        await http.aclose()
        await close_clients(clients)


# --- analysis ----------------------------------------------------------------------------------


def _count(calls: list[tuple[float, int]], lo: float, hi: float) -> tuple[int, int, int]:
    good = thr = total = 0
    for t, status in calls:
        if lo <= t < hi:
            total += 1
            good += status == 200
            thr += status == 429
    return good, thr, total


def settle_time(run: Run, start: float, end: float, capacity: float) -> float | None:
    """Seconds from `start` until every ROLLING_S window up to `end` meets the targets."""
    step = 0.25
    settled: float | None = None
    t = end - ROLLING_S
    while t >= start - 1e-9:
        good, thr, total = _count(run.calls, t, t + ROLLING_S)
        if good >= GOODPUT_OK * capacity * ROLLING_S and (not total or thr / total <= THROTTLED_OK):
            settled = t - start
        else:
            break
        t -= step
    return settled


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def analyse(run: Run, plan: Plan, scale: float) -> dict[str, Any]:
    good = thr = total = 0
    capacity_calls = 0.0
    settles = []
    allowance = plan.settle_s * scale
    for start, end, capacity in run.phases:
        lo = min(end, start + allowance)
        g, th, n = _count(run.calls, lo, end)
        good, thr, total = good + g, thr + th, total + n
        capacity_calls += capacity * (end - lo)
        settles.append(settle_time(run, start, end, capacity))
    _, all_thr, all_total = _count(run.calls, 0.0, run.phases[-1][1])
    latencies = [e - s for s, e, status in run.jobs if 200 <= status < 300]
    return {
        "kind": run.kind, "strategy": run.strategy,
        "goodput_share": good / capacity_calls if capacity_calls else None,
        "throttled_share": thr / total if total else 0.0,
        "throttled_share_whole_run": all_thr / all_total if all_total else 0.0,
        "served": good, "calls": total, "throttled": thr,
        "settle_s": settles,
        "p50_latency_s": _percentile(latencies, 0.5),
        "p99_latency_s": _percentile(latencies, 0.99),
    }


def verdict(rows: list[dict[str, Any]]) -> str:
    """The issue's targets for the adaptive pool against this upstream."""
    by = {r["strategy"]: r for r in rows}
    a = by.get("adaptive")
    if a is None or a["goodput_share"] is None:
        return "-"
    misses = []
    if a["goodput_share"] < GOODPUT_OK:
        misses.append("goodput < 90 %")
    if a["throttled_share"] > THROTTLED_OK:
        misses.append("throttled > 5 %")
    for name in ("direct", "fixed"):  # the baselines; `told` is a reference
        b = by.get(name)
        if b is None:
            continue
        if a["throttled_share"] > b["throttled_share"] and a["throttled_share"] > 0:
            misses.append(f"throttled >= {name}")
        if b["goodput_share"] is not None and a["goodput_share"] < b["goodput_share"] - 0.01:
            misses.append(f"goodput < {name}")
    return "met" if not misses else "missed: " + ", ".join(misses)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _settle(values: list[float | None]) -> str:
    return " / ".join("never" if v is None else f"{v:.1f}" for v in values)


def markdown_table(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| upstream | strategy | goodput (share of capacity) | throttled | throttled, whole run "
        "| settled after (s, per phase) | p50 job latency |",
        "|---|---|---|---|---|---|---|",
    ]
    for plan in PLANS:
        rows = results.get(plan.kind)
        if not rows:
            continue
        for r in rows:
            p50 = r["p50_latency_s"]
            lines.append(
                f"| {plan.kind} | {r['strategy']} | {_pct(r['goodput_share'])} | "
                f"{_pct(r['throttled_share'])} | {_pct(r['throttled_share_whole_run'])} | "
                f"{_settle(r['settle_s'])} | {'-' if p50 is None else f'{p50:.2f} s'} |")
    return "\n".join(lines)


def compact_table(results: dict[str, list[dict[str, Any]]]) -> str:
    """One row per upstream: goodput / throttled after settling, per strategy."""
    names = {"adaptive": "adaptive pool", "fixed": "fixed pool + backoff",
             "direct": "direct + backoff", "told": "pool told the limits"}
    lines = ["| upstream | " + " | ".join(names.values())
             + " | adaptive pool: settled after (s, per phase) | adaptive pool: targets |",
             "|---|---|---|---|---|---|---|"]
    for plan in PLANS:
        rows = {r["strategy"]: r for r in results.get(plan.kind, [])}
        if not rows:
            continue
        cells = [f"{_pct(rows[k]['goodput_share'])}, {_pct(rows[k]['throttled_share'])}"
                 if k in rows else "-" for k in names]
        met = verdict(list(rows.values()))
        settled = _settle(rows["adaptive"]["settle_s"]) if "adaptive" in rows else "-"
        lines.append(f"| {plan.kind} | " + " | ".join(cells) + f" | {settled} | {met} |")
    return "\n".join(lines)


README_START = "<!-- adaptive-family:start -->"
README_END = "<!-- adaptive-family:end -->"


def update_readme(report: dict[str, Any], path: Path) -> None:
    """Replace the docs' family table (between the markers) with this run's."""
    text = path.read_text()
    start, end = text.index(README_START), text.index(README_END)
    block = "\n".join([
        README_START, "",
        f"Measured {report['when']} on {report['machine']} (load average "
        f"{report['load_before'][0]} before the run, {report['load_after'][0]} after); "
        "each cell: goodput as a share of the upstream's true capacity, then the share of "
        "upstream calls throttled, both after settling (from each phase's start plus one "
        "window for rates, 10 s for concurrency). Settled after: the first instant from "
        "which every 3 s window of the phase has >= 90 % of capacity and <= 5 % throttled "
        "(never: some window fell short).", "",
        compact_table(report["results"]), "",
    ])
    path.write_text(text[:start] + block + text[end:])


def verdicts(results: dict[str, list[dict[str, Any]]]) -> str:
    return "\n".join(f"- {plan.kind} ({plan.title}): {verdict(results[plan.kind])}"
                     for plan in PLANS if plan.kind in results)


# --- charts --------------------------------------------------------------------------------------


COLOURS = {"direct": "tab:red", "fixed": "tab:orange", "adaptive": "tab:blue",
           "told": "tab:gray"}


def chart(plan: Plan, runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_good, ax_thr, ax_lim) = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    ax_rate = ax_lim.twinx()
    for run in runs:
        end = run.phases[-1][1]
        n = int(math.ceil(end))
        good, thr = [0] * n, [0] * n
        for t, status in run.calls:
            i = int(t)
            if 0 <= i < n:
                good[i] += status == 200
                thr[i] += status == 429
        xs = [i + 0.5 for i in range(n)]
        colour = COLOURS[run.strategy]
        ax_good.plot(xs, good, color=colour, label=run.strategy)
        ax_thr.plot(xs, thr, color=colour, label=run.strategy)
        if run.samples:
            ts = [s[0] for s in run.samples]
            ax_lim.step(ts, [s[1] for s in run.samples], where="post", color=colour,
                        label=f"{run.strategy}: effective limit")
            if any(s[2] for s in run.samples):
                ax_rate.step(ts, [(s[2] or 0) / 60 for s in run.samples], where="post",
                             color=colour, linestyle=":", label=f"{run.strategy}: paced rate")
            for t, _, _, paused in run.samples:
                if paused:
                    ax_lim.axvspan(t, t + POLL_S, color=colour, alpha=0.15, linewidth=0)
    first = runs[0]
    for start, end, capacity in first.phases:
        ax_good.hlines(capacity, start, end, colors="black", linestyles="--",
                       label="true capacity" if start == 0 else None)
    ax_good.set_ylabel("goodput (calls/s)")
    ax_thr.set_ylabel("throttled (429/s)")
    ax_lim.set_ylabel("pool: effective limit")
    ax_rate.set_ylabel("pool: paced rate (calls/s, dotted)")
    if ax_rate.lines:
        ax_rate.legend(fontsize=7, loc="center right")
    ax_lim.set_xlabel("seconds (shaded: adaptive pool paused)")
    ax_good.set_title(f"{plan.kind}: {plan.title}", fontsize=10)
    for ax in (ax_good, ax_thr, ax_lim):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# --- main ----------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def family(args: argparse.Namespace, stack: Stack) -> tuple[dict[str, Any], list[Run]]:
    kinds = args.only.split(",") if args.only else [p.kind for p in PLANS]
    chosen = args.strategies.split(",")
    plans = [p for p in PLANS if p.kind in kinds]
    results: dict[str, list[dict[str, Any]]] = {}
    runs: list[Run] = []
    load_before = _load()
    for plan in plans:
        proc, upstream = stack.upstream(plan.kind, args.seed)
        try:
            capped = KINDS[plan.kind].concurrency is not None
            for strategy in [c for c in chosen if c != "told" or capped]:
                run = await run_one(plan, strategy, stack, upstream, args.scale, args.seed)
                runs.append(run)
                row = analyse(run, plan, args.scale)
                results.setdefault(plan.kind, []).append(row)
                print(f"{plan.kind:16} {strategy:9} goodput {_pct(row['goodput_share']):>8}  "
                      f"throttled {_pct(row['throttled_share']):>7}  "
                      f"(whole run {_pct(row['throttled_share_whole_run'])})  "
                      f"settled {_settle(row['settle_s'])}", flush=True)
        finally:
            stack.procs.stop(proc)
    report = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores shown to the VM, "
                   f"Python {platform.python_version()}",
        "load_before": load_before, "load_after": _load(), "scale": args.scale,
        "workers": WORKERS, "fixed_limit": FIXED_LIMIT, "adaptive_limit": ADAPTIVE_LIMIT,
        "results": results,
    }
    return report, runs


def _binned(run: Run) -> dict[str, list[int]]:
    """Upstream answers per 0.25 s (the raw log would be megabytes)."""
    n = int(math.ceil(run.phases[-1][1] / 0.25)) + 1
    ok, throttled, other = [0] * n, [0] * n, [0] * n
    for t, status in run.calls:
        i = min(n - 1, max(0, int(t / 0.25)))
        if status == 200:
            ok[i] += 1
        elif status == 429:
            throttled[i] += 1
        else:
            other[i] += 1
    return {"ok": ok, "throttled": throttled, "other": other}


def write(report: dict[str, Any], runs: list[Run], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    results = report["results"]
    md = "\n".join([
        f"# Adaptive admission against a family of upstreams ({report['when']})", "",
        f"{report['machine']}; load average before {report['load_before']}, after "
        f"{report['load_after']}; time scale {report['scale']}; {report['workers']} workers; "
        f"fixed pool limit {report['fixed_limit']}, adaptive pool limit "
        f"{report['adaptive_limit']}.", "",
        compact_table(results), "", markdown_table(results), "",
        "Targets for the adaptive pool (>= 90 % of capacity, "
        "<= 5 % throttled after settling, fewer throttles than both baselines with at least "
        "their goodput):", "", verdicts(results), "",
    ])
    written = []
    for path in (out / f"adaptive-family-{stamp}.md", out / "adaptive-family-latest.md"):
        path.write_text(md)
        written.append(path)
    data = {**report, "runs": [{"kind": r.kind, "strategy": r.strategy, "phases": r.phases,
                                "per_quarter_second": _binned(r), "samples": r.samples}
                               for r in runs]}
    (out / f"adaptive-family-{stamp}.json").write_text(json.dumps(data))
    written.append(out / f"adaptive-family-{stamp}.json")
    for plan in PLANS:
        mine = [r for r in runs if r.kind == plan.kind]
        if mine:
            path = out / f"adaptive-family-{plan.kind}.png"
            chart(plan, mine, path)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="each run 40 %% as long (for development; numbers are rougher)")
    parser.add_argument("--only", default=None, help="upstream kinds, e.g. fixed-window,halving")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results-dir", default=str(BENCH / "results"))
    parser.add_argument("--update-readme", action="store_true",
                        help="put the table into docs/benchmarks.md (between its markers)")
    args = parser.parse_args(argv)
    args.scale = 0.4 if args.quick else 1.0
    with tempfile.TemporaryDirectory(prefix="fp-family-") as tmp:
        stack = Stack(Path(tmp))
        try:
            report, runs = asyncio.run(family(args, stack))
        finally:
            stack.stop()
    for path in write(report, runs, Path(args.results_dir)):
        print("wrote", path)
    if args.update_readme:
        update_readme(report, ROOT / "docs" / "benchmarks.md")
        print("updated docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
