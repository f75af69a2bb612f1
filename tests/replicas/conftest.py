"""Several `fencepost serve` replicas on one PostgreSQL database."""

from __future__ import annotations

import shutil
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
    monotonic clock left alone; libfaketime changes the process's clock only."""
    tool = shutil.which("faketime")
    if tool is None:
        import os

        if os.environ.get("CI") == "true":
            pytest.fail("faketime is required under CI=true (apt-get install faketime)")
        pytest.skip("faketime is not installed")
    return ["env", "FAKETIME_DONT_FAKE_MONOTONIC=1", tool, "-f", offset]
