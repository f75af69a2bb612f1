"""Quick measurement behind the choice of HTTP stack (README "Why this stack").

The first row, fencepost's own connection layer, is the chosen one.

Starts the same trivial JSON endpoint on each candidate server/framework, loads
it with wrk (64 connections, one wrk thread) on this machine, and prints
requests/s and p99 with the ratio to the chosen stack. Then runs the real
acquire+release cycle against `fencepost serve` with group commit (workload (a)
of the full benchmark, `bench/run.py`, which compares fencepost with its peers).

    python bench/http_stack.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fpbench import loadgen  # noqa: E402
from fpbench.systems import BENCH_KEY as KEY  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


def wrk(url: str, seconds: int, script: str | None = None) -> tuple[float, float]:
    cmd = ["wrk", "-t1", "-c64", f"-d{seconds}s", "--latency"]
    if script:
        cmd += ["-s", script]
    out = subprocess.run(
        cmd + [url], capture_output=True, text=True, env={**os.environ, "FENCEPOST_API_KEY": KEY}
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    assert p99, out
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    return rps, float(p99.group(1)) * scale


def run_server(
    cmd: list[str], port: int, cwd: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        cmd, cwd=cwd, env={**os.environ, "PYTHONPATH": str(HERE), **(env or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_ready(port)
    return proc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    py = sys.executable
    candidates = {
        "fencepost server/wire.py (httptools+uvloop)": lambda p: [
            py, str(HERE / "stack_apps.py"), str(p)],
        "uvicorn+httptools+uvloop, Starlette": lambda p: [
            py, "-m", "uvicorn", "stack_apps:starlette_app", "--port", str(p),
            "--http", "httptools", "--loop", "uvloop", "--no-access-log", "--log-level", "warning"],
        "uvicorn+httptools+uvloop, raw ASGI": lambda p: [
            py, "-m", "uvicorn", "stack_apps:raw_asgi_app", "--port", str(p),
            "--http", "httptools", "--loop", "uvloop", "--no-access-log", "--log-level", "warning"],
        "uvicorn+h11+asyncio, Starlette": lambda p: [
            py, "-m", "uvicorn", "stack_apps:starlette_app", "--port", str(p),
            "--http", "h11", "--loop", "asyncio", "--no-access-log", "--log-level", "warning"],
        "granian (1 worker), Starlette": lambda p: [
            py, "-m", "granian", "--interface", "asgi", "--port", str(p), "--workers", "1",
            "--log-level", "warning", "stack_apps:starlette_app"],
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in candidates.items():
            port = free_port()
            try:
                proc = run_server(build(port), port, tmp)
            except Exception as exc:  # noqa: BLE001
                rows.append((name, None, None, f"skipped: {exc}"))
                continue
            try:
                rps, p99 = wrk(f"http://127.0.0.1:{port}/ping", args.seconds)
                rows.append((name, rps, p99, ""))
            finally:
                proc.terminate()
                proc.wait()
        port = free_port()
        proc = run_server(
            [py, "-m", "fencepost", "serve", "--port", str(port), "--store",
             f"sqlite:///{tmp}/bench.db", "--access-log", f"{tmp}/access.log"],
            port, tmp, {"FENCEPOST_BOOTSTRAP_KEY": KEY},
        )
        try:
            cycle = loadgen.wrk(f"http://127.0.0.1:{port}", "fencepost", "a", args.seconds, 64,
                                {"FENCEPOST_API_KEY": KEY, "BENCH_NONCE": str(os.getpid())})
            rows.append(("fencepost serve: acquire+release (SQLite, durable)",
                         cycle.ops_per_s, cycle.p99_us / 1000, ""))
        finally:
            proc.terminate()
            proc.wait()
    base = rows[0][1] or 1.0
    print(f"{'stack':55} {'req/s':>9} {'p99 ms':>8} {'ratio':>6}")
    for name, rps, p99, note in rows:
        if rps is None:
            print(f"{name:55} {note}")
        else:
            print(f"{name:55} {rps:9.0f} {p99:8.1f} {rps / base:6.2f}")


if __name__ == "__main__":
    main()
