"""Fixtures for the CLI's tests (against the shared real server)."""

from __future__ import annotations

import pytest

from cli_support import cli_env
from support import ServerProcess


@pytest.fixture(scope="session")
def member_secret(server: ServerProcess) -> str:
    return str(server.create_key("member", name="cli-tests")["key"])


@pytest.fixture
def admin_env(server: ServerProcess) -> dict[str, str]:
    return cli_env(server)


@pytest.fixture
def member_env(server: ServerProcess, member_secret: str) -> dict[str, str]:
    return cli_env(server, member_secret)
