"""What the store keeps per operation, and whether it stops growing.

    .venv/bin/python bench/store_growth.py [--stores sqlite,postgresql] [--seconds 150]
                                           [--slice 10] [--retention 30s]
                                           [--connections 64] [--pg-url URL]
                                           [--pg-settings "autovacuum_naptime=5s" ...]

Starts `fencepost serve` on each store with a short `--ended-retention`, drives
acquire+release cycles on fresh random lock names with wrk (bench/wrk/
fencepost_cycle.lua) in slices of `--slice` seconds, and after each slice reads
how many leases were granted (the fencing-token counter: one token per grant)
and how big the store is:

- SQLite: the bytes its pages in use hold ((page_count - freelist_count) x
  page_size, read through the WAL), the database file and the WAL file;
- PostgreSQL: the tables' total size (pg_total_relation_size: heap, indexes
  and TOAST) of fencepost's database.

Until the retention has passed nothing is forgotten, so the growth over those
slices divided by the cycles made in them is what one cycle keeps with any
retention (the default, 24 h, included); after it, the size must level off:
the steady state is what the last retention window's cycles keep. Prints one
table per store and a summary (markdown), as docs/benchmarks.md shows them.

PostgreSQL keeps deleted rows until a vacuum: how much it holds depends on
autovacuum. Each `--pg-settings` (space-separated name=value pairs; "" for
PostgreSQL's defaults) measures it again on a server of the benchmark's own
started with them (bench/fpbench/private_pg.py; needs root), instead of the
one at `--pg-url`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fpbench import loadgen  # noqa: E402
from fpbench.private_pg import private_postgres  # noqa: E402
from fpbench.systems import BENCH_KEY, DEFAULT_PG_ADMIN_URL, Fencepost  # noqa: E402


@dataclass
class Sample:
    seconds: float  # since the load began
    cycles: int  # leases granted since then
    kept: int  # bytes the store holds in use
    files: int  # bytes on disk (SQLite: database + WAL; PostgreSQL: = kept)


def _sqlite_size(path: Path) -> tuple[int, int, int]:
    """(grants so far, bytes in use, bytes on disk)."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        (tokens,) = conn.execute("SELECT value FROM counters WHERE name = 'fencing'").fetchone()
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (free,) = conn.execute("PRAGMA freelist_count").fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    wal = Path(f"{path}-wal")
    on_disk = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    return int(tokens), (int(pages) - int(free)) * int(size), on_disk


def _pg_size(url: str) -> tuple[int, int, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        (tokens,) = conn.execute("SELECT last_value FROM fencing_tokens").fetchone()
        (size,) = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'"
        ).fetchone()
    return int(tokens), int(size), int(size)


def _measure(store: str, seconds: int, slice_s: int, retention: str, connections: int,
             pg_url: str) -> list[Sample]:
    system = Fencepost(name=f"fencepost-{store}", store=store, pg_admin_url=pg_url,
                       extra_args=["--ended-retention", retention], install=False)
    samples: list[Sample] = []
    with tempfile.TemporaryDirectory(prefix="fp-growth-") as folder, \
            system.running(Path(folder)):
        def size() -> tuple[int, int, int]:
            if store == "sqlite":
                return _sqlite_size(Path(folder) / "fencepost.db")
            return _pg_size(system.store_url)

        first, _, _ = size()
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            # A nonce per slice: fresh lock names every time.
            loadgen.wrk(system.base_url, "fencepost", "a", slice_s, connections,
                        {"FENCEPOST_API_KEY": BENCH_KEY, "BENCH_NONCE": os.urandom(4).hex()})
            tokens, kept, files = size()
            samples.append(Sample(time.monotonic() - started, tokens - first, kept, files))
            print(f"  {store}: {samples[-1].seconds:5.0f} s  {samples[-1].cycles:9,} cycles  "
                  f"{kept / 2**20:8.1f} MiB in use  {files / 2**20:8.1f} MiB on disk",
                  flush=True)
    return samples


def _retention_s(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
    return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)


def _report(store: str, samples: list[Sample], retention: str) -> list[str]:
    window = _retention_s(retention)
    lines = [f"### {store}", "", "| s | cycles | MiB in use | MiB on disk |",
             "|---:|---:|---:|---:|"]
    lines += [f"| {s.seconds:.0f} | {s.cycles:,} | {s.kept / 2**20:.1f} | "
              f"{s.files / 2**20:.1f} |" for s in samples]
    before = [s for s in samples if s.seconds <= window]
    after = [s for s in samples if s.seconds >= 2 * window]
    lines.append("")
    if len(before) >= 2:
        first, last = before[0], before[-1]
        per_cycle = (last.kept - first.kept) / max(1, last.cycles - first.cycles)
        lines.append(f"- kept per acquire+release cycle, before the retention passed: "
                     f"**{per_cycle:.0f} bytes**")
    if after:
        sizes = [s.kept for s in after]
        rate = (after[-1].cycles - after[0].cycles) / max(1e-9, after[-1].seconds
                                                           - after[0].seconds)
        lines.append(f"- steady state from {after[0].seconds:.0f} s on (twice the retention): "
                     f"{min(sizes) / 2**20:.1f}-{max(sizes) / 2**20:.1f} MiB in use at "
                     f"{rate:,.0f} cycles/s")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--seconds", type=int, default=150)
    parser.add_argument("--slice", type=int, default=10)
    parser.add_argument("--retention", default="30s")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--pg-url", default=os.environ.get("FENCEPOST_BENCH_PG",
                                                           DEFAULT_PG_ADMIN_URL))
    parser.add_argument("--pg-settings", action="append", default=None,
                        help="run PostgreSQL on a private server with these settings "
                             "(name=value ...); repeat for several runs")
    args = parser.parse_args()
    out = [f"`--ended-retention {args.retention}`, {args.connections} connections, "
           f"slices of {args.slice} s", ""]
    for store in [s.strip() for s in args.stores.split(",") if s.strip()]:
        if store != "postgresql" or args.pg_settings is None:
            samples = _measure(store, args.seconds, args.slice, args.retention,
                               args.connections, args.pg_url)
            out += [*_report(store, samples, args.retention), ""]
            continue
        for text in args.pg_settings:
            settings = dict(pair.split("=", 1) for pair in text.split())
            with private_postgres(settings) as url:
                samples = _measure(store, args.seconds, args.slice, args.retention,
                                   args.connections, url)
            named = ", ".join(f"{k}={v}" for k, v in settings.items()) or "defaults"
            out += [*_report(f"{store} ({named})", samples, args.retention), ""]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
