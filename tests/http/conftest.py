"""Fixtures the HTTP tests share: on the shared server, one key of each role per test module
(named after the module, which the key listing then shows) and clients that use them."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from support import ServerProcess


def _module_key(server: ServerProcess, request: pytest.FixtureRequest, role: str) -> str:
    module = request.module.__name__.removeprefix("test_").replace("_", "-")
    return str(server.create_key(role, name=f"{module}-{role}")["key"])


@pytest.fixture(scope="module")
def member_key(server: ServerProcess, request: pytest.FixtureRequest) -> str:
    return _module_key(server, request, "member")


@pytest.fixture(scope="module")
def reader_key(server: ServerProcess, request: pytest.FixtureRequest) -> str:
    return _module_key(server, request, "reader")


@pytest.fixture
def member(server: ServerProcess, member_key: str) -> Iterator[httpx.Client]:
    with server.client(member_key) as c:
        yield c


@pytest.fixture
def reader(server: ServerProcess, reader_key: str) -> Iterator[httpx.Client]:
    with server.client(reader_key) as c:
        yield c


@pytest.fixture
def admin(server: ServerProcess) -> Iterator[httpx.Client]:
    """A client with the shared server's bootstrap admin key."""
    with server.client() as c:
        yield c
