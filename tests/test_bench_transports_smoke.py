"""The client transports benchmark (bench/client_transports.py) must not rot: a
few hundred renewals through every stack, through the functions its entry point
calls. The full run is not a test: see docs/benchmarks.md "Client transports"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from client_transports import markdown, measure, stacks  # noqa: E402


@pytest.mark.timeout(300)
def test_a_short_transports_run_measures_every_stack() -> None:
    printed: list[str] = []

    best = measure(requests=80, rounds=1, say=printed.append)

    assert set(best) == set(stacks())
    assert {"client, httpx", "client, own", "httpx", "httpcore", "own pool"} <= set(best)
    assert all(cpu > 0 for cpu in best.values()), best
    assert len(printed) == len(best)
    assert "| client, own | " in markdown(best)
