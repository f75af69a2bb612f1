"""fencepost benchmark: fencepost (SQLite, PostgreSQL), etcd and Redis side by side.

    .venv/bin/python bench/run.py [--seconds 10] [--connections 64]
                                  [--only sqlite,postgresql,etcd,redis] [--workloads a,b,c,d,e,f,g]
                                  [--workers 1,2,4] [--replicas 1,2,3]
                                  [--results-dir bench/results]

Starts each system itself on 127.0.0.1 (free ports, temp dirs; a fresh
PostgreSQL database, dropped afterwards), runs the same workloads against each
with C load generators (wrk + bench/wrk/*.lua for HTTP, bench/redisload.c for
Redis), stops it, prints one table and writes bench/results/<timestamp>.json
and .md (and latest.md). Missing peers are installed from Debian's packages
when running as root, otherwise reported as skipped. See README "Benchmarks".
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV_PYTHON = HERE.parent / ".venv" / "bin" / "python"


def _reexec_in_venv() -> None:
    """The harness needs httpx and psycopg: use the project's venv when started outside it."""
    try:
        import httpx  # noqa: F401
        import psycopg  # noqa: F401
    except ImportError:
        if VENV_PYTHON.exists() and Path(sys.executable) != VENV_PYTHON:
            os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), *sys.argv])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10, help="per workload (default 10)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--only", default="", help="comma-separated: sqlite,postgresql,etcd,redis")
    parser.add_argument("--workloads", default="a,b,c,d,e,f,g",
                        help="comma-separated from a,b,c,d,e,f,g")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of uncounted load first")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure everything N times, report each cell's median round")
    parser.add_argument("--python-seconds", type=float, default=3.0,
                        help="length of each Python latency probe; 0 skips them")
    parser.add_argument("--results-dir", default=str(HERE / "results"))
    parser.add_argument("--pg-url", default=os.environ.get(
        "FENCEPOST_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="PostgreSQL role allowed to create databases (env FENCEPOST_BENCH_PG)")
    parser.add_argument("--profile", action="store_true",
                        help="sample the fencepost server with py-spy during each workload "
                             "(writes <results-dir>/profiles/)")
    parser.add_argument("--replicas", default="",
                        help="also run (a) on this many PostgreSQL replicas of one database, "
                             "comma-separated (e.g. 1,2,3): the scaling table")
    parser.add_argument("--workers", default="1",
                        help="comma-separated worker counts: each fencepost store is measured "
                             "with `serve --workers N` for each (default 1); more than one "
                             "count adds a scaling table")
    parser.add_argument("--no-install", action="store_true",
                        help="never apt-get install a missing peer or tool")
    args = parser.parse_args(argv)

    try:
        workers = [int(n) for n in args.workers.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--workers: {args.workers!r} is not a list of counts such as 1,2,4")
    sys.path.insert(0, str(HERE))
    from fpbench.runner import run_benchmark

    try:
        run_benchmark(
            seconds=args.seconds, connections=args.connections,
            only=[s for s in args.only.split(",") if s] or None,
            workloads=[w.strip() for w in args.workloads.split(",") if w.strip()],
            warmup=args.warmup, python_seconds=args.python_seconds,
            results_dir=Path(args.results_dir), install=not args.no_install,
            pg_admin_url=args.pg_url, profile_fencepost=args.profile,
            rounds=args.rounds, workers=workers,
            replicas=[int(n) for n in args.replicas.split(",") if n.strip()],
        )
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    _reexec_in_venv()
    sys.exit(main())
