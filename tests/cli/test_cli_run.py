"""`fencepost run`: holds the lock or slot exactly while CMD runs, passes the
fencing token, exits with CMD's code, stops CMD when the lease is lost,
forwards signals, and always releases."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from cli_support import assert_clean_failure, fp
from support import ServerProcess, track, unique_name


def start(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """`fencepost run ...` in a session of its own (no controlling terminal)."""
    return track(subprocess.Popen(
        [sys.executable, "-m", "fencepost", *args], env=env, text=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    ))


def wait_for_file(path: Path, timeout: float = 15) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def lock_held(server: ServerProcess, key: str) -> bool:
    with server.client() as c:
        return bool(c.get(f"/v1/locks/{key}").json()["held"])


def test_run_passes_the_token_and_returns_the_exit_code(server: ServerProcess,
                                                        member_env: dict[str, str]) -> None:
    key = unique_name()
    script = ('echo "$FENCEPOST_LOCK_KEY $FENCEPOST_FENCING_TOKEN"; '
              f'curl -s "$FENCEPOST_URL/v1/locks/{key}" >/dev/null 2>&1; exit 7')
    out = fp("run", "--lock", key, "--ttl", "30", "--", "sh", "-c", script, env=member_env)
    assert out.returncode == 7, out.stderr
    got_key, token = out.stdout.split()
    assert got_key == key and int(token) > 0
    assert not lock_held(server, key)  # released on exit
    assert fp("run", "--lock", key, "--", "true", env=member_env).returncode == 0


def test_run_token_is_the_holders(server: ServerProcess, member_env: dict[str, str],
                                  tmp_path: Path) -> None:
    key = unique_name()
    seen = tmp_path / "seen"
    proc = start("run", "--lock", key, "--", "sh", "-c",
                 f'echo $FENCEPOST_FENCING_TOKEN > {seen}; sleep 30', env=member_env)
    try:
        token = int(wait_for_file(seen))
        with server.client() as c:
            assert c.get(f"/v1/locks/{key}").json()["fencing_token"] == token
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert not lock_held(server, key)


def test_run_stops_cmd_when_the_lease_is_lost(server: ServerProcess,
                                              member_env: dict[str, str],
                                              tmp_path: Path) -> None:
    key = unique_name()
    pids = tmp_path / "pids"
    # CMD ignores SIGTERM and has a child of its own: both must be gone afterwards.
    script = f'trap "" TERM; sleep 300 & echo "$$ $!" > {pids}; while true; do sleep 0.1; done'
    proc = start("run", "--lock", key, "--ttl", "6", "--grace", "1", "--", "sh", "-c", script,
                 env=member_env)
    shell_pid, child_pid = map(int, wait_for_file(pids).split())
    with server.client() as c:
        assert c.delete(f"/v1/locks/{key}").json()["released"] is True
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 4, stderr
    assert "lost (force_released)" in stderr and "killing it" in stderr
    assert "Traceback" not in stderr
    deadline = time.monotonic() + 5
    while (alive(shell_pid) or alive(child_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(shell_pid) and not alive(child_pid)


def test_run_lost_lease_with_cooperative_cmd(server: ServerProcess,
                                             member_env: dict[str, str],
                                             tmp_path: Path) -> None:
    key = unique_name()
    ready = tmp_path / "ready"
    got = tmp_path / "got"
    script = f'trap "echo TERM > {got}; exit 0" TERM; echo go > {ready}; ' \
             'while true; do sleep 0.1; done'
    proc = start("run", "--lock", key, "--ttl", "6", "--", "sh", "-c", script, env=member_env)
    wait_for_file(ready)
    with server.client() as c:
        c.delete(f"/v1/locks/{key}")
    proc.communicate(timeout=30)
    assert proc.returncode == 4  # even though CMD exited 0: its lease was lost
    assert got.read_text().strip() == "TERM"


def test_run_forwards_signals_and_releases(server: ServerProcess, member_env: dict[str, str],
                                           tmp_path: Path) -> None:
    key = unique_name()
    ready = tmp_path / "ready"
    got = tmp_path / "got"
    script = (f'trap "echo HUP >> {got}" HUP; trap "echo TERM >> {got}; exit 3" TERM; '
              f'echo go > {ready}; while true; do sleep 0.1; done')
    proc = start("run", "--lock", key, "--", "sh", "-c", script, env=member_env)
    wait_for_file(ready)
    assert lock_held(server, key)
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "HUP" not in (got.read_text() if got.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert got.read_text().split() == ["HUP", "TERM"]  # each delivered once
    assert proc.returncode == 3  # CMD's own exit code
    assert not lock_held(server, key)


def test_run_when_busy(server: ServerProcess, member_env: dict[str, str],
                       tmp_path: Path) -> None:
    key = unique_name()
    marker = tmp_path / "ran"
    with server.client() as c:
        token = "7a1e1b0e-2f3c-4d5e-8f90-123456789abc"
        c.put(f"/v1/locks/{key}/lease", json={"ttl_seconds": 30, "operation": "backup"},
              headers={"X-Lock-Token": token,
                       "X-Request-Id": "9b1e1b0e-2f3c-4d5e-8f90-123456789abc"})
        busy = fp("run", "--lock", key, "--", "touch", str(marker), env=member_env)
        assert_clean_failure(busy, 3)
        assert "busy" in busy.stderr
        quiet = fp("run", "--lock", key, "--busy-exit-code", "0", "--", "touch", str(marker),
                   env=member_env)
        assert quiet.returncode == 0
        assert not marker.exists()

        waiting = start("run", "--lock", key, "--wait", "20", "--", "touch", str(marker),
                        env=member_env)
        time.sleep(1.0)
        assert waiting.poll() is None
        c.delete(f"/v1/locks/{key}/lease", headers={"X-Lock-Token": token})
        waiting.communicate(timeout=30)
    assert waiting.returncode == 0 and marker.exists()


def test_run_exit_codes_for_signals_and_missing_commands(server: ServerProcess,
                                                         member_env: dict[str, str]) -> None:
    key = unique_name()
    killed = fp("run", "--lock", key, "--", "sh", "-c", "kill -KILL $$", env=member_env)
    assert killed.returncode == 128 + signal.SIGKILL
    missing = fp("run", "--lock", key, "--", "/definitely/not/here", env=member_env)
    assert_clean_failure(missing, 127)
    assert "command not found" in missing.stderr
    not_exec = fp("run", "--lock", key, "--", "/etc/hostname", env=member_env)
    assert_clean_failure(not_exec, 126)
    assert not lock_held(server, key)


def test_run_with_a_pool_slot_reports_the_outcome(server: ServerProcess,
                                                  admin_env: dict[str, str],
                                                  member_env: dict[str, str]) -> None:
    pool = unique_name("pool")
    assert fp("pool", "set", pool, "--limit", "1", "--term-ms", "3000",
              env=admin_env).returncode == 0
    ok = fp("run", "--pool", pool, "--", "sh", "-c",
            'test -n "$FENCEPOST_SLOT_ID" && test "$FENCEPOST_POOL" = ' + pool, env=member_env)
    assert ok.returncode == 0, ok.stderr
    assert fp("run", "--pool", pool, "--", "sh", "-c", "exit 75",
              env=member_env).returncode == 75
    assert fp("run", "--pool", pool, "--", "false", env=member_env).returncode == 1
    with httpx.Client(base_url=server.base_url,
                      headers={"Authorization": f"Bearer {server.admin_key}"}) as c:
        state = c.get(f"/v1/pools/{pool}").json()
    assert state["in_use"] == 0
    assert state["stats"]["released"] == 3
    # Exit 75 was reported as a 429 with one throttle (SPEC §4.4 `throttled`).
    assert state["stats"]["throttled"] == 1
