"""Finding (and, as root, installing from Debian's packages) the tools the benchmark uses."""

from __future__ import annotations

import os
import shutil
import subprocess

# program -> Debian package
PACKAGES = {
    "wrk": "wrk",
    "etcd": "etcd-server",
    "redis-server": "redis-server",
    "cc": "gcc",
}
_updated = False


def can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def ensure(program: str, install: bool = True, timeout: float = 300.0) -> str | None:
    """Path of `program`; when missing and allowed (root, apt), install its package first.

    Returns None when it is still missing: the caller reports the system as skipped.
    """
    found = shutil.which(program)
    if found or not install or not can_install() or program not in PACKAGES:
        return found
    global _updated
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        if not _updated:
            subprocess.run(["apt-get", "update", "-qq"], env=env, timeout=timeout,
                           capture_output=True, check=False)
            _updated = True
        subprocess.run(["apt-get", "install", "-y", "-qq", PACKAGES[program]], env=env,
                       timeout=timeout, capture_output=True, check=False)
    except subprocess.TimeoutExpired:
        return None
    return shutil.which(program)


def output(cmd: list[str], timeout: float = 10.0) -> str:
    """First line of a command's output, or "" when it fails."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else ""
