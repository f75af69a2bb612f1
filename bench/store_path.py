"""The store's own path: CPU per operation without HTTP.

    .venv/bin/python bench/store_path.py [--store URL] [--seconds 6] [--loops 64]

Opens a store (by default a new SQLite file in a temp dir; a PostgreSQL URL
must name an empty database) in this process and runs `--loops` concurrent
acquire+release cycles on fresh random keys, as workload (a) does over HTTP,
for `--seconds`. Prints the operations per second and this process's CPU per
operation (user and system: SQLite's page writes are system time). A
PostgreSQL database's own CPU is not in it. To compare two versions of the
code, run each several times, alternating (`PYTHONPATH=<other tree>/src`):
this machine's speed drifts between minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
import uuid

from fencepost.core.leases import AcquireRequest
from fencepost.store import make_store
from fencepost.store.migrate import apply_migrations

PROJECT = "default"


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(url: str, seconds: float, loops: int) -> tuple[float, float]:
    """(operations per second, CPU microseconds per operation)."""
    store = make_store(url)
    await store.open()
    ops = 0
    stop = time.monotonic() + seconds

    async def cycle() -> None:
        nonlocal ops
        while time.monotonic() < stop:
            key, token = f"k-{uuid.uuid4().hex[:16]}", str(uuid.uuid4())
            await store.acquire_lock(PROJECT, key, AcquireRequest(token, 30), wait_alive_ms=None)
            await store.release_lock(PROJECT, key, token)
            ops += 2

    try:
        cpu, began = _cpu_seconds(), time.monotonic()
        await asyncio.gather(*(cycle() for _ in range(loops)))
        cpu, elapsed = _cpu_seconds() - cpu, time.monotonic() - began
    finally:
        await store.close()
    return ops / elapsed, cpu / max(ops, 1) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="store URL (default: a new SQLite file)")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--loops", type=int, default=64)
    args = parser.parse_args()
    url = args.store or f"sqlite:///{tempfile.mkdtemp()}/store.db"
    if url.startswith("sqlite:"):
        apply_migrations(url, "sqlite")
    ops_per_s, cpu_us = asyncio.run(measure(url, args.seconds, args.loops))
    print(f"{ops_per_s:.0f} ops/s, {cpu_us:.1f} us of CPU per op")


if __name__ == "__main__":
    main()
