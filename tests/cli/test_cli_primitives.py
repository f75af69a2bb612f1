"""`fencepost lock fence-check`, `--lock-delay` and `fencepost key refresh`."""

from __future__ import annotations

from cli_support import assert_clean_failure, fp, fp_json

from support import unique_name


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
