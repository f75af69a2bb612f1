"""`fencepost lock ...`, `pool ...`, `key ...`, `whoami`: human output, `--json`
that parses, and exit codes scripts can branch on."""

from __future__ import annotations

import re
import uuid

from cli_support import assert_clean_failure, cli_env, fp, fp_json
from support import ServerProcess, free_port, unique_name

UUID_RE = re.compile(r"lock token: ([0-9a-f-]{36})")


def test_lock_lifecycle_human(admin_env: dict[str, str]) -> None:
    key = unique_name()
    out = fp("lock", "acquire", key, "--ttl", "30", "--operation", "deploy",
             "--metadata", '{"host": "ci-7"}', env=admin_env)
    assert out.returncode == 0, out.stderr
    assert f"acquired lock {key}: fencing token" in out.stdout
    match = UUID_RE.search(out.stdout)
    assert match, out.stdout
    token = match.group(1)

    show = fp("lock", "show", key, env=admin_env)
    assert show.returncode == 0 and "held, fencing token" in show.stdout
    assert "deploy" in show.stdout and '"host":"ci-7"' in show.stdout

    listed = fp("lock", "list", "--prefix", key, env=admin_env)
    assert listed.returncode == 0 and listed.stdout.splitlines()[0].startswith("KEY")
    assert key in listed.stdout

    busy = fp("lock", "acquire", key, env=admin_env)
    assert_clean_failure(busy, 3)
    assert "deploy" in busy.stderr  # the holder's operation is shown

    renewed = fp("lock", "renew", key, "--token", token, "--ttl", "60", env=admin_env)
    assert renewed.returncode == 0 and "renewed lock" in renewed.stdout
    released = fp("lock", "release", key, "--token", token, env=admin_env)
    assert released.returncode == 0 and f"released lock {key}" in released.stdout
    again = fp("lock", "release", key, "--token", token, env=admin_env)
    assert again.returncode == 0 and "not held" in again.stdout

    lost = fp("lock", "renew", key, "--token", token, env=admin_env)
    assert_clean_failure(lost, 4)

    assert "free" in fp("lock", "show", key, env=admin_env).stdout


def test_lock_json_output_parses(admin_env: dict[str, str]) -> None:
    key = unique_name()
    token = str(uuid.uuid4())
    lease = fp_json("lock", "acquire", key, "--ttl", "30", "--token", token, env=admin_env)
    assert lease["lock_token"] == token and lease["created"] is True
    assert isinstance(lease["fencing_token"], int) and lease["expires_at"].endswith("Z")
    retried = fp_json("lock", "acquire", key, "--ttl", "30", "--token", token, env=admin_env)
    assert retried["created"] is False and retried["fencing_token"] == lease["fencing_token"]
    assert fp_json("lock", "show", key, env=admin_env)["held"] is True
    listed = fp_json("lock", "list", "--prefix", key, env=admin_env)
    assert [lock["key"] for lock in listed["locks"]] == [key]
    renewal = fp_json("lock", "renew", key, "--token", token, env=admin_env)
    assert renewal["fencing_token"] == lease["fencing_token"]
    forced = fp_json("lock", "force-release", key, env=admin_env)
    assert forced["released"] is True and forced["fencing_token"] == lease["fencing_token"]
    assert fp_json("lock", "force-release", key, env=admin_env)["released"] is False
    error = fp_json("lock", "renew", key, "--token", token, env=admin_env, code=4)
    assert error["error"]["code"] == "lease_lost"
    assert error["error"]["reason"] == "force_released"
    assert fp_json("lock", "release", key, "--token", token, env=admin_env) == {"released": False}


def test_lock_list_follows_pages(admin_env: dict[str, str]) -> None:
    prefix = unique_name("page")
    for i in range(3):
        fp_json("lock", "acquire", f"{prefix}-{i}", env=admin_env)
    everything = fp_json("lock", "list", "--prefix", prefix, env=admin_env)
    assert len(everything["locks"]) == 3 and everything["next"] is None
    two = fp_json("lock", "list", "--prefix", prefix, "--limit", "2", env=admin_env)
    assert [lock["key"] for lock in two["locks"]] == [f"{prefix}-0", f"{prefix}-1"]


def test_pool_commands(admin_env: dict[str, str], member_env: dict[str, str]) -> None:
    pool = unique_name("pool")
    configured = fp("pool", "set", pool, "--limit", "1", "--term-ms", "5000", env=admin_env)
    assert configured.returncode == 0 and f"pool {pool}" in configured.stdout
    shown = fp_json("pool", "show", pool, env=member_env)
    assert shown["limit"] == 1 and shown["term_ms"] == 5000 and shown["in_use"] == 0
    assert pool in [p["name"] for p in fp_json("pool", "list", "--prefix", pool,
                                               env=member_env)["pools"]]
    # The human table; with a prefix, as other tests' pools on the shared
    # server may fill the first page.
    assert pool in fp("pool", "list", "--prefix", pool, env=member_env).stdout

    grant = fp_json("pool", "acquire", pool, env=member_env)
    slot_id = grant["slot_id"]
    assert grant["remaining_slots"] == 0
    assert_clean_failure(fp("pool", "acquire", pool, env=member_env), 3)
    assert_clean_failure(fp("pool", "acquire", pool, "--wait", "0.2", env=member_env), 3)
    assert fp_json("pool", "renew", pool, slot_id, env=member_env)["lease_deadline"] > 0
    human = fp("pool", "release", pool, slot_id, "--status", "429", "--throttled", "2",
               "--header", "Retry-After: 3", env=member_env)
    assert human.returncode == 0 and "released the slot" in human.stdout
    assert fp_json("pool", "release", pool, slot_id, env=member_env) == {"released": False}
    assert_clean_failure(fp("pool", "renew", pool, slot_id, env=member_env), 5)
    assert fp_json("pool", "show", pool, env=member_env)["stats"]["throttled"] == 2

    assert_clean_failure(fp("pool", "delete", pool, env=member_env), 6)  # admin only
    assert fp_json("pool", "delete", pool, env=admin_env) == {"deleted": True}
    assert_clean_failure(fp("pool", "show", pool, env=admin_env), 5)


def test_key_commands_and_whoami(server: ServerProcess, admin_env: dict[str, str]) -> None:
    created = fp("key", "create", "--role", "member", "--name", "cli", "--rpm-quota", "100",
                 env=admin_env)
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert "\n" not in secret and secret  # the secret alone on stdout
    assert "created member key" in created.stderr

    member_env = cli_env(server, secret)
    me = fp_json("whoami", env=member_env)
    assert me["role"] == "member" and me["project"] == "default"
    assert "(member) in project default" in fp("whoami", env=member_env).stdout

    keys = fp_json("key", "list", env=admin_env)["keys"]
    mine = [k for k in keys if k["id"] == me["key_id"]]
    assert mine and mine[0]["name"] == "cli" and "key" not in mine[0]
    assert "ROLE" in fp("key", "list", env=admin_env).stdout
    created_json = fp_json("key", "create", "--role", "reader", "--expires-in", "60",
                           "--allow-ip", "127.0.0.1", env=admin_env)
    assert created_json["key"] and created_json["allow_ips"]

    assert fp_json("key", "revoke", me["key_id"], env=admin_env) == {"revoked": True}
    assert_clean_failure(fp("key", "revoke", "key_nope", env=admin_env), 5)
    denied = fp("whoami", env=member_env)
    assert_clean_failure(denied, 6)


def test_exit_codes_for_refusals(server: ServerProcess, member_env: dict[str, str],
                                admin_env: dict[str, str]) -> None:
    # A member may force-release only a lease its own key took: this one is the admin's.
    admins = unique_name()
    assert fp("lock", "acquire", admins, "--ttl", "30", env=admin_env).returncode == 0
    assert_clean_failure(fp("lock", "force-release", admins, env=member_env), 6)
    assert_clean_failure(fp("whoami", env=cli_env(server, "fp_unknown_key_000000000000000000")),
                         6)
    unreachable = fp("whoami", "--timeout", "2", env=cli_env(
        server, FENCEPOST_URL=f"http://127.0.0.1:{free_port()}"))
    assert_clean_failure(unreachable, 7)
    assert "Cannot reach" in unreachable.stderr
    validation = fp("lock", "acquire", unique_name(), "--metadata",
                    '{"blob": "' + "x" * 5000 + '"}', env=member_env)
    assert_clean_failure(validation, 2)
    assert "metadata" in validation.stderr


def test_url_and_key_options_beat_the_environment(server: ServerProcess) -> None:
    env = cli_env(server, FENCEPOST_URL=f"http://127.0.0.1:{free_port()}",
                  FENCEPOST_API_KEY="fp_wrong")
    me = fp_json("whoami", "--url", server.base_url, "--api-key", server.admin_key, env=env)
    assert me["role"] == "admin"
