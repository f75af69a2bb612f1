"""What proxy mode adds to a call: latency and CPU, against calling the
upstream directly, in one run on one machine.

    .venv/bin/python bench/proxy_overhead.py [--seconds 10] [--connections 16]
                                             [--store sqlite|postgresql] [--no-pin]

Starts a fast upstream (bench/fpbench/upstream.py) and `fencepost serve` with
a pool in proxy mode in front of it (a limit above the connections, so that
admission never waits), then drives each case with wrk twice: straight at the
upstream, and through `/v1/pools/{pool}/proxy/...`. Cases: a GET with a small
answer, a GET with a 1 MiB answer, a POST with a 256 KiB body. On a machine
with two cores or more, fencepost is pinned to core 0 and the upstream and wrk
to core 1 (taskset), so that each has a core and fencepost's CPU is its own.

Reports, per case, requests per second, p50 and p99 both ways and what the
proxy adds, and fencepost's CPU per proxied request (its process tree; on
PostgreSQL the database backends' too), as a markdown table (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fpbench import loadgen, machine, procs  # noqa: E402
from fpbench.systems import BENCH_KEY, DEFAULT_PG_ADMIN_URL, Fencepost, http_json  # noqa: E402


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str  # on the upstream
    body_bytes: int


CASES = (
    Case("GET, 11 B answer", "GET", "/small", 0),
    Case("GET, 1 MiB answer", "GET", f"/size/{2**20}", 0),
    Case("POST, 256 KiB body", "POST", "/upload", 256 * 1024),
)


@dataclass
class Row:
    case: Case
    direct: loadgen.LoadResult
    proxied: loadgen.LoadResult
    server_cpu_s: float  # fencepost's, during the proxied run

    @property
    def cpu_us_per_request(self) -> float:
        return self.server_cpu_s / max(self.proxied.requests, 1) * 1e6


def _pinned(core: int | None) -> list[str]:
    if core is None or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", str(core)]


@contextlib.contextmanager
def _upstream(workdir: Path, core: int | None) -> Iterator[str]:
    port = procs.free_port()
    proc = procs.start([*_pinned(core), sys.executable, str(HERE / "fpbench" / "upstream.py"),
                        str(port)], workdir / "upstream.log")
    try:
        procs.wait_port(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        procs.stop(proc)


def measure(seconds: int, connections: int, store: str, pin: bool,
            pg_url: str = DEFAULT_PG_ADMIN_URL) -> list[Row]:
    """Each case straight and proxied, with fencepost's CPU for the latter."""
    two_cores = pin and (os.cpu_count() or 1) >= 2
    server_core, load_core = (0, 1) if two_cores else (None, None)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fp-proxy-bench-") as tmp:
        workdir = Path(tmp)
        with _upstream(workdir, load_core) as upstream_url:
            server = Fencepost(name="fencepost", store=store, pg_admin_url=pg_url,
                               command_prefix=_pinned(server_core))
            with server.running(workdir):
                pool = f"proxy-{uuid.uuid4().hex[:8]}"
                status, body = http_json(
                    "PUT", f"{server.base_url}/v1/pools/{pool}",
                    {"limit": connections * 4, "queue_size": 0, "max_body_bytes": 8 * 2**20,
                     "upstream": {"base_url": upstream_url,
                                  "headers": {"Authorization": "Bearer upstream-key"}}},
                    {"Authorization": f"Bearer {BENCH_KEY}"})
                if status not in (200, 201):
                    raise RuntimeError(f"could not create the pool: {status} {body}")
                for case in CASES:
                    env = {"BENCH_METHOD": case.method, "BENCH_BODY_BYTES": str(case.body_bytes)}
                    direct = _load(upstream_url, {**env, "BENCH_PATH": case.path},
                                   seconds, connections, load_core)
                    before = server.cpu_seconds()
                    proxied = _load(server.base_url,
                                    {**env, "BENCH_PATH": f"/v1/pools/{pool}/proxy{case.path}",
                                     "BENCH_AUTH": BENCH_KEY},
                                    seconds, connections, load_core)
                    rows.append(Row(case, direct, proxied, server.cpu_seconds() - before))
    return rows


def _load(url: str, env: dict[str, str], seconds: int, connections: int,
          core: int | None) -> loadgen.LoadResult:
    result = loadgen.wrk(url, "proxy", "call", seconds, connections,
                         {**env, "BENCH_NONCE": uuid.uuid4().hex[:8]}, prefix=_pinned(core))
    if result.unexpected or result.socket_errors:
        raise RuntimeError(f"unexpected answers: {result.samples or result.socket_errors}")
    return result


def report(rows: list[Row], store: str, connections: int, pinned: bool) -> list[str]:
    ms = lambda us: f"{us / 1000:.2f}"  # noqa: E731
    lines = [
        f"### Proxy mode over calling the upstream directly ({store}, {connections} "
        f"connections{', pinned' if pinned else ''})",
        "",
        "| case | direct req/s | proxied req/s | direct p50 / p99 ms | proxied p50 / p99 ms "
        "| added p50 / p99 ms | fencepost CPU per proxied request |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        d, p = row.direct, row.proxied
        lines.append(
            f"| {row.case.name} | {d.ops_per_s:,.0f} | {p.ops_per_s:,.0f} "
            f"| {ms(d.p50_us)} / {ms(d.p99_us)} | {ms(p.p50_us)} / {ms(p.p99_us)} "
            f"| {ms(p.p50_us - d.p50_us)} / {ms(p.p99_us - d.p99_us)} "
            f"| {row.cpu_us_per_request:,.0f} µs |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--pg-url", default=DEFAULT_PG_ADMIN_URL)
    parser.add_argument("--no-pin", action="store_true")
    args = parser.parse_args()
    rows = measure(args.seconds, args.connections, args.store, not args.no_pin, args.pg_url)
    info = machine.describe(sys.executable)
    print(f"machine: {info}")
    print("\n".join(report(rows, args.store, args.connections, not args.no_pin)))


if __name__ == "__main__":
    main()
