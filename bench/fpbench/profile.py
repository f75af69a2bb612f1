"""Optional sampling profile of the fencepost server during a measured workload.

`bench/run.py --profile` runs py-spy (not a project dependency: `pip install
py-spy`, on PATH or in .venv) against the `fencepost serve` process for the
measured window, without pausing it (--nonblocking), and writes to
<results-dir>/profiles/<stamp>/: the collapsed stacks (`*.collapsed`, for
flamegraph.pl or speedscope) and a summary (`*.top.txt`) of the functions with
the most samples, by self time and inclusive time, per thread.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
from pathlib import Path

from fpbench.systems import ROOT

RATE_HZ = 200


def py_spy() -> str | None:
    found = shutil.which("py-spy")
    if found:
        return found
    candidate = ROOT / ".venv" / "bin" / "py-spy"
    return str(candidate) if candidate.exists() else None


def start(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes] | None:
    binary = py_spy()
    if binary is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [binary, "record", "-p", str(pid), "-d", str(seconds), "-r", str(RATE_HZ),
         "--threads", "--nonblocking", "--format", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def finish(proc: subprocess.Popen[bytes], out: Path) -> Path | None:
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if not out.exists():
        return None
    summary = out.with_suffix(".top.txt")
    summary.write_text(summarize(out.read_text()))
    return summary


def _frame(text: str) -> str:
    return re.sub(r":\d+\)$", ")", text)


def summarize(collapsed: str, top: int = 30) -> str:
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        threads[frames[0].split("): ", 1)[-1]] += n
        total += n
        calls = [_frame(f) for f in frames[1:]]
        if calls:
            self_time[calls[-1]] += n
        for call in set(calls):
            inclusive[call] += n
    if not total:
        return "no samples\n"
    lines = [f"{total} samples at {RATE_HZ} Hz (busy threads only)", "", "by thread:"]
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in threads.most_common()]
    lines += ["", "self time:"]
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in self_time.most_common(top)]
    lines += ["", "inclusive time (fencepost, starlette, uvicorn frames):"]
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in inclusive.most_common()
              if any(part in name for part in ("fencepost/", "starlette/", "uvicorn/"))
              and n / total >= 0.02][:top]
    return "\n".join(lines) + "\n"
