"""What the store remembers of ended leases, and for how long (SPEC §6,
`--ended-retention`), on both stores, through the HTTP API:

- within the retention, a late renewal is told why its lease ended and a fence
  check why a token is stale;
- after it, the record is gone (the reason absent, `unknown` for a fence
  check), the lock name keeps no row in the store at all, and a new grant's
  token is still above every one granted before, after a kill -9 and a restart
  too (the token floor is not kept in the lock's rows).

And bad values of the option: one line, exit 2, nothing created."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pg_support import migrated_database
from support import ServerProcess, assert_error, free_port, lock_headers, new_token, wait_for

RETENTION_S = 3


@contextmanager
def _store(kind: str, tmp_path: Path) -> Iterator[str | None]:
    if kind == "sqlite":
        yield None
    else:
        with migrated_database() as url:
            yield url


def _rows(server: ServerProcess, key: str) -> int:
    """Rows anywhere in the store that name the lock or remember its leases."""
    queries = ["SELECT count(*) FROM locks WHERE key = {p}",
               "SELECT count(*) FROM lock_waiters WHERE key = {p}",
               "SELECT count(*) FROM lock_delays WHERE key = {p}",
               "SELECT count(*) FROM ended"]
    if server.store is None:
        with sqlite3.connect(f"file:{server.db_path}?mode=ro", uri=True) as conn:
            return sum(conn.execute(q.format(p="?"), (key,) if "{p}" in q else ()).fetchone()[0]
                       for q in queries)
    with psycopg.connect(server.store, autocommit=True) as conn:
        return sum(conn.execute(q.format(p="%s"), (key,) if "{p}" in q else None)
                   .fetchone()[0] for q in queries)


def _cycle(client: Any, key: str) -> tuple[str, int]:
    lock_token = new_token()
    granted = client.put(f"/v1/locks/{key}/lease", headers=lock_headers(lock_token),
                         json={"ttl_seconds": 30})
    assert granted.status_code == 201, granted.text
    released = client.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": lock_token})
    assert released.json() == {"released": True}
    return lock_token, int(granted.json()["fencing_token"])


def _renewal_reason(client: Any, key: str, lock_token: str) -> Any:
    resp = client.patch(f"/v1/locks/{key}/lease", headers=lock_headers(lock_token),
                        json={"ttl_seconds": 30})
    return assert_error(resp, 409, "lease_lost").get("reason")


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_ended_leases_are_remembered_for_the_retention_then_leave_no_row(
        kind: str, tmp_path: Path) -> None:
    with _store(kind, tmp_path) as url:
        server = ServerProcess(tmp_path / "a", store=url,
                               extra_args=["--ended-retention", f"{RETENTION_S}s"]).start()
        try:
            with server.client() as client:
                lock_token, token = _cycle(client, "kept")
                assert _renewal_reason(client, "kept", lock_token) == "released"
                fence = client.get("/v1/locks/kept/fence", params={"token": token}).json()
                assert (fence["current"], fence["reason"]) == (False, "released")
                assert _rows(server, "kept") == 1  # the one remembered end

                # Forgotten once the retention has passed (the reaper prunes at
                # least every quarter of it).
                forgotten = wait_for(lambda: client.get(
                    "/v1/locks/kept/fence", params={"token": token}).json()["reason"]
                    == "unknown", timeout=RETENTION_S + 10, interval=0.2)
                assert forgotten, "the end was not forgotten after the retention"
                assert _renewal_reason(client, "kept", lock_token) is None
                assert _rows(server, "kept") == 0
            if url is not None:  # said at start when it applies, never otherwise
                with psycopg.connect(url, autocommit=True) as conn:
                    (setting,) = conn.execute("SHOW autovacuum").fetchone()
                warned = "runs with autovacuum off" in server.stderr_path.read_text()
                assert warned == (setting == "off"), setting
            server.kill9()
            server.start()
            with server.client() as client:
                _, after = _cycle(client, "kept")
            assert after > token
        finally:
            server.stop()


@pytest.mark.parametrize("value", ["0s", "-5m", "nan", "1e400", "24x", "", "366.1d"])
def test_a_bad_retention_is_refused_before_anything_is_created(value: str,
                                                               tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fencepost", "serve", "--port", str(free_port()),
         "--store", f"sqlite:///{tmp_path / 'x.db'}", "--ended-retention", value],
        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--ended-retention" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "x.db").exists()
