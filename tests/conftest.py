from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import pg_support  # noqa: E402
import support  # noqa: E402
from support import WAKE_UPS_ONLY, ServerProcess  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Fail the run if a server the tests started is still running at the end of
    the session, or a temporary PostgreSQL database was not dropped. Only what
    this run started or made is checked (other runs may share the machine).
    Set up first, so torn down last: after every other fixture's cleanup."""
    yield
    processes = support.leftover_processes()
    support.kill_leftovers()
    pg_support.drop_template()
    databases = pg_support.leftover_databases()
    pg_support.drop_databases(databases)
    problems = [f"still running: {p}" for p in processes]
    problems += [f"temporary database not dropped: {d}" for d in databases]
    if problems:
        pytest.fail("the tests left things behind:\n" + "\n".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One shared server for tests that only need isolated lock names."""
    proc = ServerProcess(tmp_path_factory.mktemp("shared-server")).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def wake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A shared server whose waiters are granted only through wake-ups (no
    safety wake, support.WAKE_UPS_ONLY), for the tests of wake-ups."""
    proc = ServerProcess(tmp_path_factory.mktemp("wake-server"), extra_env=WAKE_UPS_ONLY).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def reaperless_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose reaper and safety wake are pushed out of reach (test
    hooks): an expired lease frees its lock for a waiter only through the
    waiter's own re-check at the expiry."""
    proc = ServerProcess(
        tmp_path_factory.mktemp("reaperless-server"),
        extra_env={**WAKE_UPS_ONLY, "FENCEPOST_REAP_S": "3600"},
    ).start()
    yield proc
    proc.stop()


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of the test's own, for tests that crash, restart or stop it."""
    proc = ServerProcess(tmp_path / "server").start()
    yield proc
    proc.stop()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[object]:
    """Factory for servers with extra environment; all are stopped afterwards."""
    made: list[ServerProcess] = []

    def factory(name: str = "server", **env: str) -> ServerProcess:
        proc = ServerProcess(tmp_path / name, extra_env=env)
        made.append(proc)
        return proc

    yield factory
    for proc in made:
        proc.stop()
