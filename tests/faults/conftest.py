"""Faults injected from outside a running `fencepost serve`: wall-clock steps
(libfaketime), a store file deleted, truncated or replaced, a full disk (a
small tmpfs), a file that refuses writes (chattr +i), a restore from an older
copy. FENCEPOST_SOAK=1 repeats each fault more times."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from support import (
    ServerProcess,
    faketime_library,
    lock_headers,
    new_token,
    server_fleet,
    unique_name,
)

SOAK = os.environ.get("FENCEPOST_SOAK") == "1"
ROUNDS = 10 if SOAK else 1


def acquire(server: ServerProcess, key: str, token: str, ttl: int = 60) -> httpx.Response:
    with server.client() as c:
        return c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                     json={"ttl_seconds": ttl})


def renew(server: ServerProcess, key: str, token: str, ttl: int = 60) -> httpx.Response:
    with server.client() as c:
        return c.patch(f"/v1/locks/{key}/lease", headers=lock_headers(token),
                       json={"ttl_seconds": ttl})


def get(server: ServerProcess, path: str) -> httpx.Response:
    return httpx.get(f"{server.base_url}{path}", timeout=10)


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "store_unavailable", response.text


def grant_some(server: ServerProcess, count: int) -> list[tuple[str, int]]:
    """`count` fresh locks; their keys and fencing tokens."""
    grants = []
    for _ in range(count):
        key = unique_name("fault")
        resp = acquire(server, key, new_token())
        assert resp.status_code == 201, resp.text
        grants.append((key, int(resp.json()["fencing_token"])))
    return grants


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start servers (`name`, ServerProcess fields); every one is stopped after
    the test, whatever happened."""
    with server_fleet(tmp_path) as start:
        yield start


class WallClock:
    """A server's wall clock, stepped by the test while the server runs.

    libfaketime, preloaded into the server, re-reads its offset from a file on
    every clock reading (FAKETIME_NO_CACHE); FAKETIME_DONT_FAKE_MONOTONIC keeps
    the monotonic clock true, as an NTP step would. The library is preloaded
    directly, not through the `faketime` wrapper, which forks and would not
    pass SIGTERM on to the server."""

    def __init__(self, folder: Path) -> None:
        self.library = faketime_library(multithreaded=True)
        folder.mkdir(parents=True, exist_ok=True)
        self.file = folder / f"faketime-{uuid.uuid4().hex[:8]}.rc"
        self.step(0)

    def step(self, seconds: int) -> None:
        """Set the wall clock `seconds` away from the true time (not cumulative)."""
        partial = self.file.with_suffix(".tmp")
        partial.write_text(f"{seconds:+d}\n")
        partial.replace(self.file)  # never a half-written offset

    def env(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": self.library,
            "FAKETIME_TIMESTAMP_FILE": str(self.file),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where`, unmounted afterwards; skips (also
    under CI) only when the machine refuses the mount."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"this machine refuses to mount a tmpfs: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def fill(folder: Path) -> Path:
    """Fill the filesystem of `folder` to the last byte; return the filler."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        size = 1 << 20
        while size >= 512:
            try:
                os.write(fd, b"\0" * size)  # a short write, then ENOSPC, at the end
            except OSError:
                size //= 2
    finally:
        os.close(fd)
    return filler
