"""The store growth benchmark (bench/store_growth.py) must not rot: two one-second
slices of it on each store, through the functions its entry point calls, with a
one-second retention, and the report it prints from them."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from support import missing

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from fpbench.systems import DEFAULT_PG_ADMIN_URL  # noqa: E402
from store_growth import _measure, _report  # noqa: E402


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_short_growth_run_counts_cycles_and_bytes(store: str) -> None:
    if shutil.which("wrk") is None:
        missing("wrk (apt-get install wrk)")
    samples = _measure(store, seconds=2, slice_s=1, retention="1s", connections=4,
                       pg_url=DEFAULT_PG_ADMIN_URL)
    assert len(samples) >= 2
    assert all(sample.cycles > 0 and sample.kept > 0 for sample in samples)
    assert samples[-1].cycles > samples[0].cycles
    report = "\n".join(_report(store, samples, "1s"))
    assert f"### {store}" in report and "| s | cycles |" in report
