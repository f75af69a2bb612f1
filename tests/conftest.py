from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support import ServerProcess  # noqa: E402


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One shared server for tests that only need isolated lock names."""
    proc = ServerProcess(tmp_path_factory.mktemp("shared-server")).start()
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
