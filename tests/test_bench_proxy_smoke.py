"""The proxy overhead benchmark (bench/proxy_overhead.py) must not rot: one
second of each case, straight and proxied, through the functions its entry
point calls, and the report it prints from them."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from support import missing

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from proxy_overhead import CASES, measure, report  # noqa: E402


def test_a_short_run_measures_every_case_both_ways() -> None:
    if shutil.which("wrk") is None:
        missing("wrk (apt-get install wrk)")
    rows = measure(seconds=1, connections=2, store="sqlite", pin=False)
    assert [row.case for row in rows] == list(CASES)
    for row in rows:
        assert row.direct.requests > 0 and row.proxied.requests > 0
        assert row.proxied.unexpected == 0 and row.server_cpu_s > 0
    lines = report(rows, "sqlite", 2, False)
    assert lines[0].startswith("### Proxy mode") and len(lines) == 4 + len(CASES)
