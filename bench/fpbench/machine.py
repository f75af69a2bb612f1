"""What the numbers were measured on: hardware, OS, and every component's version."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

from fpbench import tools


def _first(path: str, prefix: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def cpu_busy_seconds() -> float:
    """All CPUs' non-idle time since boot (from /proc/stat), to see other load."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def describe(python: str) -> dict[str, Any]:
    mem_kib = _first("/proc/meminfo", "MemTotal").split()[0]
    return {
        "nproc": str(os.cpu_count()),
        "cpu": _first("/proc/cpuinfo", "model name"),
        "memory": f"{int(mem_kib) / 1024 / 1024:.1f} GiB" if mem_kib.isdigit() else "?",
        "kernel": platform.release(),
        "os": _os_name(),
        "python": tools.output([python, "-c", "import sys; print(sys.version.split()[0])"]),
        "sqlite": tools.output([python, "-c", "import sqlite3; print(sqlite3.sqlite_version)"]),
        "wrk": tools.output(["wrk", "-v"]).split(" [")[0],
        "load_average_at_start": load_average(),
        "background_cpu_pct": background_cpu_pct(),
    }


def background_cpu_pct(seconds: float = 2.0) -> int:
    """How busy the machine is before the benchmark starts anything (other users)."""
    before = cpu_busy_seconds()
    time.sleep(seconds)
    busy = cpu_busy_seconds() - before
    return round(100 * busy / ((os.cpu_count() or 1) * seconds))


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.system()
