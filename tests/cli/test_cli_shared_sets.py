"""`fencepost run --lock K --shared`, `fencepost run --lock A --lock B`,
`fencepost lock acquire --shared` and `fencepost lock fence` (with its old
name `fence-check`)."""

from __future__ import annotations

import json

from cli_support import assert_clean_failure, fp, fp_json
from support import ServerProcess, parse_at, unique_name


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


def test_run_with_a_session_holds_every_lock_on_one_heartbeat(
        server: ServerProcess, member_env: dict[str, str]) -> None:
    b, a = unique_name("sess-b"), unique_name("sess-a")
    # The locks' expiry is the 15 s session's (not --ttl's 60 s), and CMD
    # outlives a heartbeat (every 5 s at most): the expiry moved with it. CMD
    # looks with fencepost's own key, so it needs --pass-credentials.
    look = (f'curl -s -H "Authorization: Bearer $FENCEPOST_API_KEY" '
            f'"$FENCEPOST_URL/v1/locks/{a}"; echo')
    script = f'{look}; sleep 6; {look}; echo "$FENCEPOST_LOCK_KEYS"'
    out = fp("run", "--lock", b, "--lock", a, "--session-ttl", "15", "--pass-credentials",
             "--", "sh", "-c", script, env=member_env)
    assert out.returncode == 0, out.stderr
    first, later, keys = out.stdout.strip().splitlines()
    assert keys == ",".join(sorted([a, b]))
    before, after = json.loads(first), json.loads(later)
    assert before["held"] and after["held"]
    span = parse_at(before["expires_at"]) - parse_at(before["acquired_at"])
    assert span.total_seconds() <= 15
    assert parse_at(after["expires_at"]) > parse_at(before["expires_at"])
    assert not state(server, a)["held"] and not state(server, b)["held"]


def test_run_session_ttl_needs_several_locks(member_env: dict[str, str]) -> None:
    for args in (("--lock", "one"), ("--pool", "p"), ("--lock", "a", "--lock", "b")):
        extra = ("--session-ttl", "4") if len(args) == 4 else ("--session-ttl", "30")
        assert_clean_failure(fp("run", *args, *extra, "--", "true", env=member_env), 2)


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
