"""A store that refuses writes under a running server: every write gets 503
store_unavailable (never a 2xx it did not store, never a 500) and /readyz turns
off; both come back once writes are allowed again (SPEC §7.8).

SQLite: the store's files made immutable (chattr +i); chmod would not do, as
a process that already has a file open keeps writing it, and root ignores file
modes. PostgreSQL: the database set to read-only and its sessions ended, so
the replica's next sessions are read-only."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import psycopg
import pytest

from pg_support import ADMIN_URL, temporary_database
from support import ServerProcess, missing, new_token, unique_name, wait_until

from .conftest import ROUNDS, acquire, assert_unavailable, get, grant_some


def chattr(flag: str, *files: Path) -> None:
    done = subprocess.run(["chattr", flag, *map(str, files)], capture_output=True, text=True,
                          timeout=30)
    if done.returncode != 0:
        # The filesystem (an overlay, say) has no immutable flag: that is the
        # machine refusing the fault, as a refused mount is.
        pytest.skip(f"chattr {flag} is refused here: {done.stderr.strip()}")


@pytest.fixture
def immutable() -> Iterator[Callable[[list[Path]], None]]:
    """Make files immutable; every one is made mutable again afterwards, so
    the test's folder can be removed."""
    if shutil.which("chattr") is None:
        missing("chattr (e2fsprogs)")
    made: list[Path] = []

    def freeze(files: list[Path]) -> None:
        made.extend(files)
        chattr("+i", *files)

    yield freeze
    if made:
        subprocess.run(["chattr", "-i", *map(str, made)], capture_output=True, timeout=30)


def test_an_immutable_sqlite_store_refuses_writes(
    servers: Callable[..., ServerProcess], immutable: Callable[[list[Path]], None]
) -> None:
    server = servers("server")
    files = [Path(f"{server.db_path}{suffix}") for suffix in ("", "-wal")]
    granted = grant_some(server, 3)
    for _ in range(ROUNDS):
        immutable(files)
        assert_unavailable(acquire(server, unique_name("refused"), new_token()))
        wait_until(lambda: get(server, "/readyz").status_code == 503, "/readyz to turn off")
        assert get(server, "/livez").status_code == 200
        chattr("-i", *files)
        wait_until(lambda: get(server, "/readyz").status_code == 200, "/readyz to come back")
        granted += grant_some(server, 3)
    assert "Traceback" not in server.stderr_path.read_text()
    server.stop()
    again = servers("server")
    with again.client() as c:
        for key, token in granted:
            assert c.get(f"/v1/locks/{key}").json()["fencing_token"] == token


def set_read_only(url: str, on: bool) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = {on}')
        # Sessions keep the setting they began with: end them, as a failover does.
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))


def grant_after_read_only(replica: ServerProcess, count: int) -> list[tuple[str, int]]:
    """`count` fresh locks once writes are allowed again. The writer's
    connections the database ended, or opened read-only, while writes were
    refused are found out at the first use of one of them: that one request
    may get 503 store_unavailable (loud, nothing acknowledged), and every
    connection opened before it is replaced before its next batch. /readyz
    may already be back by then (a health probe's write on a fresh connection
    succeeded), so one write may be refused; never more."""
    grants: list[tuple[str, int]] = []
    refused = 0
    while len(grants) < count:
        key = unique_name("fault")
        resp = acquire(replica, key, new_token())
        if resp.status_code == 503:
            assert_unavailable(resp)
            refused += 1
            assert refused <= 1, resp.text
            continue
        assert resp.status_code == 201, resp.text
        grants.append((key, int(resp.json()["fencing_token"])))
    return grants


def test_a_postgresql_database_that_refuses_writes_gets_503(
    servers: Callable[..., ServerProcess],
) -> None:
    with temporary_database() as url:
        replica = servers("replica", store=url)
        granted = grant_some(replica, 3)
        for _ in range(ROUNDS):
            set_read_only(url, True)

            def refused_as_read_only() -> bool:
                # Every answer is a 503: first for the ended sessions, then
                # for the read-only ones.
                resp = acquire(replica, unique_name("refused"), new_token())
                assert_unavailable(resp)
                return "read-only" in resp.text

            wait_until(refused_as_read_only, "writes to be refused as read-only")
            wait_until(lambda: get(replica, "/readyz").status_code == 503, "/readyz to turn off")
            assert get(replica, "/livez").status_code == 200
            set_read_only(url, False)
            wait_until(lambda: get(replica, "/readyz").status_code == 200, "/readyz to come back")
            granted += grant_after_read_only(replica, 3)
        with replica.client() as c:
            for key, token in granted:
                # A read may still meet a connection being replaced after the
                # database came back (503, retried by clients); then the lease.
                deadline = time.monotonic() + 10
                resp = c.get(f"/v1/locks/{key}")
                while resp.status_code == 503 and time.monotonic() < deadline:
                    time.sleep(0.1)
                    resp = c.get(f"/v1/locks/{key}")
                assert resp.status_code == 200, resp.text
                assert resp.json()["fencing_token"] == token
        assert "Traceback" not in replica.stderr_path.read_text()
        replica.stop()


def _as_role(url: str, role: str) -> str:
    return url.replace("postgres@", f"{role}:pw@", 1)


def test_a_postgresql_role_whose_write_privileges_are_revoked_gets_503(
    servers: Callable[..., ServerProcess],
) -> None:
    """The operator revokes fencepost's role's right to write (or a grant goes
    missing in a migration of their own): every change is 503 store_unavailable
    and /readyz turns off, so load balancers stop sending traffic; reads go
    on; granting back brings writes back without a restart."""
    role = f"fp_{new_token()[:8]}"
    with temporary_database() as url, psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
        try:
            admin.execute(f"GRANT ALL ON SCHEMA public TO {role}")
            # The role migrates the empty database, so it owns the tables; a
            # superuser's REVOKE binds an owner too.
            replica = servers("replica", store=_as_role(url, role))
            admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
            admin.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
            granted = grant_some(replica, 2)
            for _ in range(ROUNDS):
                admin.execute(f"REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public "
                              f"FROM {role}")
                refused = acquire(replica, unique_name("refused"), new_token())
                assert_unavailable(refused)
                assert "permission denied" in refused.text
                wait_until(lambda: get(replica, "/readyz").status_code == 503,
                           "/readyz to turn off")
                with replica.client() as c:  # reads go on
                    key, token = granted[0]
                    assert c.get(f"/v1/locks/{key}").json()["fencing_token"] == token
                admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
                wait_until(lambda: get(replica, "/readyz").status_code == 200,
                           "/readyz to come back")
                granted += grant_after_read_only(replica, 2)
            assert "Traceback" not in replica.stderr_path.read_text()
            replica.stop()
        finally:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def test_an_immutable_shared_memory_file_is_refused_not_a_crash(
    servers: Callable[..., ServerProcess], immutable: Callable[[list[Path]], None]
) -> None:
    """The WAL index (-shm) is written through a shared mapping: made immutable,
    the next write through it would kill the server with SIGBUS. Every request
    that needs the store gets 503 instead, /readyz is off, the process lives on,
    and service resumes once the file may be written again."""
    server = servers("server")
    shm = Path(f"{server.db_path}-shm")
    granted = grant_some(server, 2)
    for _ in range(ROUNDS):
        immutable([shm])
        assert_unavailable(acquire(server, unique_name("refused"), new_token()))
        with server.client() as c:  # reads too: a reader writes its read mark there
            key, _ = granted[0]
            assert c.get(f"/v1/locks/{key}").status_code == 503
        wait_until(lambda: get(server, "/readyz").status_code == 503, "/readyz to turn off")
        assert server.proc is not None and server.proc.poll() is None, "the server died"
        chattr("-i", shm)
        wait_until(lambda: get(server, "/readyz").status_code == 200, "/readyz to come back")
        granted += grant_some(server, 2)
    assert server.proc is not None and server.proc.poll() is None
    assert "Traceback" not in server.stderr_path.read_text()


_CHECKPOINT_AFTER_FREEZE = """
import sqlite3, subprocess, sys, time
from fencepost.store.checkpoints import Checkpointer

path = sys.argv[1]

def connect():
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    return conn

writer = connect()
writer.execute("CREATE TABLE t (x)")
checkpoints = Checkpointer(path, connect)
checkpoints.nudge()  # the first checkpoint runs at once
time.sleep(0.3)
for i in range(200):
    writer.execute("INSERT INTO t VALUES (?)", (i,))
subprocess.run(["chattr", "+i", path + "-shm"], check=True)
checkpoints.nudge()  # the next is due half a second after the first: after the freeze
time.sleep(1.5)
print("alive, restarts:", checkpoints.restarts, flush=True)
subprocess.run(["chattr", "-i", path + "-shm"], check=True)
time.sleep(1.0)  # writable again: the copy it owes is made now
print("after:", checkpoints.restarts, flush=True)
checkpoints.stop()
"""


def test_the_checkpoint_thread_waits_for_a_writable_shared_memory_file(tmp_path: Path) -> None:
    """The checkpoint thread writes the WAL index too: with the -shm file made
    immutable it must wait, not die of SIGBUS (run in a child process, where
    a SIGBUS is an exit status instead of the end of the test run)."""
    if shutil.which("chattr") is None:
        missing("chattr (e2fsprogs)")
    path = tmp_path / "store.db"
    probe = tmp_path / "probe"  # skips where the filesystem has no immutable flag
    probe.write_text("")
    chattr("+i", probe)
    chattr("-i", probe)
    done = subprocess.run([sys.executable, "-c", _CHECKPOINT_AFTER_FREEZE, str(path)],
                          capture_output=True, text=True, timeout=60)
    subprocess.run(["chattr", "-i", f"{path}-shm"], capture_output=True, timeout=30)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert lines[0] == "alive, restarts: 1"
    assert int(lines[1].split()[-1]) >= 2
