"""Backends for the Store conformance suite. Every test in this folder runs once
per backend; a later backend joins by adding a parameter here."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import pytest

from fencepost.store.sqlite import SqliteStore


class FakeClock:
    """The store's clock, moved by the test instead of by waiting."""

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> AsyncIterator[SqliteStore]:
    backend = SqliteStore(str(tmp_path / "conformance.db"), clock_ms=clock)
    await backend.open()
    yield backend
    await backend.close()
