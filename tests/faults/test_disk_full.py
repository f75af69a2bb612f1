"""A full disk under a running server: writes that cannot be stored get 503
store_unavailable (never a 2xx, never a 500), /readyz turns off, and both come
back once there is room again; every write acknowledged before, during and
after is in the store when it restarts (SPEC §7.8).

Two ways to fill the disk from outside: the store on a small tmpfs mounted for
the test (we run as root) and filled to the last byte, and the file-size limit
(RLIMIT_FSIZE) of the running server lowered to its files' size, which fails
its writes the same way on machines that refuse the mount."""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from support import ServerProcess, new_token, unique_name, wait_until

from .conftest import ROUNDS, acquire, fill, get, small_tmpfs


class Full:
    """Makes the store's disk full, then gives the room back."""

    def __init__(self, server: ServerProcess, folder: Path, mounted: bool) -> None:
        self.server, self.folder, self.mounted = server, folder, mounted
        self._filler: Path | None = None

    def start(self) -> None:
        if self.mounted:
            self._filler = fill(self.folder)
            return
        assert self.server.proc is not None
        sizes = [os.path.getsize(p) for p in self.folder.glob("fencepost.db*")]
        # The soft limit only: lowering and raising it needs no privilege.
        limit = max(sizes)
        resource.prlimit(self.server.proc.pid, resource.RLIMIT_FSIZE,
                         (limit, resource.RLIM_INFINITY))

    def stop(self) -> None:
        if self._filler is not None:
            self._filler.unlink()
            self._filler = None
        elif self.server.proc is not None and self.server.proc.poll() is None:
            unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            resource.prlimit(self.server.proc.pid, resource.RLIMIT_FSIZE, unlimited)


@pytest.fixture(params=["tmpfs", "file-size-limit"])
def store_folder(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, bool]]:
    """A folder on a 16 MiB tmpfs (skipped, also under CI, only when the
    machine refuses the mount), or a plain folder whose files the server may
    not grow past their size (RLIMIT_FSIZE, lowered on the running server)."""
    where = tmp_path / "small-disk"
    if request.param == "tmpfs":
        with small_tmpfs(where, "16m") as mounted:
            yield mounted, True
        return
    where.mkdir(parents=True, exist_ok=True)
    yield where, False


def test_a_full_disk_refuses_writes_loudly_and_loses_nothing(
    servers: Callable[..., ServerProcess], store_folder: tuple[Path, bool]
) -> None:
    folder, mounted = store_folder
    url = f"sqlite:///{folder / 'fencepost.db'}"
    server = servers("server", store=url)
    granted: dict[str, int] = {}

    def write_until_refused() -> httpx.Response:
        for _ in range(5000):
            key = unique_name("full-" + "x" * 100)
            resp = acquire(server, key, new_token())
            if resp.status_code != 201:
                return resp
            granted[key] = resp.json()["fencing_token"]
        pytest.fail("5000 writes on a full disk all succeeded")

    for _ in range(ROUNDS):
        full = Full(server, folder, mounted)
        full.start()
        try:
            refused = write_until_refused()
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "store_unavailable", refused.text
            wait_until(lambda: get(server, "/readyz").status_code == 503, "/readyz to turn off")
            assert get(server, "/livez").status_code == 200
        finally:
            full.stop()
        wait_until(lambda: get(server, "/readyz").status_code == 200, "/readyz to come back")
        for _ in range(3):
            key = unique_name("after")
            resp = acquire(server, key, new_token())
            assert resp.status_code == 201, resp.text
            granted[key] = resp.json()["fencing_token"]

    assert "Traceback" not in server.stderr_path.read_text()
    server.stop()
    again = servers("again", store=url)
    with again.client() as c:
        for key, token in granted.items():
            state = c.get(f"/v1/locks/{key}").json()
            assert state["held"] and state["fencing_token"] == token, (key, state)
