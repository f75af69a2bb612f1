"""Replicas on one PostgreSQL database: workload (a) against 1, 2, 3... servers.

Each replica is a `fencepost serve` on the same fresh database; the load is
split evenly (one wrk per replica, connections / N each, all at once), so the
total offered load is the same for every N. Reported per N: the summed ops/s,
the worst replica's p50 and p99, and the CPU time per op of every replica and
the database's backends together.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from fpbench import loadgen, procs
from fpbench.systems import BENCH_KEY, Fencepost


@dataclass
class ScalingRow:
    replicas: int
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    server_cpu_us_per_op: float
    status: str = "ok"
    reason: str = ""


@contextlib.contextmanager
def _fleet(count: int, pg_admin_url: str, workdir: Path) -> Iterator[list[Fencepost]]:
    """`count` servers on one fresh database (the first creates and drops it)."""
    first = Fencepost("fencepost-postgresql", store="postgresql", pg_admin_url=pg_admin_url)
    with contextlib.ExitStack() as stack:
        (workdir / "0").mkdir(parents=True, exist_ok=True)
        stack.enter_context(first.running(workdir / "0"))
        fleet = [first]
        for index in range(1, count):
            other = Fencepost("fencepost-postgresql", store="postgresql",
                              pg_admin_url=pg_admin_url)
            other.store_url = first.store_url
            (workdir / str(index)).mkdir(parents=True, exist_ok=True)
            stack.enter_context(_replica_of(other, workdir / str(index)))
            fleet.append(other)
        yield fleet


@contextlib.contextmanager
def _replica_of(server: Fencepost, workdir: Path) -> Iterator[Fencepost]:
    """Another server on `server.store_url` (a database someone else created)."""
    from fpbench.systems import venv_python

    server.port = procs.free_port()
    server.proc = procs.start(
        [venv_python(), "-m", "fencepost", "serve", "--store", server.store_url,
         "--host", "127.0.0.1", "--port", str(server.port),
         "--access-log", str(workdir / "access.log")],
        workdir / "server.log", env={"FENCEPOST_BOOTSTRAP_KEY": BENCH_KEY}, cwd=workdir)
    try:
        server._wait_healthy(workdir / "server.log")
        yield server
    finally:
        procs.stop(server.proc)


def _load_all(fleet: list[Fencepost], seconds: int, connections: int
              ) -> list[loadgen.LoadResult]:
    share = max(1, connections // len(fleet))
    results: list[loadgen.LoadResult | BaseException] = [RuntimeError("no result")] * len(fleet)

    def one(index: int) -> None:
        env = {"BENCH_NONCE": uuid.uuid4().hex[:10], "FENCEPOST_API_KEY": BENCH_KEY}
        try:
            results[index] = loadgen.wrk(fleet[index].base_url, "fencepost", "a", seconds,
                                         share, env)
        except BaseException as exc:  # noqa: BLE001 - reported for this replica count
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(fleet))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise loadgen.LoadError(str(result))
    return [r for r in results if isinstance(r, loadgen.LoadResult)]


def _cpu(fleet: list[Fencepost]) -> float:
    # The first server's count includes the database's backends (all replicas').
    return fleet[0].cpu_seconds() + sum(procs.cpu_seconds(s.proc.pid) for s in fleet[1:]
                                        if s.proc is not None)


def measure(counts: list[int], seconds: int, connections: int, warmup: int,
            pg_admin_url: str, workdir: Path, say: Callable[[str], None]) -> list[ScalingRow]:
    rows = []
    for count in counts:
        say(f"== fencepost-postgresql, {count} replica(s), workload (a): {seconds} s ...")
        try:
            with _fleet(count, pg_admin_url, workdir / f"replicas-{count}") as fleet:
                if warmup > 0:
                    _load_all(fleet, warmup, connections)
                cpu0 = _cpu(fleet)
                results = _load_all(fleet, seconds, connections)
                cpu = _cpu(fleet) - cpu0
        except (loadgen.LoadError, RuntimeError, OSError) as exc:
            rows.append(ScalingRow(count, 0, 0, 0, 0, "failed", str(exc)[:300]))
            continue
        requests = sum(r.requests for r in results)
        span = max(r.seconds for r in results)
        row = ScalingRow(
            replicas=count, ops_per_s=requests / span if span else 0.0,
            p50_ms=max(r.p50_us for r in results) / 1000,
            p99_ms=max(r.p99_us for r in results) / 1000,
            server_cpu_us_per_op=1e6 * cpu / max(requests, 1))
        say(f"   {row.ops_per_s:.0f} ops/s, p99 {row.p99_ms:.2f} ms, "
            f"CPU {row.server_cpu_us_per_op:.0f} us/op")
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, object]]) -> list[str]:
    lines = ["", "Replicas on one PostgreSQL database, workload (a), the connections split "
             "evenly over them (p50/p99: the worst replica's; CPU: every replica and the "
             "database's backends, per op):", "",
             "| replicas | ops/s | p50 ms | p99 ms | server CPU µs/op |",
             "|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row["status"] != "ok":
            lines.append(f"| {row['replicas']} | {row['status']}: {row['reason']} | | | |")
        else:
            lines.append(f"| {row['replicas']} | {row['ops_per_s']:.0f} | {row['p50_ms']:.2f} "
                         f"| {row['p99_ms']:.2f} | {row['server_cpu_us_per_op']:.0f} |")
    return lines
