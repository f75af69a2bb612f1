"""`fencepost lock show`, `lock list` and `pool show` say who holds and who
waits, for people and with --json."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from cli_support import assert_clean_failure, fp, fp_json
from fencepost.cli.locks import _describe as describe_lock
from fencepost.client import LockInfo, Waiter
from support import ServerProcess, lock_headers, new_token, unique_name


def wait_in_line(server: ServerProcess, secret: str, key: str, wait_s: int) -> threading.Thread:
    def run() -> None:
        with server.client(secret) as c:
            thread.result = c.put(  # type: ignore[attr-defined]
                f"/v1/locks/{key}/lease", headers=lock_headers(new_token()),
                json={"ttl_seconds": 30, "wait_seconds": wait_s},
            )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def waiters(server: ServerProcess, key: str, count: int) -> None:
    deadline = time.monotonic() + 10
    with server.client() as c:
        while c.get(f"/v1/locks/{key}").json()["waiters"] != count:
            assert time.monotonic() < deadline, "the waiter never got in line"
            time.sleep(0.05)


def test_lock_show_names_holder_and_line(
    server: ServerProcess, admin_env: dict[str, str], member_env: dict[str, str],
    member_secret: str,
) -> None:
    key, token = unique_name(), new_token()
    assert fp("lock", "acquire", key, "--token", token, "--ttl", "30",
              env=member_env).returncode == 0
    member_id = fp_json("whoami", env=member_env)["key_id"]
    waiting = wait_in_line(server, server.admin_key, key, 25)
    waiters(server, key, 1)

    shown = fp("lock", "show", key, env=admin_env)
    assert shown.returncode == 0, shown.stderr
    assert "holder:" in shown.stdout and f"cli-tests ({member_id})" in shown.stdout
    lines = shown.stdout.splitlines()
    line_at = lines.index("line:")
    assert lines[line_at + 1].split() == ["#", "KEY", "SINCE", "GIVES", "UP"]
    first = lines[line_at + 2]
    assert first.startswith("1 ") and "bootstrap (key_" in first and " ago" in first
    assert " in " in first  # gives up in the future
    assert token not in shown.stdout

    as_json = fp_json("lock", "show", key, env=admin_env)
    assert as_json["holder"] == {"key_id": member_id, "key_name": "cli-tests"}
    [place] = as_json["line"]
    assert place["key_name"] == "bootstrap" and place["gives_up_at"].endswith("Z")

    listed = fp("lock", "list", "--prefix", key, env=admin_env)
    header, row = listed.stdout.splitlines()
    assert header.split()[:2] == ["KEY", "HOLDER"] and row.split()[:2] == [key, "cli-tests"]
    listed_json = fp_json("lock", "list", "--prefix", key, env=admin_env)
    assert listed_json["locks"][0]["holder"] == as_json["holder"]

    assert fp("lock", "release", key, "--token", token, env=member_env).returncode == 0
    waiting.join(10)
    granted: Any = waiting.result  # type: ignore[attr-defined]
    assert granted.status_code == 201
    free_holder = fp_json("lock", "show", key, env=admin_env)["holder"]
    assert free_holder["key_name"] == "bootstrap"
    with server.client() as c:
        c.delete(f"/v1/locks/{key}")
    free = fp("lock", "show", key, env=admin_env)
    assert free.stdout.strip() == f"{key}: free"


def test_pool_show_lists_live_slots(
    admin_env: dict[str, str], member_env: dict[str, str]
) -> None:
    name = unique_name("pool")
    assert fp("pool", "set", name, "--limit", "2", env=admin_env).returncode == 0
    empty = fp("pool", "show", name, env=admin_env)
    assert empty.returncode == 0 and "no live slots" in empty.stdout
    slot_id = fp("pool", "acquire", name, "-q", env=member_env).stdout.strip()
    assert slot_id.startswith("slot_")
    shown = fp("pool", "show", name, env=admin_env)
    assert shown.returncode == 0, shown.stderr
    assert "SLOT" in shown.stdout and "cli-tests (key_" in shown.stdout
    assert slot_id not in shown.stdout and slot_id[:13] + "..." in shown.stdout
    as_json = fp_json("pool", "show", name, env=admin_env)
    [slot] = as_json["slots"]
    assert slot["key_name"] == "cli-tests" and slot_id.startswith(slot["slot_id_prefix"])
    assert as_json["in_use"] == 1 and slot_id not in str(as_json)
    assert fp("pool", "delete", name, env=admin_env).returncode == 0
    assert_clean_failure(fp("pool", "show", name, env=admin_env), 5)


def test_lock_show_says_how_many_wait_beyond_the_line_shown() -> None:
    soon = datetime.now(UTC) + timedelta(seconds=30)
    info = LockInfo(key="k", held=False, waiters=103, line=[
        Waiter(key_id=f"key_{i}", key_name=None, since_at=soon, gives_up_at=soon)
        for i in range(100)
    ])
    text = describe_lock(info)
    lines = text.splitlines()
    assert lines[0] == "k: free (103 waiting)" and lines[1] == "line:"
    assert lines[3].split()[:2] == ["1", "key_0"] and lines[-2].split()[:2] == ["100", "key_99"]
    assert lines[-1] == "... and 3 more"
    assert "line:" not in describe_lock(LockInfo(key="k", held=False)).splitlines()
