"""`fencepost pool set` changes only the options given (PATCH, SPEC §4.1);
`fencepost pool show` shows what the pool learned (SPEC §4.5), human and --json."""

from __future__ import annotations

from cli_support import assert_clean_failure, fp, fp_json
from support import ServerProcess, unique_name


def test_pool_set_changes_only_the_options_given(admin_env: dict[str, str]) -> None:
    pool = unique_name("pool")
    created = fp_json("pool", "set", pool, "--limit", "4", "--queue-size", "7", "--adaptive",
                      "--rpm", "30", "--min-limit", "2", env=admin_env)
    assert (created["limit"], created["queue_size"], created["adaptive"]) == (4, 7, True)
    changed = fp_json("pool", "set", pool, "--limit", "9", env=admin_env)
    assert changed["limit"] == 9
    # left alone, not reset to the server's defaults
    assert (changed["queue_size"], changed["adaptive"], changed["rpm"],
            changed["min_limit"]) == (7, True, 30, 2)
    turned_off = fp_json("pool", "set", pool, "--no-adaptive", env=admin_env)
    assert turned_off["adaptive"] is False and turned_off["limit"] == 9


def test_pool_set_without_limit_does_not_create(admin_env: dict[str, str]) -> None:
    pool = unique_name("pool")
    out = fp("pool", "set", pool, "--queue-size", "3", env=admin_env)
    assert_clean_failure(out, 5)
    assert "--limit" in out.stderr
    assert_clean_failure(fp("pool", "show", pool, env=admin_env), 5)


def test_pool_set_refuses_a_change_that_breaks_the_kept_config(
        admin_env: dict[str, str]) -> None:
    pool = unique_name("pool")
    fp_json("pool", "set", pool, "--limit", "4", "--min-limit", "3", env=admin_env)
    out = fp("pool", "set", pool, "--limit", "2", env=admin_env)
    assert_clean_failure(out, 2)
    assert "min_limit" in out.stderr
    assert fp_json("pool", "show", pool, env=admin_env)["limit"] == 4


def test_pool_show_shows_what_was_learned(server: ServerProcess,
                                          admin_env: dict[str, str]) -> None:
    pool = unique_name("pool")
    fp_json("pool", "set", pool, "--limit", "10", "--adaptive", env=admin_env)
    with server.client() as client:
        slot = client.post(f"/v1/pools/{pool}/lock/acquire").json()["slot_id"]
        released = client.post(f"/v1/pools/{pool}/lock/{slot}/release", json={
            "status": 429, "headers": {
                "x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "30s", "retry-after": "30"}})
        assert released.json() == {"released": True}
    shown = fp_json("pool", "show", pool, env=admin_env)
    learned = shown["learned"]
    assert learned["effective_rpm"] == 2 and learned["window_ms"] == 60_000
    assert learned["paused_until_at"] is not None
    assert learned["last_hint"]["source"] == "reset"
    human = fp("pool", "show", pool, env=admin_env)
    assert human.returncode == 0, human.stderr
    text = human.stdout
    assert "learned:" in text and "paused until:" in text
    assert "effective rpm:" in text and "from reset" in text


def test_pool_show_of_a_pool_that_learned_nothing(admin_env: dict[str, str]) -> None:
    pool = unique_name("pool")
    fp_json("pool", "set", pool, "--limit", "3", env=admin_env)
    human = fp("pool", "show", pool, env=admin_env)
    assert human.returncode == 0 and "learned:" in human.stdout
