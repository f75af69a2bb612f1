"""Child processes on loopback: free ports, readiness, CPU accounting, clean stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

LOOPBACK = "127.0.0.1"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes] | None, timeout: float = 30.0) -> None:
    """Wait until something accepts on 127.0.0.1:port (or the process died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} before listening")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {LOOPBACK}:{port} after {timeout:.0f} s")


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a server in its own process group, output to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM the process (and its group), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process, all its threads (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def tree_cpu_seconds(pid: int) -> float:
    """cpu_seconds of `pid` and of its children (a supervisor's workers)."""
    total = cpu_seconds(pid)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:  # fields[1] is field 4, the parent
            total += cpu_seconds(int(stat.parent.name))
    return total


def tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""
