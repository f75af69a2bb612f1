from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_upstreams import Upstream

from pg_support import server_on
from support import ServerProcess


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server per store for the module: proxy mode holds on both."""
    folder: Path = tmp_path_factory.mktemp("proxy")
    with server_on(request.param, folder) as started:
        yield started


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    made = Upstream()
    yield made
    made.close()
