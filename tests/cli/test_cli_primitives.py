"""`fencepost lock fence-check`, `--lock-delay` and `fencepost key refresh`."""

from __future__ import annotations

from cli_support import assert_clean_failure, cli_env, fp, fp_json
from support import ServerProcess, unique_name


def test_fence_check_exit_codes(member_env: dict[str, str]) -> None:
    key = unique_name("clifence")
    lease = fp_json("lock", "acquire", key, "--ttl", "30", env=member_env)
    token = str(lease["fencing_token"])
    current = fp("lock", "fence-check", key, token, env=member_env)
    assert current.returncode == 0, current.stderr
    assert f"fencing token {token} is current" in current.stdout
    body = fp_json("lock", "fence-check", key, token, env=member_env)
    assert body["current"] is True and body["live_token"] == lease["fencing_token"]

    released = fp("lock", "release", key, "--token", lease["lock_token"], env=member_env)
    assert released.returncode == 0
    stale = fp("lock", "fence-check", key, token, env=member_env)
    assert stale.returncode == 4, (stale.stdout, stale.stderr)
    assert "stale" in stale.stdout and "released" in stale.stdout
    assert fp_json("lock", "fence-check", key, token, env=member_env, code=4)["reason"] == \
        "released"


def test_fence_check_bad_arguments_are_usage_errors(member_env: dict[str, str]) -> None:
    for token in ["-1", "abc", str(2**53)]:
        assert_clean_failure(fp("lock", "fence-check", "k", token, env=member_env), 2)
    assert_clean_failure(fp("lock", "fence-check", "-bad-", "1", env=member_env), 2)


def test_lock_delay_option(member_env: dict[str, str]) -> None:
    key = unique_name("clidelay")
    assert fp("lock", "acquire", key, "--ttl", "30", "--lock-delay", "30",
              env=member_env).returncode == 0
    forced = fp("lock", "force-release", key, env=member_env)  # its own key's lease
    assert forced.returncode == 0, forced.stderr
    busy = fp("lock", "acquire", key, env=member_env)
    assert_clean_failure(busy, 3)
    assert "lock delay" in busy.stderr
    assert_clean_failure(fp("lock", "acquire", key, "--lock-delay", "61", env=member_env), 2)


def test_key_refresh_prints_the_new_secret_alone(server: ServerProcess) -> None:
    created = server.create_key("reader", expires_in_seconds=3600, name="cli-refresh")
    env = cli_env(server, created["key"])
    out = fp("key", "refresh", "-q", env=env)
    assert out.returncode == 0, out.stderr
    secret = out.stdout.strip()
    assert secret and "\n" not in secret and secret != created["key"]
    me = fp_json("whoami", env=cli_env(server, secret))
    assert me["role"] == "reader" and me["key_id"] != created["id"]
    assert me["expires_at"] is not None
    # The successor refreshes in turn (a key refreshes at most once a minute).
    human = fp("key", "refresh", "--expires-in", "60", env=cli_env(server, secret))
    assert human.returncode == 0 and "refreshed: new reader key" in human.stderr
    too_long = fp("key", "refresh", "--expires-in", "3601", env=env)
    assert_clean_failure(too_long, 2)
    assert "expires_in_seconds" in too_long.stderr
