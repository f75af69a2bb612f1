"""`fencepost run` keeps its own credentials from CMD: CMD may be any code, and
the key fencepost holds may be an admin key. `--pass-credentials` hands them
on; every other variable reaches CMD unchanged, and the lease is held and
released as always."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cli_support import fp
from support import ServerProcess, track, unique_name

CREDENTIALS = {
    "FENCEPOST_BOOTSTRAP_KEY": "fp_bootstrap_secret_for_the_run_tests_0123456789",
    "FENCEPOST_METRICS_KEY": "metrics-secret-for-the-run-tests",
    # A store URL may carry a database password.
    "FENCEPOST_STORE": "postgresql://fencepost:db-password-for-the-run-tests@db/fencepost",
}
# Not secrets: a custom variable, and a path (of a file CMD could read anyway).
OTHERS = {"MY_VAR": "my value, with spaces", "FENCEPOST_TLS_KEY": "/etc/fencepost/tls.key"}

# CMD: write its whole environment (atomically) to argv[1], then wait until the
# file argv[2] exists, so that the test can look at the lease while CMD runs.
DUMP_AND_WAIT = """\
import json, os, sys, time
out, go = sys.argv[1], sys.argv[2]
with open(out + ".tmp", "w") as f:
    json.dump(dict(os.environ), f)
os.rename(out + ".tmp", out)
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def run_env(env: dict[str, str]) -> dict[str, str]:
    """`env` (the caller's, with its FENCEPOST_API_KEY) plus the server's secrets,
    in case one environment serves both, and some variables that are not secret."""
    return {**env, **CREDENTIALS, **OTHERS}


def wait_for_json(path: Path, proc: subprocess.Popen[str], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if proc.poll() is not None:
            _, stderr = proc.communicate()
            raise AssertionError(f"fencepost run exited {proc.returncode}: {stderr}")
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def run_holding(args: list[str], env: dict[str, str], tmp_path: Path,
                while_held: Any) -> dict[str, str]:
    """`fencepost run ARGS -- python DUMP_AND_WAIT`; calls `while_held(child_env)`
    while CMD runs, then lets CMD end; returns CMD's environment."""
    seen, go = tmp_path / "env.json", tmp_path / "go"
    proc = track(subprocess.Popen(
        [sys.executable, "-m", "fencepost", "run", *args, "--",
         sys.executable, "-c", DUMP_AND_WAIT, str(seen), str(go)],
        env=env, text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True,
    ), own_group=True)
    try:
        child_env: dict[str, str] = wait_for_json(seen, proc)
        while_held(child_env)
    finally:
        go.touch()
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    return child_env


def lock_state(server: ServerProcess, key: str) -> dict[str, Any]:
    with server.client() as c:
        state: dict[str, Any] = c.get(f"/v1/locks/{key}").json()
        return state


def pool_in_use(server: ServerProcess, pool: str) -> int:
    with server.client() as c:
        return int(c.get(f"/v1/pools/{pool}").json()["in_use"])


def assert_credentials_kept_back(child: dict[str, str], env: dict[str, str]) -> None:
    for name in ("FENCEPOST_API_KEY", *CREDENTIALS):
        assert name not in child, name
    # Everything else reaches CMD as it was.
    assert child["PATH"] == env["PATH"]
    for name, value in OTHERS.items():
        assert child[name] == value, name
    assert child["FENCEPOST_URL"] == env["FENCEPOST_URL"]


def assert_credentials_passed(child: dict[str, str], env: dict[str, str]) -> None:
    for name in ("FENCEPOST_API_KEY", *CREDENTIALS):
        assert child[name] == env[name], name
    assert child["PATH"] == env["PATH"] and child["MY_VAR"] == OTHERS["MY_VAR"]


def test_run_keeps_an_admin_key_from_cmd(server: ServerProcess, admin_env: dict[str, str],
                                         tmp_path: Path) -> None:
    key = unique_name("cred")
    env = run_env(admin_env)
    assert env["FENCEPOST_API_KEY"] == server.admin_key

    def held(child: dict[str, str]) -> None:
        state = lock_state(server, key)
        assert state["held"], state
        assert child["FENCEPOST_LOCK_KEY"] == key
        assert int(child["FENCEPOST_FENCING_TOKEN"]) == state["fencing_token"]

    child = run_holding(["--lock", key, "--ttl", "30"], env, tmp_path, held)
    assert_credentials_kept_back(child, env)
    assert server.admin_key not in json.dumps(child)  # under no other name either
    assert not lock_state(server, key)["held"]  # released when CMD ended


def test_run_pass_credentials_hands_them_to_cmd(server: ServerProcess,
                                                member_env: dict[str, str],
                                                tmp_path: Path) -> None:
    key = unique_name("cred")
    env = run_env(member_env)

    def held(child: dict[str, str]) -> None:
        state = lock_state(server, key)
        assert state["held"] and int(child["FENCEPOST_FENCING_TOKEN"]) == state["fencing_token"]

    child = run_holding(["--lock", key, "--pass-credentials"], env, tmp_path, held)
    assert_credentials_passed(child, env)
    assert not lock_state(server, key)["held"]


@pytest.mark.parametrize("session", [False, True], ids=["lock-set", "session"])
def test_run_keeps_the_key_from_cmd_with_several_locks(server: ServerProcess,
                                                       member_env: dict[str, str],
                                                       tmp_path: Path, session: bool) -> None:
    a, b = unique_name("cred-a"), unique_name("cred-b")
    env = run_env(member_env)
    args = ["--lock", a, "--lock", b, *(["--session-ttl", "30"] if session else [])]

    def held(child: dict[str, str]) -> None:
        tokens = dict(pair.split("=") for pair in child["FENCEPOST_FENCING_TOKENS"].split(","))
        for k in (a, b):
            state = lock_state(server, k)
            assert state["held"] and int(tokens[k]) == state["fencing_token"], state

    child = run_holding(args, env, tmp_path, held)
    assert_credentials_kept_back(child, env)
    assert not lock_state(server, a)["held"] and not lock_state(server, b)["held"]


@pytest.mark.parametrize("pass_credentials", [False, True], ids=["default", "passed"])
def test_run_with_a_pool_slot(server: ServerProcess, admin_env: dict[str, str],
                              member_env: dict[str, str], tmp_path: Path,
                              pass_credentials: bool) -> None:
    pool = unique_name("cred-pool")
    assert fp("pool", "set", pool, "--limit", "1", "--term-ms", "3000",
              env=admin_env).returncode == 0
    env = run_env(member_env)

    def held(child: dict[str, str]) -> None:
        assert child["FENCEPOST_POOL"] == pool and child["FENCEPOST_SLOT_ID"]
        assert pool_in_use(server, pool) == 1

    args = ["--pool", pool, *(["--pass-credentials"] if pass_credentials else [])]
    child = run_holding(args, env, tmp_path, held)
    if pass_credentials:
        assert_credentials_passed(child, env)
    else:
        assert_credentials_kept_back(child, env)
    assert pool_in_use(server, pool) == 0

