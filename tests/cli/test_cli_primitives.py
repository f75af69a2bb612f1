"""`fencepost lock fence-check`, `--lock-delay`, `fencepost key refresh`, `key retire`
and `key list`'s lineage."""

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
    # The successor shares its first key's minute (SPEC §5: a lineage refreshes
    # at most once a minute), and says so.
    human = fp("key", "refresh", "--expires-in", "60", env=cli_env(server, secret))
    assert_clean_failure(human, 3)  # busy: try again later
    assert "once a minute" in human.stderr
    other = server.create_key("reader", expires_in_seconds=3600)
    human = fp("key", "refresh", "--expires-in", "60", env=cli_env(server, other["key"]))
    assert human.returncode == 0 and "refreshed: new reader key" in human.stderr
    too_long = fp("key", "refresh", "--expires-in", "3601", env=env)
    assert_clean_failure(too_long, 2)
    assert "expires_in_seconds" in too_long.stderr


def test_key_retire_and_refresh_retire_previous_and_the_lineage_listed(
        server: ServerProcess) -> None:
    created = server.create_key("member", name="cli-rotate")
    out = fp("key", "refresh", "-q", "--retire-previous", env=cli_env(server, created["key"]))
    assert out.returncode == 0, out.stderr
    secret = out.stdout.strip()
    assert fp("whoami", env=cli_env(server, created["key"])).returncode == 6  # refused
    successor = fp_json("whoami", env=cli_env(server, secret))["key_id"]
    admin = cli_env(server, server.admin_key)
    listed = {k["id"]: k for k in fp_json("key", "list", env=admin)["keys"]}
    assert listed[created["id"]]["state"] == "retired"
    assert listed[successor]["refreshed_from"] == created["id"]
    table = fp("key", "list", env=admin)
    assert table.returncode == 0 and "STATE" in table.stdout and "FROM" in table.stdout
    row = next(line for line in table.stdout.splitlines() if line.startswith(successor))
    assert "active" in row and created["id"] in row
    assert fp_json("key", "retire", successor, env=admin) == {"retired": True}
    human = fp("key", "retire", successor, env=admin)  # again: the same
    assert human.returncode == 0 and f"retired key {successor}" in human.stdout
    assert fp("whoami", env=cli_env(server, secret)).returncode == 6
    assert fp("key", "retire", "key_0000000000000000", env=admin).returncode == 5
