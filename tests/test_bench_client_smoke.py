"""The client load benchmark (bench/client_load.py) must not rot: a few seconds
of it, through the same function its entry point calls. The full run is not a
test: see docs/benchmarks.md "Client load"."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from client_load import VARIANTS, run_client_load  # noqa: E402


@pytest.mark.timeout(300)
def test_a_short_client_load_run_measures_and_writes_its_results(tmp_path: Path) -> None:
    printed: list[str] = []

    run = run_client_load(steps=[20, 40], hold_s=3, ttl=5, renew_seconds=1,
                          variants=sorted(VARIANTS), results_dir=tmp_path, say=printed.append)

    assert run["renewal_rate"]["renewals_per_s"] > 0
    assert run["renewal_rate"]["client_cpu_us_per_renewal"] > 0
    steps = run["steps"]
    assert [(s["variant"], s["leases"]) for s in steps] == [
        ("per-lease", 20), ("per-lease", 40), ("session", 20), ("session", 40)]
    for step in steps:
        # A 5 s lease (or session) held 3 s is renewed at least once (its first
        # renewal is due within 1.7 s); so few leases are never lost.
        assert step["held"] and step["lost"] == {} and step["failed_to_acquire"] == 0, step
        # Each lease renews on its own, or the one session renews for all.
        renewed_each = step["variant"] == "per-lease"
        assert step["renewals"] >= (step["leases"] if renewed_each else 1), step
    assert run["held_without_loss"] == {"per-lease": 40, "session": 40}

    written = sorted(p.name for p in tmp_path.iterdir())
    assert len(written) == 3 and "client-latest.md" in written, written
    [json_file] = tmp_path.glob("client-*.json")
    assert json.loads(json_file.read_text())["steps"] == steps
    table = (tmp_path / "client-latest.md").read_text()
    assert "| per-lease | 40 | 5 | 3 | 0 |" in table, table
