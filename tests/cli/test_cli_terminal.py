"""On a terminal: progress while waiting, and Ctrl-C reaches CMD exactly once.
Off a terminal: no progress noise."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from cli_support import fp
from support import ServerProcess, unique_name


def hold_lock(server: ServerProcess, key: str, operation: str) -> str:
    token = str(uuid.uuid4())
    with server.client() as c:
        resp = c.put(f"/v1/locks/{key}/lease", json={"ttl_seconds": 60, "operation": operation},
                     headers={"X-Lock-Token": token, "X-Request-Id": str(uuid.uuid4())})
        assert resp.status_code == 201, resp.text
    return token


def release_lock(server: ServerProcess, key: str, token: str) -> None:
    with server.client() as c:
        c.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": token})


def read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_progress_on_a_terminal(server: ServerProcess, admin_env: dict[str, str]) -> None:
    key = unique_name()
    token = hold_lock(server, key, "nightly-backup")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "fencepost", "lock", "acquire", key,
                             "--wait", "30", "--json"], env=admin_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    try:
        shown = read_until(master, b"nightly-backup", timeout=15)
        assert b"waiting for lock " + key.encode() in shown
        assert b"held by 'nightly-backup'" in shown
        release_lock(server, key, token)
        stdout, _ = proc.communicate(timeout=30)
    finally:
        os.close(master)
    assert proc.returncode == 0
    assert '"fencing_token"' in stdout  # the JSON on stdout is untouched by progress


def test_no_progress_off_a_terminal(server: ServerProcess, admin_env: dict[str, str]) -> None:
    key = unique_name()
    token = hold_lock(server, key, "quiet")
    proc = subprocess.Popen([sys.executable, "-m", "fencepost", "lock", "acquire", key,
                             "--wait", "30"], env=admin_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.5)
    release_lock(server, key, token)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert stderr == ""
    assert "acquired lock" in stdout


def test_ctrl_c_on_a_terminal_reaches_cmd_once(server: ServerProcess,
                                               admin_env: dict[str, str],
                                               tmp_path: Path) -> None:
    key = unique_name()
    got = tmp_path / "got"
    ready = tmp_path / "ready"
    script = (f'trap "echo INT >> {got}; exit 130" INT; echo go > {ready}; '
              'while true; do sleep 0.1; done')
    pid, master = pty.fork()  # the child gets the pty as its controlling terminal
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-m", "fencepost", "run", "--lock", key,
                                   "--", "sh", "-c", script], admin_env)
    try:
        deadline = time.monotonic() + 15
        while not ready.exists() and time.monotonic() < deadline:
            read_until(master, b"\0", timeout=0.1)
        assert ready.exists()
        os.write(master, b"\x03")  # Ctrl-C: the terminal signals the foreground group
        deadline = time.monotonic() + 20
        status = 0
        while time.monotonic() < deadline:
            read_until(master, b"\0", timeout=0.1)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError("fencepost run did not end after Ctrl-C")
    finally:
        os.close(master)
    assert os.waitstatus_to_exitcode(status) == 130
    assert got.read_text().split() == ["INT"]  # once, not forwarded a second time
    assert fp("lock", "show", key, "--json", env=admin_env).stdout.count('"held": false') == 1
