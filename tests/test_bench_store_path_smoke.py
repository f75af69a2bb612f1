"""The store path benchmark (bench/store_path.py) must not rot: a fraction of a
second of it on both stores, through the function its entry point calls."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fencepost.store.migrate import apply_migrations
from pg_support import temporary_database

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from store_path import measure  # noqa: E402


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_short_store_path_run_counts_operations_and_their_cpu(
    backend: str, tmp_path: Path
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/store.db"
        apply_migrations(url, "sqlite")
        ops_per_s, cpu_us = await measure(url, seconds=0.3, loops=4)
    else:
        with temporary_database() as url:
            ops_per_s, cpu_us = await measure(url, seconds=0.3, loops=4)
    assert ops_per_s > 0 and cpu_us > 0
