"""One benchmark run: start each system, run every workload against it, stop it, report."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from fpbench import (
    background,
    handoff,
    loadgen,
    machine,
    profile,
    pylatency,
    report,
    scaling,
    tools,
)
from fpbench.systems import (
    BENCH_KEY,
    DEFAULT_PG_ADMIN_URL,
    Fencepost,
    Redis,
    Skipped,
    System,
    make_systems,
    venv_python,
)

ALL_SYSTEMS = ["fencepost-sqlite", "fencepost-postgresql", "etcd", "redis"]
ALIASES = {
    "sqlite": "fencepost-sqlite", "fencepost-sqlite": "fencepost-sqlite",
    "postgresql": "fencepost-postgresql", "postgres": "fencepost-postgresql",
    "pg": "fencepost-postgresql", "fencepost-postgresql": "fencepost-postgresql",
    "etcd": "etcd", "redis": "redis",
}
WORKLOADS = {
    "a": "acquire+release cycles on fresh random keys",
    "b": "renewals of held leases (one lease per connection)",
    "c": "one hot key contended by every connection (fail-fast)",
    "d": "pool slot acquire+release",
    "e": "(a) while 10,000 connections wait parked in the lines of 100 held locks",
    "f": "(a) with 1,000,000 other locks held",
    "g": "hand-off: a waiter's grant after a release, an expiry, a pool release",
}
# Workload (g) measures times between events, not throughput: its cases have a
# table of their own (fpbench/handoff.py).
HANDOFF = "g"
# What workloads (e) and (f) add to the server while (a) runs.
PARKED_LOCKS, PARKED_WAITERS = 100, 10_000
HELD_LOCKS = 1_000_000
BASELINE = "fencepost-sqlite"
DEFAULT_RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


@dataclass
class Row:
    """One system on one workload: measured, or why not."""

    system: str
    workload: str
    status: str  # "ok", "skipped", "n/a", "failed"
    reason: str = ""
    ops_per_s: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    requests: int = 0
    unexpected: int = 0
    socket_errors: int = 0
    granted: int = 0
    denied: int = 0
    server_cpu_us_per_op: float = 0.0
    client_cpu_us_per_op: float = 0.0
    other_load_pct: float = 0.0
    loader: str = ""
    samples: list[str] = field(default_factory=list)
    round_ops: list[float] = field(default_factory=list)  # ops/s of every round
    # (e) and (f): workload (a) alone on the same server just before their
    # background was added. They are judged against it, not against the
    # (a) row measured minutes earlier: this machine's speed drifts more
    # between minutes than between neighbouring seconds.
    paired_ops_per_s: float = 0.0
    paired_p99_ms: float = 0.0
    # (e) and (f), per ok round: [throughput drop, p99 ratio] against the pair
    round_changes: list[list[float]] = field(default_factory=list)

    @property
    def change(self) -> tuple[float, float] | None:
        """(e) or (f) against its pair: (share of the throughput lost, p99 ratio)."""
        return report.change(self.ops_per_s, self.p99_ms, self.paired_ops_per_s,
                             self.paired_p99_ms)

    @property
    def grant_share(self) -> float | None:
        tries = self.granted + self.denied
        return self.granted / tries if tries else None


def resolve_systems(only: list[str] | None) -> list[str]:
    if not only:
        return list(ALL_SYSTEMS)
    names = []
    for raw in only:
        name = ALIASES.get(raw.strip().lower())
        if name is None:
            raise ValueError(f"unknown system {raw!r}; choose from {', '.join(sorted(ALIASES))}")
        if name not in names:
            names.append(name)
    return [name for name in ALL_SYSTEMS if name in names]


def _load(system: System, workload: str, seconds: int, connections: int,
          install: bool) -> tuple[loadgen.LoadResult, str]:
    nonce = uuid.uuid4().hex[:10]
    env = {"BENCH_NONCE": nonce, **system.loader_env(workload, connections, nonce)}
    if isinstance(system, Redis):
        return (loadgen.redisload(system.port, workload, seconds, connections, nonce,
                                  system.shas, install), "redisload (bench/redisload.c)")
    kind = "etcd" if system.name == "etcd" else "fencepost"
    return (loadgen.wrk(system.base_url, kind, workload, seconds, connections, env),
            f"wrk -t{connections} -c{connections}")


def _measure(system: System, workload: str, seconds: int, connections: int, warmup: int,
             install: bool, profile_dir: Path | None = None) -> Row:
    """`workload` against `system`; (e) and (f) run (a) with their background,
    after (a) alone (their pair)."""
    if workload not in ("e", "f"):
        return _measure_load(system, workload, seconds, connections, warmup, install,
                             profile_dir)
    # The pair and its workload each start from a vacuumed locks table, or
    # the one measured later would pay for more of the dead rows that the
    # workloads before it left (the more so with autovacuum off).
    assert isinstance(system, Fencepost)
    background.settle(system.store_url)
    alone = _measure_load(system, "a", seconds, connections, warmup, install)
    row = _with_background(system, workload, seconds, connections, warmup, install,
                           profile_dir)
    row.paired_ops_per_s, row.paired_p99_ms = alone.ops_per_s, alone.p99_ms
    row.loader += f"; (a) alone just before: {alone.ops_per_s:.0f} ops/s, p99 {alone.p99_ms:.2f} ms"
    return row


def _with_background(system: System, workload: str, seconds: int, connections: int,
                     warmup: int, install: bool, profile_dir: Path | None) -> Row:
    if workload == "f":
        assert isinstance(system, Fencepost)
        background.preload_locks(system.store_url, HELD_LOCKS)
        return _measure_load(system, workload, seconds, connections, warmup, install,
                             profile_dir)
    parker = subprocess.Popen(
        [sys.executable, "-m", "fpbench.background", "park", system.base_url, BENCH_KEY,
         str(PARKED_LOCKS), str(PARKED_WAITERS)],
        cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE, text=True)
    try:
        assert parker.stdout is not None
        line = parker.stdout.readline().strip()
        if not line.startswith("parked "):
            raise RuntimeError(f"could not park the waiters: {line or parker.wait()}")
        _, count, *locks = line.split()
        in_line = int(count)
        if in_line < PARKED_WAITERS:
            # Fewer waiters is not workload (e): it would flatter the server
            # whose waiters fell out of line.
            raise RuntimeError(f"only {in_line} of {PARKED_WAITERS} waiters were in line "
                               "when parking ended")
        assert isinstance(system, Fencepost)
        background.settle(system.store_url)
        row = _measure_load(system, workload, seconds, connections, warmup, install,
                            profile_dir)
        row.loader += f"; {in_line} waiters parked on {PARKED_LOCKS} locks"
    finally:
        parker.kill()
        parker.wait()
    if not background.wait_until_unparked(system.base_url, BENCH_KEY, locks):
        row.loader += "; its waiters were still in line 120 s after their connections closed"
    return row


def _measure_load(system: System, workload: str, seconds: int, connections: int, warmup: int,
                  install: bool, profile_dir: Path | None = None) -> Row:
    if warmup > 0:
        _load(system, workload, warmup, connections, install)
    spy, spy_out = None, None
    if profile_dir is not None and isinstance(system, Fencepost) and system.proc is not None:
        spy_out = profile_dir / f"{system.name}-{workload}.collapsed"
        spy = profile.start(system.proc.pid, seconds, spy_out)
    cpu0, busy0 = system.cpu_seconds(), machine.cpu_busy_seconds()
    result, loader = _load(system, workload, seconds, connections, install)
    server_cpu = system.cpu_seconds() - cpu0
    busy = machine.cpu_busy_seconds() - busy0
    if spy is not None and spy_out is not None:
        summary = profile.finish(spy, spy_out)
        loader += f"; profiled: {summary}" if summary else "; profile failed"
    ops = max(result.requests, 1)
    capacity = (os.cpu_count() or 1) * result.seconds
    other = max(0.0, busy - server_cpu - result.client_cpu_s)
    return Row(
        system=system.name, workload=workload, status="ok", ops_per_s=result.ops_per_s,
        p50_ms=result.p50_us / 1000, p90_ms=result.p90_us / 1000, p99_ms=result.p99_us / 1000,
        max_ms=result.max_us / 1000, requests=result.requests, unexpected=result.unexpected,
        socket_errors=result.socket_errors, granted=result.granted, denied=result.denied,
        server_cpu_us_per_op=1e6 * server_cpu / ops,
        client_cpu_us_per_op=1e6 * result.client_cpu_s / ops,
        other_load_pct=100 * other / capacity if capacity else 0.0,
        loader=loader, samples=result.samples)


def _alongside(system: System, seconds: int, connections: int, install: bool) -> str:
    """Workload (a) for `seconds`, as the background of a hand-off case."""
    result, loader = _load(system, "a", seconds, connections, install)
    summary = f"(a) alongside: {result.ops_per_s:.0f} ops/s, p99 {result.p99_us / 1000:.1f} ms"
    if result.unexpected or result.socket_errors:
        summary += f", {result.unexpected} unexpected, {result.socket_errors} socket errors"
    return f"{summary} ({loader})"


def _run_system(system: System, chosen: list[str], seconds: int, connections: int, warmup: int,
                python_seconds: float, install: bool, profile_dir: Path | None,
                say: Callable[[str], None],
                ) -> tuple[list[Row], list[dict[str, Any]], list[handoff.Handoff]]:
    """Start one system, run every chosen workload and the Python probe, stop it."""
    rows: list[Row] = []
    latencies: list[dict[str, Any]] = []
    handoffs: list[handoff.Handoff] = []
    say(f"== {system.name}")
    done: set[str] = set()
    try:
        with tempfile.TemporaryDirectory(prefix=f"fpbench-{system.name}-") as tmp, \
                system.running(Path(tmp)):
            for workload in chosen:
                why_not = system.supports(workload)
                if workload == HANDOFF:
                    say(f"   ({workload}) {WORKLOADS[workload]}: {seconds} s per case ...")
                    handoffs += handoff.measure(
                        system, seconds,
                        lambda s: _alongside(system, s, connections, install), say)
                elif why_not:
                    rows.append(Row(system.name, workload, "n/a", why_not))
                else:
                    say(f"   ({workload}) {WORKLOADS[workload]}: {seconds} s ...")
                    try:
                        row = _measure(system, workload, seconds, connections, warmup,
                                       install, profile_dir)
                    except (loadgen.LoadError, RuntimeError, OSError) as exc:
                        row = Row(system.name, workload, "failed", str(exc)[:500])
                    rows.append(row)
                    say("       " + report.one_line(row))
                done.add(workload)
            if python_seconds > 0:
                for lat in pylatency.measure(system, python_seconds, uuid.uuid4().hex[:10]):
                    latencies.append({"system": system.name, **asdict(lat),
                                      "cycles_per_s": lat.cycles_per_s})
                    say(f"   python: {report.latency_line(latencies[-1])}")
    except Skipped as exc:
        say(f"   {exc}")
        rows += [Row(system.name, w, "skipped", str(exc)) for w in chosen
                 if w not in done and w != HANDOFF]
        if HANDOFF in chosen and HANDOFF not in done:
            handoffs += handoff.not_run(system.name, "skipped", str(exc))
    except Exception as exc:  # noqa: BLE001 - one broken system must not end the run
        say(f"   failed: {exc}")
        rows += [Row(system.name, w, "failed", str(exc)[:500]) for w in chosen
                 if w not in done and w != HANDOFF]
        if HANDOFF in chosen and HANDOFF not in done:
            handoffs += handoff.not_run(system.name, "failed", str(exc)[:500])
    return rows, latencies, handoffs


def _median_rows(rounds: list[list[Row]]) -> list[Row]:
    """Per system and workload, the round with the median ops/s (ok rounds
    only); for (e) and (f), the round with the median drop against its pair,
    and every round's change beside it."""
    picked: list[Row] = []
    for index, first in enumerate(rounds[0]):
        same = [r[index] for r in rounds if index < len(r)]
        ok = [r for r in same if r.status == "ok"]
        if not ok:
            picked.append(first)
            continue
        paired = [(c, r) for r in ok if (c := r.change) is not None]
        changes = [c for c, _ in paired]
        if len(paired) == len(ok):
            ok = [r for _, r in sorted(paired, key=lambda pair: pair[0][0])]
        else:
            ok.sort(key=lambda r: r.ops_per_s)
        row = ok[(len(ok) - 1) // 2]
        row.round_ops = [round(r.ops_per_s, 1) for r in same if r.status == "ok"]
        row.round_changes = [[round(drop, 4), round(p99, 3)] for drop, p99 in changes]
        picked.append(row)
    return picked


def _median_handoffs(rounds: list[list[handoff.Handoff]]) -> list[handoff.Handoff]:
    """Per system and case, the round with the median p99 (ok rounds only)."""
    picked: list[handoff.Handoff] = []
    for index, first in enumerate(rounds[0] if rounds else []):
        same = [r[index] for r in rounds if index < len(r)]
        ok = sorted((h for h in same if h.status == "ok"), key=lambda h: h.p99_ms)
        picked.append(ok[(len(ok) - 1) // 2] if ok else first)
    return picked


def _median_latencies(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    picked = []
    for index, first in enumerate(rounds[0]):
        same = sorted((r[index] for r in rounds if index < len(r)), key=lambda lat: lat["p50_ms"])
        picked.append(same[(len(same) - 1) // 2] if same else first)
    return picked


def run_benchmark(
    seconds: int = 10,
    connections: int = 64,
    only: list[str] | None = None,
    workloads: list[str] | None = None,
    warmup: int = 2,
    python_seconds: float = 3.0,
    results_dir: Path | str | None = None,
    install: bool = True,
    pg_admin_url: str = DEFAULT_PG_ADMIN_URL,
    profile_fencepost: bool = False,
    rounds: int = 1,
    replicas: list[int] | None = None,
    workers: list[int] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the benchmark, write results/<timestamp>.{json,md} and latest.md; return the run.

    With rounds > 1 every system is measured that many times, round after round
    (so slow drifts in the machine's other load hit every system alike), and
    each cell reports the round with the median ops/s. Each fencepost store
    is measured once per count in `workers` (`serve --workers N`; default 1).
    """
    names = resolve_systems(only)
    chosen = [w for w in (workloads or list(WORKLOADS)) if w in WORKLOADS]
    if not chosen:
        raise ValueError(f"no known workload in {workloads}; choose from {', '.join(WORKLOADS)}")
    if seconds < 1 or rounds < 1:
        raise ValueError("--seconds and --rounds must be at least 1 (wrk counts whole seconds)")
    if workers is not None and (not workers or min(workers) < 1):
        raise ValueError("--workers takes counts of at least 1, e.g. 1,2,4")
    started = dt.datetime.now(dt.UTC)
    profile_dir = None
    if profile_fencepost:
        if profile.py_spy() is None:
            say("--profile: py-spy not found (pip install py-spy); running without profiles")
        else:
            profile_dir = Path(results_dir or DEFAULT_RESULTS_DIR) / "profiles" / \
                started.strftime("%Y%m%dT%H%M%SZ")
    python = venv_python()
    wrk_missing = tools.ensure("wrk", install=install) is None
    described = machine.describe(python)
    say(f"other processes are using {described['background_cpu_pct']} % of this machine's CPU")
    row_rounds: list[list[Row]] = []
    latency_rounds: list[list[dict[str, Any]]] = []
    handoff_rounds: list[list[handoff.Handoff]] = []
    versions: dict[str, str] = {}
    notes: dict[str, list[str]] = {}
    for round_no in range(1, rounds + 1):
        if rounds > 1:
            say(f"##### round {round_no} of {rounds}")
        rows: list[Row] = []
        latencies: list[dict[str, Any]] = []
        handoffs: list[handoff.Handoff] = []
        for system in make_systems(names, pg_admin_url, install, workers):
            if wrk_missing and system.protocol == "http":
                rows += [Row(system.name, w, "skipped", "wrk not installed (apt-get install wrk)")
                         for w in chosen if w != HANDOFF]
                if HANDOFF in chosen:
                    handoffs += handoff.not_run(system.name, "skipped",
                                                "wrk not installed (apt-get install wrk)")
                continue
            got_rows, got_latencies, got_handoffs = _run_system(
                system, chosen, seconds, connections, warmup, python_seconds, install,
                profile_dir if round_no == 1 else None, say)
            rows += got_rows
            latencies += got_latencies
            handoffs += got_handoffs
            if system.version and system.version not in versions.get(system.name, ""):
                # The tree may be committed to between rounds: keep every version seen.
                seen = versions.get(system.name)
                versions[system.name] = f"{seen}; then {system.version}" if seen \
                    else system.version
            notes[system.name] = list(system.notes)
        row_rounds.append(rows)
        latency_rounds.append(latencies)
        handoff_rounds.append(handoffs)
    rows = _median_rows(row_rounds)
    handoffs = _median_handoffs(handoff_rounds)
    scaled: list[dict[str, Any]] = []
    if replicas and not wrk_missing:
        with tempfile.TemporaryDirectory(prefix="fpbench-replicas-") as tmp:
            scaled = [asdict(r) for r in scaling.measure(
                replicas, seconds, connections, warmup, pg_admin_url, Path(tmp), say)]
    info: dict[str, Any] = {**described, "load_average_at_end": machine.load_average(),
                            "versions": versions}
    run: dict[str, Any] = {
        "started_at": started.isoformat(timespec="seconds"),
        "seconds": seconds, "connections": connections, "warmup_seconds": warmup,
        "rounds": rounds, "profiled": profile_dir is not None,
        "systems": names, "workloads": {w: WORKLOADS[w] for w in chosen},
        "workers": workers or [1],
        "baseline": BASELINE, "machine": info, "notes": notes,
        "results": [{**asdict(r), "grant_share": r.grant_share} for r in rows],
        "python_latency": _median_latencies(latency_rounds),
        "targets": report.targets(rows) + report.handoff_targets(handoffs),
        "scaling": scaled,
        "handoff": [{**asdict(h), "within_bound": h.within_bound} for h in handoffs],
    }
    files = report.write(run, Path(results_dir or DEFAULT_RESULTS_DIR), started)
    run["files"] = [str(f) for f in files]
    say("")
    say(report.text_table(run))
    say("")
    say("written: " + ", ".join(str(f) for f in files))
    return run
