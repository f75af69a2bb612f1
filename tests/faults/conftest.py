"""Faults injected from outside a running `fencepost serve`: wall-clock steps
(libfaketime), a store file deleted, truncated or replaced, a full disk (a
small tmpfs), a file that refuses writes (chattr +i), a restore from an older
copy. FENCEPOST_SOAK=1 repeats each fault more times."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from support import ServerProcess, lock_headers, new_token, unique_name

SOAK = os.environ.get("FENCEPOST_SOAK") == "1"
ROUNDS = 10 if SOAK else 1
UNDER_CI = os.environ.get("CI") == "true"


def missing(what: str) -> None:
    """A tool the suite needs is absent: a failure under CI, a skip elsewhere."""
    if UNDER_CI:
        pytest.fail(f"{what} is required under CI=true")
    pytest.skip(f"{what} is not available")


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


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll until `predicate` holds; fail when it does not within `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


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
    made: list[ServerProcess] = []

    def start(name: str = "server", **fields: Any) -> ServerProcess:
        proc = ServerProcess(tmp_path / name, **fields)
        made.append(proc)
        return proc.start()

    yield start
    for proc in made:
        proc.stop()


class WallClock:
    """A server's wall clock, stepped by the test while the server runs.

    libfaketime, preloaded into the server, re-reads its offset from a file on
    every clock reading (FAKETIME_NO_CACHE); FAKETIME_DONT_FAKE_MONOTONIC keeps
    the monotonic clock true, as an NTP step would. The library is preloaded
    directly, not through the `faketime` wrapper, which forks and would not
    pass SIGTERM on to the server."""

    def __init__(self, folder: Path) -> None:
        tool = shutil.which("faketime")
        if tool is None:
            missing("faketime (apt-get install faketime)")
        assert tool is not None
        # The wrapper knows where its library lives; ask it once.
        probe = subprocess.run([tool, "-m", "-f", "+0", "sh", "-c", "echo $LD_PRELOAD"],
                               capture_output=True, text=True, timeout=10)
        self.library = probe.stdout.strip()
        assert self.library, probe.stderr
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
