"""A PostgreSQL server of the benchmark's own, with the settings it is asked
for (bench/store_growth.py compares autovacuum settings; the machine's shared
server must not be reconfigured). Needs the server binaries and root, to run
them as the postgres user."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fpbench import procs

_BINARIES = Path("/usr/lib/postgresql")


def _as_postgres(*cmd: str) -> None:
    done = subprocess.run(["runuser", "-u", "postgres", "--", *cmd], capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed: {done.stdout}{done.stderr}")


@contextlib.contextmanager
def private_postgres(settings: dict[str, str]) -> Iterator[str]:
    """A started server with `settings` (`-c name=value` each); yields its
    admin URL (user postgres, trust), and stops and removes it after."""
    found = sorted(_BINARIES.glob("*/bin/pg_ctl")) if _BINARIES.exists() else []
    if not found or os.geteuid() != 0 or shutil.which("runuser") is None:
        raise RuntimeError("a private PostgreSQL needs /usr/lib/postgresql/*/bin and root")
    binaries = found[-1].parent
    # Not private to root: the server runs as postgres.
    root = Path(tempfile.mkdtemp(prefix="fpbench-pg-"))
    root.chmod(0o755)
    data = root / "data"
    port = procs.free_port()
    try:
        shutil.chown(root, "postgres")
        _as_postgres(str(binaries / "initdb"), "-D", str(data), "-U", "postgres",
                     "--auth=trust", "-E", "UTF8")
        options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1"
        options += "".join(f" -c {name}={value}" for name, value in settings.items())
        _as_postgres(str(binaries / "pg_ctl"), "-D", str(data), "-w", "-l",
                     str(data / "log.txt"), "-o", options, "start")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(["runuser", "-u", "postgres", "--", str(binaries / "pg_ctl"),
                            "-D", str(data), "-m", "fast", "stop"], capture_output=True,
                           timeout=120)
    finally:
        shutil.rmtree(root, ignore_errors=True)
