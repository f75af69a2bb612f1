"""Several `fencepost serve` replicas on one PostgreSQL database."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from pg_support import temporary_database
from support import ServerProcess


@pytest.fixture
def pg_url() -> Iterator[str]:
    with temporary_database() as url:
        yield url


@pytest.fixture
def start_replica(tmp_path: Path, pg_url: str) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def start(name: str, command_prefix: list[str] | None = None, **env: str) -> ServerProcess:
        replica = ServerProcess(
            tmp_path / name, store=pg_url, extra_env=env, command_prefix=command_prefix or []
        )
        started.append(replica)
        return replica.start()

    yield start
    for replica in started:
        replica.stop()


@pytest.fixture
def replicas(start_replica: Callable[..., ServerProcess]) -> list[ServerProcess]:
    return [start_replica(name) for name in ("a", "b", "c")]


def faketime_prefix(offset: str) -> list[str]:
    """Run a replica with its wall clock moved by `offset` (e.g. "+600s"), its
    monotonic clock left alone; libfaketime changes the process's clock only.

    The library is preloaded through `env`, which execs the server in its own
    process, rather than through the `faketime` command, which forks: the
    server would then be its grandchild, and neither a stop signal nor the
    parent-death signal would reach it (it kept running after the test)."""
    tool = shutil.which("faketime")
    if tool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("faketime is required under CI=true (apt-get install faketime)")
        pytest.skip("faketime is not installed")
    # Ask the installed faketime which library it preloads (its path is built in).
    probe = subprocess.run([tool, "-f", "+0", "printenv", "LD_PRELOAD"], capture_output=True,
                           text=True, timeout=30, check=True)
    library = probe.stdout.strip()
    assert library, f"faketime preloads nothing? {probe.stderr}"
    return ["env", f"LD_PRELOAD={library}", f"FAKETIME={offset}",
            "FAKETIME_DONT_FAKE_MONOTONIC=1"]
