"""Fixtures for the documentation's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from docs_support import Upstream


@pytest.fixture(scope="session")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.close()
