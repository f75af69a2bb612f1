"""`fencepost run --lock K --shared`, `fencepost run --lock A --lock B`,
`fencepost lock acquire --shared` and `fencepost lock fence` (with its old
name `fence-check`)."""

from __future__ import annotations

from cli_support import assert_clean_failure, fp, fp_json
from support import ServerProcess, unique_name


def state(server: ServerProcess, key: str) -> dict[str, object]:
    with server.client() as c:
        return dict(c.get(f"/v1/locks/{key}").json())


def test_run_shared_holds_beside_another_reader(server: ServerProcess,
                                                member_env: dict[str, str]) -> None:
    key = unique_name("run-shared")
    reader = fp_json("lock", "acquire", key, "--shared", "--ttl", "60", env=member_env)
    script = f'curl -s "$FENCEPOST_URL/v1/locks/{key}" >/dev/null 2>&1; ' \
             'echo "$FENCEPOST_FENCING_TOKEN"'
    out = fp("run", "--lock", key, "--shared", "--", "sh", "-c", script, env=member_env)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > reader["fencing_token"]
    assert state(server, key)["holders"] == 1  # the run's lease was released
    busy = fp("run", "--lock", key, "--", "true", env=member_env)
    assert busy.returncode == 3, busy.stderr


def test_run_with_several_locks_holds_them_all(server: ServerProcess,
                                               member_env: dict[str, str]) -> None:
    a, b = unique_name("run-a"), unique_name("run-b")
    script = 'echo "$FENCEPOST_LOCK_KEYS"; echo "$FENCEPOST_FENCING_TOKENS"'
    out = fp("run", "--lock", a, "--lock", b, "--", "sh", "-c", script, env=member_env)
    assert out.returncode == 0, out.stderr
    keys, tokens = out.stdout.split()
    assert keys == f"{a},{b}"
    pairs = dict(pair.split("=") for pair in tokens.split(","))
    assert set(pairs) == {a, b} and all(int(t) > 0 for t in pairs.values())
    assert not state(server, a)["held"] and not state(server, b)["held"]


def test_run_with_a_busy_lock_in_the_set_runs_nothing(server: ServerProcess,
                                                      member_env: dict[str, str]) -> None:
    a, b = unique_name("busy-a"), unique_name("busy-b")
    fp_json("lock", "acquire", b, "--ttl", "60", env=member_env)
    out = fp("run", "--lock", a, "--lock", b, "--", "echo", "ran", env=member_env)
    assert out.returncode == 3 and "ran" not in out.stdout
    assert not state(server, a)["held"]


def test_run_shared_with_a_pool_is_a_usage_error(member_env: dict[str, str]) -> None:
    assert_clean_failure(fp("run", "--pool", "p", "--shared", "--", "true", env=member_env), 2)


def test_lock_fence_and_its_old_name(member_env: dict[str, str]) -> None:
    key = unique_name("fence")
    lease = fp_json("lock", "acquire", key, env=member_env)
    token = str(lease["fencing_token"])
    for name in ("fence", "fence-check"):
        assert fp("lock", name, key, token, env=member_env).returncode == 0
    stale = fp_json("lock", "fence", key, str(int(token) + 1), env=member_env, code=4)
    assert stale["current"] is False
    help_text = fp("lock", "--help", env=member_env).stdout
    assert "fence " in help_text and "fence-check" not in help_text
