"""Several `fencepost serve` replicas on one PostgreSQL database."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest
from pg_private import PrivatePostgres, private_root

from pg_support import temporary_database
from replicas.standby_pair import Pair
from support import WAKE_UPS_ONLY, ServerProcess, faketime_library, server_fleet


@pytest.fixture
def pg_url() -> Iterator[str]:
    with temporary_database() as url:
        yield url


@pytest.fixture
def start_replica(tmp_path: Path, pg_url: str) -> Iterator[Callable[..., ServerProcess]]:
    with server_fleet(tmp_path) as start_server:

        def start(name: str, command_prefix: list[str] | None = None, **env: str
                  ) -> ServerProcess:
            return start_server(name, store=pg_url, extra_env=env,
                                command_prefix=command_prefix or [])

        yield start


@pytest.fixture
def replicas(start_replica: Callable[..., ServerProcess]) -> list[ServerProcess]:
    return [start_replica(name) for name in ("a", "b", "c")]


@pytest.fixture
def wake_replicas(start_replica: Callable[..., ServerProcess]) -> list[ServerProcess]:
    """Three replicas whose waiters are granted only through wake-ups (no
    safety wake, support.WAKE_UPS_ONLY), for the tests of wake-ups across
    replicas: a lost NOTIFY then shows as a waiter that waited its whole wait."""
    return [start_replica(name, **WAKE_UPS_ONLY) for name in ("a", "b", "c")]


def faketime_prefix(offset: str) -> list[str]:
    """Run a replica with its wall clock moved by `offset` (e.g. "+600s"), its
    monotonic clock left alone; libfaketime changes the process's clock only.

    The library is preloaded through `env`, which execs the server in its own
    process, rather than through the `faketime` command, which forks: the
    server would then be its grandchild, and neither a stop signal nor the
    parent-death signal would reach it (it kept running after the test)."""
    return ["env", f"LD_PRELOAD={faketime_library()}", f"FAKETIME={offset}",
            "FAKETIME_DONT_FAKE_MONOTONIC=1"]


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    """A PostgreSQL server of the test's own, which it may stop or crash."""
    with private_root() as root:
        pg = PrivatePostgres(root / "pg")
        pg.start()
        try:
            yield pg
        finally:
            pg.stop()


@pytest.fixture
def pair() -> Iterator[Pair]:
    """A primary and a standby streaming through a relay, the standby's clock
    30 minutes behind (tests/replicas/standby_pair.py)."""
    with private_root() as root:
        made = Pair(root, standby_clock="-30m")
        try:
            yield made
        finally:
            made.stop()
