"""How the benchmark judges workloads (e) and (f): against (a) alone on the
same server just before each of them (its pair), round by round, and the
median of the rounds; the pure rules of bench/fpbench (report.targets and the
runner's choice of a round)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from fpbench import report  # noqa: E402
from fpbench.runner import Row, _median_rows  # noqa: E402

SYSTEM = "fencepost-sqlite"


def _row(workload: str, ops: float, p99: float, **extra: Any) -> Row:
    return Row(SYSTEM, workload, "ok", ops_per_s=ops, p99_ms=p99, **extra)


def _by_prefix(rows: list[Any], prefix: str) -> list[dict[str, Any]]:
    return [t for t in report.targets(rows) if t["target"].startswith(prefix)]


def test_a_parked_run_is_judged_against_its_pair_not_the_runs_a_row():
    # (a) measured minutes earlier was faster (the machine drifted): against
    # it (e) would have dropped 40 %, against its pair it dropped 5 %.
    alone = _row("a", 1_000, 10)
    parked = _row("e", 600, 12, paired_ops_per_s=631.6, paired_p99_ms=10)
    drop, p99 = _by_prefix([alone, parked], f"(e) {SYSTEM}")
    assert drop["met"] is True and drop["measured"].startswith("5 % (600 vs 632)")
    assert p99["met"] is True and p99["measured"].startswith("1.20x (12.00 ms vs 10.00 ms)")


def test_several_rounds_are_judged_by_their_median_and_all_are_shown():
    parked = _row("e", 900, 15, paired_ops_per_s=1_000, paired_p99_ms=10,
                  round_changes=[[0.05, 1.1], [0.4, 3.0], [0.1, 1.5]])
    drop, p99 = _by_prefix([parked], f"(e) {SYSTEM}")
    assert drop["met"] is True  # 10 %, one bad round of three
    assert drop["measured"].startswith("10 %")
    assert drop["measured"].endswith("median of rounds 5 %, 40 %, 10 %")
    assert p99["met"] is True and p99["measured"].startswith("1.50x")
    assert p99["measured"].endswith("median of rounds 1.10x, 3.00x, 1.50x")
    missed = _row("f", 800, 15, paired_ops_per_s=1_000, paired_p99_ms=10,
                  round_changes=[[0.2, 1.0], [0.05, 1.0], [0.3, 1.0]])
    [held] = _by_prefix([missed], f"(f) {SYSTEM}")
    assert held["met"] is False and held["measured"].startswith("20 %")


def test_a_result_file_without_pairs_is_judged_against_its_a_row():
    # Result files written before pairs were measured: plain dicts, no pair fields.
    alone = {"system": SYSTEM, "workload": "a", "status": "ok", "ops_per_s": 1_000.0,
             "p99_ms": 10.0}
    held = {"system": SYSTEM, "workload": "f", "status": "ok", "ops_per_s": 850.0,
            "p99_ms": 11.0}
    [target] = _by_prefix([alone, held], f"(f) {SYSTEM}")
    assert target["met"] is False and target["measured"] == "15 % (850 vs 1000)"
    assert _by_prefix([held], f"(f) {SYSTEM}") == []  # nothing to judge it against


def test_the_round_shown_for_a_paired_workload_is_the_one_with_the_median_drop():
    rounds = [
        [_row("e", 500, 20, paired_ops_per_s=1_000, paired_p99_ms=10)],  # 50 %
        [_row("e", 700, 12, paired_ops_per_s=720, paired_p99_ms=10)],  # 3 %
        [_row("e", 900, 11, paired_ops_per_s=1_000, paired_p99_ms=10)],  # 10 %: median
    ]
    [picked] = _median_rows(rounds)
    assert picked.ops_per_s == 900  # the median ops/s would have been 700
    assert [c[0] for c in picked.round_changes] == [0.5, round(1 - 700 / 720, 4), 0.1]
    assert picked.round_ops == [500, 700, 900]
    unpaired = [[_row("a", ops, 10)] for ops in (300, 100, 200)]
    [plain] = _median_rows(unpaired)
    assert plain.ops_per_s == 200 and plain.round_changes == []
