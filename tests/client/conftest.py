"""Fixtures for the Python client's tests: clients against the shared real server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

import fencepost
from client_support import FAST_RETRIES, AsyncFaultyTransport, FaultyTransport, Recorder
from support import ServerProcess


@pytest.fixture(scope="session")
def member_key(server: ServerProcess) -> str:
    return str(server.create_key("member", name="client-tests")["key"])


@pytest.fixture(scope="session")
def reader_key(server: ServerProcess) -> str:
    return str(server.create_key("reader", name="client-tests-reader")["key"])


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def client(server: ServerProcess, recorder: Recorder) -> Iterator[fencepost.Client]:
    """A sync client with the admin key, through the recording transport."""
    with fencepost.Client(server.base_url, server.admin_key, retries=FAST_RETRIES,
                          transport=FaultyTransport(recorder)) as c:
        yield c


@pytest.fixture
async def aclient(server: ServerProcess,
                  recorder: Recorder) -> AsyncIterator[fencepost.AsyncClient]:
    """An async client with the admin key, through the recording transport."""
    async with fencepost.AsyncClient(server.base_url, server.admin_key, retries=FAST_RETRIES,
                                     transport=AsyncFaultyTransport(recorder)) as c:
        yield c


@pytest.fixture
def admin_http(server: ServerProcess) -> Iterator[httpx.Client]:
    """A plain httpx client (admin key) for acting behind the client's back."""
    with server.client() as c:
        yield c
