"""Tables (terminal and Markdown), the issue-7 targets, and the result files."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

SYSTEM_ORDER = ["fencepost-sqlite", "fencepost-postgresql", "etcd", "redis"]
BASELINE = "fencepost-sqlite"
DURABILITY = {
    "fencepost-sqlite": "fsync (synchronous=FULL, group commit) before every 2xx",
    "fencepost-postgresql": "PostgreSQL commit (fsync, default settings) before every 2xx",
    "etcd": "raft WAL fsync before every txn answer; lease keepalives are not written",
    "redis": "appendfsync everysec: up to ~1 s of acknowledged writes can be lost",
}


_REQUIRED = object()


def _get(row: Any, name: str, default: Any = _REQUIRED) -> Any:
    """A field of a row, whether a Row or one read back from a result file;
    `default` for a field that older result files do not have."""
    if default is _REQUIRED:
        return row[name] if isinstance(row, dict) else getattr(row, name)
    return row.get(name, default) if isinstance(row, dict) else getattr(row, name, default)


def _share(row: Any) -> float | None:
    tries = _get(row, "granted") + _get(row, "denied")
    return _get(row, "granted") / tries if tries else None


def one_line(row: Any) -> str:
    if _get(row, "status") != "ok":
        return f"{_get(row, 'status')}: {_get(row, 'reason')}"
    text = (f"{_get(row, 'ops_per_s'):.0f} ops/s, p50 {_get(row, 'p50_ms'):.2f} ms, "
            f"p99 {_get(row, 'p99_ms'):.2f} ms, server CPU "
            f"{_get(row, 'server_cpu_us_per_op'):.0f} us/op")
    share = _share(row)
    if share is not None:
        text += f", granted {100 * share:.1f} %"
    if _get(row, "unexpected") or _get(row, "socket_errors"):
        text += f", UNEXPECTED {_get(row, 'unexpected')} / socket errors " \
                f"{_get(row, 'socket_errors')}"
    return text


def latency_line(lat: dict[str, Any]) -> str:
    if lat["error"]:
        return f"{lat['method']}: failed: {lat['error']}"
    return (f"{lat['method']}: {lat['cycles_per_s']:.0f} cycles/s, p50 {lat['p50_ms']:.2f} ms, "
            f"p99 {lat['p99_ms']:.2f} ms")


def split_workers(system: str) -> tuple[str, int]:
    """`fencepost-sqlite-w4` -> (`fencepost-sqlite`, 4); any other name -> (name, 1)."""
    base, _, count = system.rpartition("-w")
    if base in SYSTEM_ORDER and count.isdigit():
        return base, int(count)
    return system, 1


def _order(system: str) -> tuple[int, int]:
    base, workers = split_workers(system)
    return ({name: i for i, name in enumerate(SYSTEM_ORDER)}.get(base, 99), workers)


def _rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(run["results"], key=lambda r: (r["workload"], *_order(r["system"])))


def _baseline(run: dict[str, Any], workload: str) -> float | None:
    for row in run["results"]:
        if row["system"] == BASELINE and row["workload"] == workload and row["status"] == "ok":
            return float(row["ops_per_s"]) or None
    return None


def _cells(run: dict[str, Any], row: dict[str, Any]) -> list[str]:
    if row["status"] != "ok":
        return [row["status"] if row["status"] != "skipped" else "skipped", "", "", "", "", "",
                row["reason"]]
    base = _baseline(run, row["workload"])
    notes = []
    share = _share(row)
    if share is not None:
        notes.append(f"granted {100 * share:.1f} %")
    if row["unexpected"] or row["socket_errors"]:
        notes.append(f"{row['unexpected']} unexpected answers, "
                     f"{row['socket_errors']} socket errors")
    if len(row.get("round_ops") or []) > 1:
        notes.append(f"rounds {min(row['round_ops']):.0f}–{max(row['round_ops']):.0f}")
    if row["other_load_pct"] >= 10:
        notes.append(f"other load {row['other_load_pct']:.0f} %")
    return [f"{row['ops_per_s']:.0f}", f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}",
            f"{row['ops_per_s'] / base:.2f}x" if base else "-",
            f"{row['server_cpu_us_per_op']:.0f}", f"{row['client_cpu_us_per_op']:.0f}",
            "; ".join(notes)]


HEADERS = ["workload", "system", "ops/s", "p50 ms", "p99 ms", "vs sqlite", "server CPU us/op",
           "loader CPU us/op", "notes"]


def text_table(run: dict[str, Any]) -> str:
    lines = [[row["workload"], row["system"], *_cells(run, row)] for row in _rows(run)]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(HEADERS[:-1])]
    out = ["  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in
                     enumerate(zip(HEADERS[:-1], widths, strict=False))) + "  notes"]
    for line in lines:
        out.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in
                             enumerate(zip(line[:-1], widths, strict=False))) + "  " + line[-1])
    if run.get("handoff"):
        out += ["", "(g) hand-off, ms from the lock becoming free to the next grant:"]
        out += [f"  {h['system']:22} {h['case']:19} {handoff_line(h)}" for h in run["handoff"]]
    if run["python_latency"]:
        out += ["", "one uncontended acquire+release from Python:"]
        out += [f"  {lat['system']:22} {latency_line(lat)}" for lat in run["python_latency"]]
    if run["targets"]:
        out += ["", "targets:"]
        out += [f"  [{_mark(t['met'])}] {t['target']}: {t['measured']}" for t in run["targets"]]
    return "\n".join(out)


def _mark(met: bool | None) -> str:
    return {True: "met", False: "NOT met", None: "n/a"}[met]


def markdown_table(run: dict[str, Any]) -> str:
    out = ["| workload | system | ops/s | p50 ms | p99 ms | vs sqlite | server CPU µs/op "
           "| loader CPU µs/op | notes |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in _rows(run):
        out.append("| " + " | ".join([row["workload"], row["system"], *_cells(run, row)]) + " |")
    return "\n".join(out)


def markdown(run: dict[str, Any]) -> str:
    m = run["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
    lines = [
        f"# fencepost benchmark, {run['started_at']}",
        "",
        f"{run['connections']} connections, {run['seconds']} s per workload "
        f"(after {run['warmup_seconds']} s of warm-up), every system started by "
        "`bench/run.py` on 127.0.0.1 and measured one after another"
        + (f"; {run['rounds']} rounds, each cell the round with the median ops/s "
           "(all rounds in the JSON)." if run.get("rounds", 1) > 1 else "."),
        "",
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']}, {m['os']}, kernel "
        f"{m['kernel']}, Python {m['python']}, SQLite {m['sqlite']}, {m['wrk']}. "
        f"Versions: {versions or '-'}. Load average {m['load_average_at_start']} at start, "
        f"{m['load_average_at_end']} at end; other processes used "
        f"{m.get('background_cpu_pct', '?')} % of the CPU just before the run.",
        "",
        "Workloads: " + "; ".join(f"({k}) {v}" for k, v in run["workloads"].items()) + ". "
        "ops = requests (HTTP) or commands (Redis): an acquire+release cycle is 2 ops. "
        "p50/p99 are per operation. CPU columns are CPU time per op of the server "
        "(for fencepost-postgresql including its PostgreSQL backends) and of the load "
        "generator.",
        "",
        markdown_table(run),
    ]
    if run["python_latency"]:
        lines += ["", "One uncontended acquire+release from Python, one at a time:", "",
                  "| system | how | cycles/s | p50 ms | p99 ms |", "|---|---|---:|---:|---:|"]
        for lat in run["python_latency"]:
            if lat["error"]:
                lines.append(f"| {lat['system']} | {lat['method']} | failed: {lat['error']} | | |")
            else:
                lines.append(f"| {lat['system']} | {lat['method']} | {lat['cycles_per_s']:.0f} "
                             f"| {lat['p50_ms']:.2f} | {lat['p99_ms']:.2f} |")
    if run.get("handoff"):
        lines += ["", *handoff_markdown(run["handoff"])]
    workers_table = scaling_table(run)
    if workers_table:
        m_cpus = run["machine"]["nproc"]
        lines += ["", f"Scaling with `serve --workers N` (this machine has {m_cpus} cores, "
                  "shared with the load generator: rows above that count show contention, "
                  "not capacity; CPU per op is what each further core would have to pay):",
                  "", *workers_table]
    if run.get("scaling"):
        from fpbench import scaling

        lines += scaling.markdown(run["scaling"])
    if run["targets"]:
        lines += ["", "Targets:", ""]
        lines += [f"- {_mark(t['met'])}: {t['target']} — {t['measured']}" for t in run["targets"]]
    if run.get("profiled"):
        lines += ["", "The fencepost servers were sampled by py-spy during this run (see "
                  "`profiles/`), which costs them a little throughput."]
    lines += ["", "Durability of an acknowledged write:", ""]
    lines += [f"- {name}: {DURABILITY[name]}" for name in run["systems"] if name in DURABILITY]
    return "\n".join(lines) + "\n"


def _ok(rows: list[Any], system: str, workload: str) -> Any:
    for row in rows:
        if _get(row, "system") == system and _get(row, "workload") == workload \
                and _get(row, "status") == "ok":
            return row
    return None


def change(ops: float, p99_ms: float, paired_ops: float, paired_p99_ms: float
           ) -> tuple[float, float] | None:
    """A workload with a background against (a) alone on the same server just
    before it: (the share of throughput lost, the p99 ratio); None unpaired."""
    if paired_ops <= 0 or paired_p99_ms <= 0:
        return None
    return 1 - ops / paired_ops, p99_ms / paired_p99_ms


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _judged(row: Any, alone: Any | None) -> tuple[
        tuple[float, list[float]], tuple[float, list[float]], tuple[float, float]] | None:
    """(drop, every round's), (p99 ratio, every round's) and the (a) it was
    judged against (ops/s, p99): the pair measured just before it, round by
    round, the median of the rounds; without a pair (a result file written
    before pairs were measured), the run's (a) row."""
    paired = (float(_get(row, "paired_ops_per_s", 0)), float(_get(row, "paired_p99_ms", 0)))
    own = change(float(_get(row, "ops_per_s")), float(_get(row, "p99_ms")), *paired)
    if own is None:
        if alone is None:
            return None
        against = (float(_get(alone, "ops_per_s")), float(_get(alone, "p99_ms")))
        own = change(float(_get(row, "ops_per_s")), float(_get(row, "p99_ms")), *against)
        assert own is not None
        return (own[0], []), (own[1], []), against
    rounds = [list(c) for c in (_get(row, "round_changes") or [])] or [list(own)]
    drops, slowers = [c[0] for c in rounds], [c[1] for c in rounds]
    return (_median(drops), drops), (_median(slowers), slowers), paired


def _spread(values: list[float], percent: bool) -> str:
    """Every round's value, when there were several (the median is judged)."""
    if len(values) < 2:
        return ""
    shown = [f"{100 * v:.0f} %" if percent else f"{v:.2f}x" for v in values]
    return f"; median of rounds {', '.join(shown)}"


def targets(rows: list[Any]) -> list[dict[str, Any]]:
    """The targets: SQLite >= 3x etcd on (a) and (b) with p99 <= etcd's, >= 0.2x Redis;
    PostgreSQL >= 1.5x etcd; (a) with waiters parked (e) or many locks held (f)
    barely slower than (a) alone. Only targets whose rows were measured are listed."""
    found = []
    names = sorted({_get(row, "system") for row in rows}, key=_order)
    for workload in ("a", "b"):
        etcd = _ok(rows, "etcd", workload)
        redis = _ok(rows, "redis", workload)

        def ops(row: Any) -> float:
            return float(_get(row, "ops_per_s"))

        for name in names:  # each worker count of each store is its own candidate
            store = split_workers(name)[0]
            row = _ok(rows, name, workload)
            if row is None or store not in ("fencepost-sqlite", "fencepost-postgresql"):
                continue
            if store == "fencepost-sqlite" and etcd:
                ratio = ops(row) / ops(etcd)
                found.append({
                    "target": f"({workload}) {name} >= 3x etcd ops/s",
                    "measured": f"{ratio:.2f}x ({ops(row):.0f} vs {ops(etcd):.0f})",
                    "met": ratio >= 3})
                found.append({
                    "target": f"({workload}) {name} p99 <= etcd p99",
                    "measured": f"{_get(row, 'p99_ms'):.2f} ms vs {_get(etcd, 'p99_ms'):.2f} ms",
                    "met": _get(row, "p99_ms") <= _get(etcd, "p99_ms")})
            if store == "fencepost-sqlite" and redis:
                ratio = ops(row) / ops(redis)
                found.append({
                    "target": f"({workload}) {name} >= 0.2x Redis ops/s",
                    "measured": f"{ratio:.2f}x ({ops(row):.0f} vs {ops(redis):.0f})",
                    "met": ratio >= 0.2})
            if store == "fencepost-postgresql" and etcd:
                ratio = ops(row) / ops(etcd)
                found.append({
                    "target": f"({workload}) {name} >= 1.5x etcd ops/s",
                    "measured": f"{ratio:.2f}x ({ops(row):.0f} vs {ops(etcd):.0f})",
                    "met": ratio >= 1.5})
    for system in names:
        if split_workers(system)[0] not in ("fencepost-sqlite", "fencepost-postgresql"):
            continue
        alone = _ok(rows, system, "a")
        parked = _ok(rows, system, "e")
        held = _ok(rows, system, "f")
        if parked:
            judged = _judged(parked, alone)
            if judged:
                (drop, drops), (slower, slowers), against = judged
                found.append({
                    "target": f"(e) {system}: (a) drops < 20 % with 10,000 waiters parked",
                    "measured": f"{100 * drop:.0f} % ({_get(parked, 'ops_per_s'):.0f} vs "
                                f"{against[0]:.0f}){_spread(drops, percent=True)}",
                    "met": drop < 0.2})
                found.append({
                    "target": f"(e) {system}: (a) p99 within 2x with 10,000 waiters parked",
                    "measured": f"{slower:.2f}x ({_get(parked, 'p99_ms'):.2f} ms vs "
                                f"{against[1]:.2f} ms){_spread(slowers, percent=False)}",
                    "met": slower <= 2})
        if held:
            judged = _judged(held, alone)
            if judged:
                (drop, drops), _, against = judged
                found.append({
                    "target": f"(f) {system}: (a) < 10 % slower with 1,000,000 locks held",
                    "measured": f"{100 * drop:.0f} % ({_get(held, 'ops_per_s'):.0f} vs "
                                f"{against[0]:.0f}){_spread(drops, percent=True)}",
                    "met": drop < 0.1})
    return found


def handoff_line(h: dict[str, Any]) -> str:
    if h["status"] != "ok":
        return f"{h['status']}: {h['reason']}"
    text = (f"{h['samples']} samples, p50 {h['p50_ms']:.1f}, p99 {h['p99_ms']:.1f}, "
            f"max {h['max_ms']:.1f}, over 100 ms {h['over_100ms']}, over 1 s {h['over_1s']}")
    return text


def _handoff_notes(h: dict[str, Any]) -> str:
    notes = [f"client loop lag p99 {h['client_lag_p99_ms']:.1f} ms, "
             f"max {h['client_lag_max_ms']:.1f} ms"]
    if h["note"]:
        notes.append(h["note"])
    return "; ".join(notes)


def handoff_markdown(handoffs: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: workload (g), one row per system and case."""
    out = ["(g) Hand-off: from the lock or slot becoming free (the release's answer read, "
           "or the holder's `expires_at`) to the next waiter's grant read, in ms; SPEC's "
           "bound is 100 ms after a release and 1 s after `expires_at`:", "",
           "| case | system | waiters | hand-offs | p50 ms | p99 ms | max ms | > 100 ms "
           "| > 1 s | notes |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    cases = {case: i for i, case in enumerate(dict.fromkeys(h["case"] for h in handoffs))}
    for h in sorted(handoffs, key=lambda h: (cases[h["case"]], *_order(h["system"]))):
        if h["status"] != "ok":
            out.append(f"| {h['case']} | {h['system']} | | | {h['status']} | | | | | "
                       f"{h['reason']} |")
            continue
        out.append(f"| {h['case']} | {h['system']} | {h['waiters']} | {h['samples']} "
                   f"| {h['p50_ms']:.1f} | {h['p99_ms']:.1f} | {h['max_ms']:.1f} "
                   f"| {h['over_100ms']} | {h['over_1s']} | {_handoff_notes(h)} |")
    return out


def handoff_targets(handoffs: list[Any]) -> list[dict[str, Any]]:
    """SPEC's bounds on every measured hand-off case: §3.1 and §4.2 (100 ms after
    a release), §7.4 (1 s after `expires_at`)."""
    found = []
    for h in handoffs:
        if _get(h, "status") != "ok":
            continue
        bound = _get(h, "bound_ms")
        over = _get(h, "over_1s") if bound >= 1000 else _get(h, "over_100ms")
        found.append({
            "target": f"(g) {_get(h, 'system')} {_get(h, 'case')}: every hand-off within "
                      f"{'1 s' if bound >= 1000 else f'{bound} ms'}",
            "measured": f"{over} of {_get(h, 'samples')} over, max {_get(h, 'max_ms'):.1f} ms",
            "met": _get(h, "within_bound")})
    return found


def scaling_table(run: dict[str, Any]) -> list[str]:
    """Markdown lines: each store and workload by worker count, with CPU per
    op, so that a reader can see what more cores would give. Empty when only
    one count was measured."""
    if len(run.get("workers") or [1]) < 2:
        return []
    out = ["| workload | store | workers | ops/s | vs 1 worker | p50 ms | p99 ms "
           "| server CPU µs/op | cores busy |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    single: dict[tuple[str, str], float] = {}
    for row in _rows(run):
        store, workers = split_workers(row["system"])
        if not store.startswith("fencepost-") or row["status"] != "ok":
            continue
        if workers == 1:
            single[(row["workload"], store)] = row["ops_per_s"]
        base = single.get((row["workload"], store))
        # CPU per op times ops per second: how many cores the server kept busy.
        cores = row["server_cpu_us_per_op"] * row["ops_per_s"] / 1e6
        ratio = f"{row['ops_per_s'] / base:.2f}x" if base else "-"
        out.append(f"| {row['workload']} | {store.removeprefix('fencepost-')} | {workers} "
                   f"| {row['ops_per_s']:.0f} | {ratio} "
                   f"| {row['p50_ms']:.2f} | {row['p99_ms']:.2f} "
                   f"| {row['server_cpu_us_per_op']:.0f} | {cores:.2f} |")
    return out


def write(run: dict[str, Any], results_dir: Path, started: dt.datetime) -> list[Path]:
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    json_path, md_path = results_dir / f"{stamp}.json", results_dir / f"{stamp}.md"
    json_path.write_text(json.dumps(run, indent=2, default=str) + "\n")
    md_path.write_text(markdown(run))
    latest = results_dir / "latest.md"
    shutil.copyfile(md_path, latest)
    return [json_path, md_path, latest]
