"""A SQLite file deleted, replaced or truncated under a running server: the
server stops acknowledging (503 store_unavailable, never a 2xx written into the
void, never a 500), /readyz turns off while /livez stays on, and the server's
log says so in one line (SPEC §7.8)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Callable

import pytest

from support import ServerProcess, new_token, unique_name, wait_until

from .conftest import ROUNDS, acquire, assert_unavailable, get, grant_some, renew


def delete(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def delete_file_only(db: Path) -> None:
    db.unlink()


def truncate(db: Path) -> None:
    os.truncate(db, 0)


def replace(db: Path) -> None:
    """Another database renamed over the store, as a careless restore does."""
    other = db.with_name("other.db")
    sqlite3.connect(other).close()
    other.replace(db)


FAULTS = {
    "deleted": delete,
    "deleted-main-file-only": delete_file_only,
    "truncated": truncate,
    "replaced": replace,
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_lost_store_file_stops_acknowledging(
    servers: Callable[..., ServerProcess], fault: str
) -> None:
    for round_ in range(ROUNDS):
        server = servers(f"server-{round_}")
        held_key, holder = unique_name("held"), new_token()
        assert acquire(server, held_key, holder).status_code == 201
        grant_some(server, 5)

        FAULTS[fault](server.db_path)

        # The next write may race the check; from then on nothing is acknowledged.
        wait_until(lambda s=server: get(s, "/readyz").status_code == 503, "/readyz to turn off")
        for _ in range(5):
            assert_unavailable(acquire(server, unique_name("void"), new_token()))
        assert_unavailable(renew(server, held_key, holder))
        with server.client() as c:
            assert_unavailable(c.get(f"/v1/locks/{held_key}"))
        ready = get(server, "/readyz")
        assert ready.json()["error"]["code"] == "store_unavailable"
        assert get(server, "/healthz").status_code == 503
        assert get(server, "/livez").status_code == 200
        log = server.stderr_path.read_text().splitlines()
        assert sum("store lost" in line for line in log) == 1, log
        # The reaper, failing four times a second, says so once.
        assert sum("reaper" in line for line in log) <= 1, log
        assert "Traceback" not in server.stderr_path.read_text()
        server.stop()


def test_a_restart_after_the_file_was_deleted_never_reissues_a_token(
    servers: Callable[..., ServerProcess],
) -> None:
    first = servers("store")
    issued = [token for _, token in grant_some(first, 5)]
    delete(first.db_path)
    wait_until(lambda: get(first, "/readyz").status_code == 503, "/readyz to turn off")
    first.stop()
    # The restarted server finds no store and makes an empty one: every lease
    # is gone (which is why the running one refused to acknowledge), but its
    # fencing counter starts above every token the lost store issued.
    second = servers("store")
    after = grant_some(second, 1)[0][1]
    assert after > max(issued)
