"""`fencepost run` never overlaps the next holder: when renewals stop getting
through, CMD and its whole process group are dead before the lease can expire
on the server (SPEC §3.1, §3.2), whatever --grace; and a --grace that cannot
fit in the lease is refused before anything is acquired.

The server here is a fake that grants the lock and then stops answering
renewals (they hang, or get 503), so that the only thing that can stop CMD in
time is `fencepost run`'s own schedule."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from test_cli_run import wait_for_file

from cli_support import assert_clean_failure, cli_env, fp
from support import ServerProcess, lock_headers, new_token, track, unique_name


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class FakeServer(ThreadingHTTPServer):
    """Grants every acquire; renewals hang (`mode="hang"`) or get 503."""

    daemon_threads = True

    def __init__(self, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = mode
        self.released = threading.Event()  # also ends hanging renewals
        self.expires_at: float | None = None  # epoch seconds, as granted
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeServer

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        return dict(json.loads(self.rfile.read(length) or b"{}"))

    def do_PUT(self) -> None:  # acquire
        self.server.requests.append(f"PUT {self.path}")
        body = self._body()
        now = datetime.now(UTC)
        expires = now + timedelta(seconds=body["ttl_seconds"])
        self.server.expires_at = expires.timestamp()
        self._answer(201, {
            "key": self.path.split("/")[3], "fencing_token": 7, "acquired_at": _stamp(now),
            "expires_at": _stamp(expires), "deadline_at": _stamp(now + timedelta(days=90)),
            "operation": body.get("operation"), "on_expiry": "release",
        })

    def do_PATCH(self) -> None:  # renew
        self.server.requests.append(f"PATCH {self.path}")
        self._body()
        if self.server.mode == "hang":
            self.server.released.wait(120)
        self._answer(503, {"error": {"code": "store_unavailable",
                                     "message": "The store is not answering."}})

    def do_DELETE(self) -> None:  # release
        self.server.requests.append(f"DELETE {self.path}")
        self.server.released.set()
        self._answer(200, {"released": True})

    def do_GET(self) -> None:
        self._answer(404, {"error": {"code": "not_found", "message": "No such route."}})


@pytest.fixture
def fake_server(request: pytest.FixtureRequest) -> Iterator[FakeServer]:
    server = FakeServer(request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.released.set()
    server.shutdown()
    server.server_close()


def start_run(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return track(subprocess.Popen(
        [sys.executable, "-m", "fencepost", "run", *args], env=env, text=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True))


def finish(proc: subprocess.Popen[str], pids: Path) -> str:
    """`fencepost run`'s stderr once it exits; on the way out of a failed test,
    kill it and CMD's group (CMD ignores SIGTERM and would hold the pipes open)."""
    try:
        return proc.communicate(timeout=30)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
        if pids.exists() and pids.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pids.read_text().split()[0]), signal.SIGKILL)
        proc.communicate()


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting to be reaped is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.mark.parametrize("fake_server", ["hang", "503"], indirect=True)
def test_cmd_is_dead_before_the_lease_can_expire(fake_server: FakeServer,
                                                 tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # CMD ignores SIGTERM and has a child of its own: only a SIGKILL to the whole
    # group, in time, gets both.
    script = f'trap "" TERM; sleep 300 & echo "$$ $!" > {pids}; while true; do sleep 0.1; done'
    env = cli_env(FENCEPOST_URL=fake_server.url, FENCEPOST_API_KEY="fp_fake_key")
    proc = start_run("--lock", unique_name(), "--ttl", "6", "--grace", "1", "--",
                     "sh", "-c", script, env=env)
    try:
        shell_pid, child_pid = map(int, wait_for_file(pids).split())
        expires_at = fake_server.expires_at
        assert expires_at is not None
        # At the lease's expiry by the server's own grant (the moment the next
        # holder may get the lock), CMD and its child must already be gone.
        time.sleep(max(0.0, expires_at - time.time()))
        assert not running(shell_pid), "CMD outlived its lease"
        assert not running(child_pid), "CMD's child outlived the lease"
    finally:
        stderr = finish(proc, pids)
    assert proc.returncode == 4, stderr
    assert "could not be renewed" in stderr and "killing it" in stderr, stderr
    assert "Traceback" not in stderr
    assert any(r.startswith("PATCH") for r in fake_server.requests), "it never tried to renew"


@pytest.mark.parametrize("fake_server", ["503"], indirect=True)
@pytest.mark.parametrize("ttl, grace", [("10", "9"), ("10", "8"), ("5", "4.5"), ("60", "60")])
def test_a_grace_that_does_not_fit_in_the_lease_is_refused(fake_server: FakeServer,
                                                            tmp_path: Path, ttl: str,
                                                            grace: str) -> None:
    marker = tmp_path / "ran"
    env = cli_env(FENCEPOST_URL=fake_server.url, FENCEPOST_API_KEY="fp_fake_key")
    out = fp("run", "--lock", unique_name(), "--ttl", ttl, "--grace", grace, "--",
             "touch", str(marker), env=env)
    assert_clean_failure(out, 2)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert f"--grace {grace}" in lines[0] and "--ttl" in lines[0], lines[0]
    assert not marker.exists(), "CMD ran"
    assert fake_server.requests == [], "it acquired before refusing"


@pytest.mark.parametrize("fake_server", ["503"], indirect=True)
def test_a_grace_that_fits_runs(fake_server: FakeServer, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    env = cli_env(FENCEPOST_URL=fake_server.url, FENCEPOST_API_KEY="fp_fake_key")
    out = fp("run", "--lock", unique_name(), "--ttl", "10", "--grace", "5", "--",
             "touch", str(marker), env=env)
    assert out.returncode == 0, out.stderr
    assert marker.exists()


def test_a_grant_after_a_long_wait_is_timed_from_a_fresh_renewal(
        server: ServerProcess, member_env: dict[str, str], tmp_path: Path) -> None:
    # The acquire waits longer than its lease's renewal window; timed from when
    # that request was sent, the lease would look nearly over at the grant. A
    # renewal sent at once bounds it properly, and CMD runs its course.
    key, holder = unique_name(), new_token()
    with server.client() as c:
        assert c.put(f"/v1/locks/{key}/lease", headers=lock_headers(holder),
                     json={"ttl_seconds": 60}).status_code == 201
    finished = tmp_path / "finished"
    proc = track(subprocess.Popen(
        [sys.executable, "-m", "fencepost", "run", "--lock", key, "--ttl", "6", "--grace", "1",
         "--wait", "30", "--", "sh", "-c", f"sleep 5; echo done > {finished}"],
        env=member_env, text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True))
    try:
        deadline = time.monotonic() + 15
        with server.client() as c:
            while c.get(f"/v1/locks/{key}").json()["waiters"] != 1:
                assert time.monotonic() < deadline, "fencepost run never got in line"
                time.sleep(0.05)
            time.sleep(5)  # longer than ttl - grace - margin (about 4 s)
            assert c.delete(f"/v1/locks/{key}/lease",
                            headers={"X-Lock-Token": holder}).json()["released"] is True
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert finished.read_text().strip() == "done"


def test_a_grace_that_does_not_fit_in_the_pools_term_is_refused_before_cmd(
        server: ServerProcess, admin_env: dict[str, str], member_env: dict[str, str],
        tmp_path: Path) -> None:
    pool = unique_name("pool")
    assert fp("pool", "set", pool, "--limit", "1", "--term-ms", "3000",
              env=admin_env).returncode == 0
    marker = tmp_path / "ran"
    out = fp("run", "--pool", pool, "--grace", "2", "--", "touch", str(marker), env=member_env)
    assert_clean_failure(out, 2)
    assert "--grace 2 does not fit" in out.stderr and pool in out.stderr, out.stderr
    assert not marker.exists(), "CMD ran"
    with server.client() as c:
        assert c.get(f"/v1/pools/{pool}").json()["in_use"] == 0, "the slot was not released"
    # What fits runs.
    ok = fp("run", "--pool", pool, "--grace", "0.5", "--", "touch", str(marker), env=member_env)
    assert ok.returncode == 0, ok.stderr
    assert marker.exists()


def test_cmd_is_dead_before_its_slot_reaches_the_request_deadline(
        server: ServerProcess, admin_env: dict[str, str], member_env: dict[str, str],
        tmp_path: Path) -> None:
    # Renewals succeed but cannot carry a slot past its request deadline: CMD
    # must be gone by then, or the pool would admit one holder too many.
    pool = unique_name("pool")
    assert fp("pool", "set", pool, "--limit", "1", "--term-ms", "3000",
              "--request-timeout-ms", "5000", env=admin_env).returncode == 0
    pids = tmp_path / "pids"
    # CMD notes when it starts: the slot was granted before that, so its request
    # deadline is at most 5 s later (a few milliseconds of leeway for the test).
    script = (f'date +%s.%N > {pids}.start; trap "" TERM; sleep 300 & echo "$$ $!" > {pids}; '
              'while true; do sleep 0.1; done')
    proc = start_run("--pool", pool, "--", "sh", "-c", script, env=member_env)
    try:
        shell_pid, child_pid = map(int, wait_for_file(pids).split())
        request_deadline = float(Path(f"{pids}.start").read_text()) + 5
        time.sleep(max(0.0, request_deadline - time.time()))
        assert not running(shell_pid), "CMD outlived its slot"
        assert not running(child_pid), "CMD's child outlived its slot"
    finally:
        stderr = finish(proc, pids)
    assert proc.returncode == 4, stderr
    assert "reaches its deadline" in stderr, stderr
