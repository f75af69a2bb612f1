"""The benchmark harness (bench/run.py) must not rot: one second of workload (a)
against fencepost on SQLite, through the same function the entry point calls,
and one second of each quick case of the hand-off workload (g).

It needs `wrk` (a C load generator). Without it the test is skipped on a
developer's machine; under CI=true it installs it (CI runs as root) or fails.
The full benchmark is not a test: see README "Benchmarks".
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from pg_support import ADMIN_URL
from support import missing

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from fpbench import tools  # noqa: E402
from fpbench.runner import run_benchmark  # noqa: E402


def _need_wrk() -> None:
    if shutil.which("wrk"):
        return
    if os.environ.get("CI") == "true":
        if tools.ensure("wrk", install=True, timeout=120):
            return
    missing("wrk (apt-get install wrk)")


@pytest.mark.timeout(300)
def test_one_second_of_acquire_release_against_fencepost_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _need_wrk()
    from fpbench import handoff

    # (g)'s two quick cases: the expiry case waits out a 5 s lease, and the
    # one under load runs wrk for three seconds.
    monkeypatch.setattr(handoff, "CASES", ("release", "pool"))
    monkeypatch.setattr(handoff, "WAITERS", 4)
    printed: list[str] = []

    run = run_benchmark(
        seconds=1, only=["sqlite"], workloads=["a", "g"], warmup=0, python_seconds=0.3,
        results_dir=tmp_path, install=False, say=printed.append,
    )

    [row] = run["results"]
    assert row["system"] == "fencepost-sqlite" and row["workload"] == "a"
    assert row["status"] == "ok", row["reason"]
    assert row["ops_per_s"] > 0 and row["requests"] > 0
    assert row["unexpected"] == 0, row["samples"]
    assert row["socket_errors"] == 0
    assert 0 < row["p50_ms"] <= row["p99_ms"]
    assert row["server_cpu_us_per_op"] > 0

    [raw] = [lat for lat in run["python_latency"] if lat["method"].startswith("httpx")]
    assert raw["error"] == "" and raw["cycles"] > 0

    written = sorted(p.name for p in tmp_path.iterdir())
    assert len(written) == 3 and "latest.md" in written, written
    [json_file] = tmp_path.glob("*.json")
    saved = json.loads(json_file.read_text())
    assert saved["results"][0]["ops_per_s"] == row["ops_per_s"]
    assert saved["machine"]["nproc"] and saved["machine"]["versions"]["fencepost-sqlite"]
    latest = (tmp_path / "latest.md").read_text()
    assert "| a | fencepost-sqlite |" in latest
    assert any("fencepost-sqlite" in line and "1.00x" in line for line in printed)

    cases = {h["case"]: h for h in run["handoff"]}
    assert sorted(cases) == ["pool", "release"]
    for case in cases.values():
        assert case["status"] == "ok", case["reason"]
        assert case["samples"] > 0 and case["waiters"] == 4
        assert 0 <= case["p50_ms"] <= case["p99_ms"] <= case["max_ms"]
        assert case["within_bound"] is (case["over_100ms"] == 0)
    assert "| release | fencepost-sqlite | 4 |" in latest
    assert "| pool | fencepost-sqlite | 4 |" in latest
    assert sum(t["target"].startswith("(g) fencepost-sqlite") for t in run["targets"]) == 2


@pytest.mark.timeout(600)
def test_parked_waiters_held_locks_and_replicas_workloads_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(e), (f) and the replicas table, scaled down: the same code paths."""
    _need_wrk()
    from fpbench import runner

    monkeypatch.setattr(runner, "PARKED_LOCKS", 2)
    monkeypatch.setattr(runner, "PARKED_WAITERS", 20)
    monkeypatch.setattr(runner, "HELD_LOCKS", 1000)
    run = run_benchmark(
        seconds=1, only=["sqlite"], workloads=["a", "e", "f"], warmup=0, python_seconds=0,
        results_dir=tmp_path, install=False, replicas=[2], pg_admin_url=ADMIN_URL,
        say=lambda line: None,
    )
    rows = {row["workload"]: row for row in run["results"]}
    for workload in ("e", "f"):
        assert rows[workload]["status"] == "ok", rows[workload]["reason"]
        assert rows[workload]["unexpected"] == 0, rows[workload]["samples"]
    assert "20 waiters parked on 2 locks" in rows["e"]["loader"]
    for workload in ("e", "f"):  # each judged against (a) alone just before it
        assert rows[workload]["paired_ops_per_s"] > 0 and rows[workload]["paired_p99_ms"] > 0
        assert "(a) alone just before" in rows[workload]["loader"]
        assert "still parked" not in rows[workload]["loader"]
    [scaled] = run["scaling"]
    assert scaled["status"] == "ok", scaled["reason"]
    assert scaled["replicas"] == 2 and scaled["ops_per_s"] > 0
    assert "| 2 |" in (tmp_path / "latest.md").read_text()
    targets = {t["target"] for t in run["targets"]}
    assert any(t.startswith("(e) fencepost-sqlite") for t in targets)
    assert any(t.startswith("(f) fencepost-sqlite") for t in targets)


@pytest.mark.timeout(300)
def test_one_second_per_worker_count_makes_a_scaling_table(tmp_path: Path) -> None:
    _need_wrk()
    run = run_benchmark(
        seconds=1, only=["sqlite"], workloads=["b"], warmup=0, python_seconds=0,
        results_dir=tmp_path, install=False, workers=[1, 2], say=lambda line: None,
    )
    rows = {row["system"]: row for row in run["results"]}
    assert sorted(rows) == ["fencepost-sqlite", "fencepost-sqlite-w2"]
    for row in rows.values():
        assert row["status"] == "ok", row["reason"]
        assert row["unexpected"] == 0 and row["socket_errors"] == 0, row["samples"]
    # The workers' CPU is counted, not only their idle supervisor's.
    one, two = (rows[name]["server_cpu_us_per_op"] for name in sorted(rows))
    assert two > one / 3, (one, two)
    latest = (tmp_path / "latest.md").read_text()
    assert "Scaling with `serve --workers N` (this machine has" in latest
    assert "| b | sqlite | 1 |" in latest and "| b | sqlite | 2 |" in latest

