"""SIGHUP reopens the log files (SPEC §6), tested from outside with a real
logrotate run (Debian's package) on deploy/fencepost.logrotate, its paths and
its postrotate command pointed at a running server: the lines written before
the rotation are in the rotated file, every line after it in the new one, with
one worker and with `--workers 2` (each worker writes its own lines: one that
did not reopen would write on into the rotated file). SIGHUP never stops the
server, even while it starts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from support import ServerProcess, lock_headers, missing, new_token, wait_until

ROOT = Path(__file__).resolve().parents[2]

LOGROTATE = Path("/usr/sbin/logrotate")


def _logrotate(workdir: Path, pid: int) -> Path:
    """deploy/fencepost.logrotate with the server's folder for /var/log/fencepost and
    `kill -HUP pid` for the systemctl reload: the configuration a test can run."""
    if not LOGROTATE.exists():
        missing("logrotate (apt-get install logrotate)")
    text = (ROOT / "deploy" / "fencepost.logrotate").read_text()
    assert "/var/log/fencepost/*.log" in text and "systemctl reload fencepost" in text
    text = text.replace("/var/log/fencepost/", f"{workdir}/")
    text = re.sub(r"systemctl reload fencepost\.service[^\n]*", f"kill -HUP {pid}", text)
    config = workdir / "logrotate.conf"
    config.write_text(text)
    return config


def _rotate(config: Path) -> None:
    """One forced rotation (as the daily one would), with a state file of its own."""
    done = subprocess.run([str(LOGROTATE), "--force", "--state", str(config.parent / "state"),
                           str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _acquires(server: ServerProcess, count: int) -> None:
    """`count` acquires and releases, each on a connection of its own: the
    kernel spreads new connections over the workers (SO_REUSEPORT), so with
    two workers each serves about half (all of 40 on one: about 1 in 10^12)."""
    for i in range(count):
        token = new_token()
        with server.client() as client:
            resp = client.put(f"/v1/locks/rotate-{i}/lease", headers=lock_headers(token),
                              json={"ttl_seconds": 30})
            assert resp.status_code == 201, resp.text
            assert client.delete(f"/v1/locks/rotate-{i}/lease",
                                 headers={"X-Lock-Token": token}).status_code == 200


def _workers_answering(server: ServerProcess, tries: int = 40) -> set[str]:
    """The workers that answer /livez on fresh connections."""
    return {httpx.get(f"{server.base_url}/livez", timeout=10).headers.get(
        "x-fencepost-worker", "1") for _ in range(tries)}


def _lines(path: Path, event: str) -> int:
    return sum(1 for line in path.read_text().splitlines() if f'"{event}"' in line)


@pytest.mark.parametrize("workers", [1, 2])
def test_logrotate_moves_the_logs_and_sighup_reopens_them(tmp_path: Path, workers: int) -> None:
    server = ServerProcess(tmp_path, workers=workers,
                           extra_args=["--event-log", str(tmp_path / "events.log")])
    server.start(30)
    try:
        assert server.proc is not None
        config = _logrotate(tmp_path, server.proc.pid)
        _acquires(server, 20)
        time.sleep(0.5)  # lines reach the file within a loop turn
        _rotate(config)
        # delaycompress: the first rotation keeps .1 as it is.
        rotated, rotated_events = tmp_path / "access.log.1", tmp_path / "events.log.1"
        assert rotated.exists() and rotated_events.exists(), sorted(os.listdir(tmp_path))
        # Every process says it reopened (the supervisor passes SIGHUP on).
        wait_until(lambda: server.stderr_path.read_text().count("SIGHUP: reopened")
                   >= workers, "every process reopened its logs", timeout=10)
        assert len(_workers_answering(server)) == workers
        _acquires(server, 40)
        time.sleep(0.5)
        assert server.proc.poll() is None, "SIGHUP stopped the server"
        assert httpx.get(f"{server.base_url}/readyz", timeout=10).status_code == 200
    finally:
        server.stop()
    # Nothing after the rotation went into the rotated files: every acquire
    # before it is in .1, every one after it in the new file.
    assert _lines(rotated, "lock.acquire") == 20
    assert _lines(tmp_path / "access.log", "lock.acquire") == 40
    assert _lines(rotated_events, "lease.granted") == 20
    assert _lines(tmp_path / "events.log", "lease.granted") == 40
    said = server.stderr_path.read_text()
    assert f"reopened access log {tmp_path / 'access.log'}" in said, said[-2000:]
    if workers > 1:
        assert "SIGHUP: passed on to 2 workers" in said


def _ignores_sighup(pid: int) -> bool:
    """Whether the process has set SIGHUP to be ignored (its SigIgn mask)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)))
    return False


def test_sighup_while_starting_does_not_stop_the_server(tmp_path: Path) -> None:
    """From the moment `serve` is the command (before the server's modules
    load, the longest part of its start) to the moment it serves, and after."""
    server = ServerProcess(tmp_path, workers=2)
    server.spawn()
    try:
        assert server.proc is not None
        pid = server.proc.pid
        wait_until(lambda: server.proc is not None and server.proc.poll() is None
                   and _ignores_sighup(pid), "serve ignoring SIGHUP", timeout=30)
        while not server.announced():
            assert server.proc.poll() is None, server.stderr_path.read_text()[-2000:]
            os.kill(pid, signal.SIGHUP)
            time.sleep(0.02)
        server.wait_ready(30)
        os.kill(pid, signal.SIGHUP)
        time.sleep(0.5)
        assert httpx.get(f"{server.base_url}/readyz", timeout=10).status_code == 200
        assert server.proc.poll() is None
    finally:
        server.stop()
