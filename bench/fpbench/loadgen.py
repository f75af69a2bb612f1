"""The C load generators: wrk (HTTP, Lua scripts in bench/wrk/) and redisload (Redis)."""

from __future__ import annotations

import atexit
import json
import os
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fpbench import tools

BENCH = Path(__file__).resolve().parents[1]
WRK_DIR = BENCH / "wrk"

# wrk Lua script per (system kind, workload)
WRK_SCRIPTS = {
    ("fencepost", "a"): "fencepost_cycle.lua",
    ("fencepost", "b"): "fencepost_renew.lua",
    ("fencepost", "c"): "fencepost_hot.lua",
    ("fencepost", "d"): "fencepost_pool.lua",
    ("proxy", "call"): "proxy_call.lua",
    ("fencepost", "e"): "fencepost_cycle.lua",  # (a), with waiters parked
    ("fencepost", "f"): "fencepost_cycle.lua",  # (a), with a million locks held
    ("etcd", "a"): "etcd_cycle.lua",
    ("etcd", "b"): "etcd_renew.lua",
    ("etcd", "c"): "etcd_hot.lua",
}


@dataclass
class LoadResult:
    requests: int
    seconds: float
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float
    mean_us: float
    ok: int
    unexpected: int
    granted: int
    denied: int
    socket_errors: int
    client_cpu_s: float
    samples: list[str]  # the first unexpected answers, for the report

    @property
    def ops_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


class LoadError(RuntimeError):
    pass


def _parse(stdout: str, client_cpu_s: float, stderr: str) -> LoadResult:
    samples = [line for line in stdout.splitlines() if line.startswith("unexpected:")]
    for line in stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            data = json.loads(line.removeprefix("BENCH_RESULT "))
            return LoadResult(
                requests=int(data["requests"]), seconds=data["duration_us"] / 1e6,
                p50_us=data["p50_us"], p90_us=data["p90_us"], p99_us=data["p99_us"],
                max_us=data["max_us"], mean_us=data["mean_us"], ok=int(data["ok"]),
                unexpected=int(data["unexpected"]), granted=int(data["granted"]),
                denied=int(data["denied"]), socket_errors=int(data["socket_errors"]),
                client_cpu_s=client_cpu_s, samples=samples[:3])
    raise LoadError(f"no result from the load generator: {(stdout + stderr)[-800:]}")


def _run(cmd: list[str], env: dict[str, str], seconds: int) -> LoadResult:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env},
                          timeout=seconds + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise LoadError(f"{Path(cmd[0]).name} exited {done.returncode}: "
                        f"{(done.stdout + done.stderr)[-800:]}")
    return _parse(done.stdout, cpu, done.stderr)


def wrk(url: str, kind: str, workload: str, seconds: int, connections: int,
        env: dict[str, str], prefix: list[str] | None = None) -> LoadResult:
    """wrk with one connection per thread (see bench/wrk/lib.lua for why);
    `prefix` runs it under another command (taskset -c 1)."""
    binary = tools.ensure("wrk", install=False)
    if binary is None:
        raise LoadError("wrk is not installed (apt-get install wrk)")
    script = WRK_DIR / WRK_SCRIPTS[(kind, workload)]
    cmd = [*(prefix or []), binary, f"-t{connections}", f"-c{connections}", f"-d{seconds}s",
           "--timeout", "10s",
           "-s", str(script), url]
    return _run(cmd, env, seconds)


_redisload: Path | None = None


def redisload_binary(install: bool = True) -> Path:
    """Compile bench/redisload.c once per run (into a temp dir)."""
    global _redisload
    if _redisload is not None and _redisload.exists():
        return _redisload
    cc = tools.ensure("cc", install=install)
    if cc is None:
        raise LoadError("no C compiler to build bench/redisload.c (apt-get install gcc)")
    build_dir = tempfile.mkdtemp(prefix="fpbench-redisload-")
    atexit.register(shutil.rmtree, build_dir, True)
    out = Path(build_dir) / "redisload"
    done = subprocess.run([cc, "-O2", "-o", str(out), str(BENCH / "redisload.c")],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise LoadError(f"could not compile redisload.c: {done.stderr[-800:]}")
    _redisload = out
    return out


def redisload(port: int, workload: str, seconds: int, connections: int, nonce: str,
              shas: dict[str, str], install: bool = True) -> LoadResult:
    cmd = [str(redisload_binary(install)), str(port), str(connections), str(seconds), workload,
           nonce, shas["del"], shas["pexpire"], shas["sem_acquire"], shas["sem_release"]]
    return _run(cmd, {}, seconds)
