"""`-q/--quiet` on the commands that create something: stdout is the identifier
alone (one line), so `X=$(fencepost ... -q)` works, and the identifier is the
real one: the next command accepts it."""

from __future__ import annotations

import re
import subprocess

from cli_support import assert_clean_failure, cli_env, fp
from support import ServerProcess, unique_name

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _only_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout
    return lines[0]


def test_lock_acquire_quiet_prints_the_lock_token_alone(admin_env: dict[str, str]) -> None:
    key = unique_name()
    token = _only_line(fp("lock", "acquire", key, "--ttl", "30", "-q", env=admin_env))
    assert UUID_RE.match(token), token
    renewed = fp("lock", "renew", key, "--token", token, env=admin_env)
    assert renewed.returncode == 0, renewed.stderr
    released = fp("lock", "release", key, "--token", token, env=admin_env)
    assert f"released lock {key}" in released.stdout


def test_lock_acquire_quiet_when_busy_fails_with_nothing_on_stdout(
        admin_env: dict[str, str]) -> None:
    key = unique_name()
    _only_line(fp("lock", "acquire", key, "--ttl", "30", "--quiet", env=admin_env))
    busy = fp("lock", "acquire", key, "-q", env=admin_env)
    assert_clean_failure(busy, 3)
    assert busy.stdout == ""


def test_pool_quiet_set_and_acquire(admin_env: dict[str, str], member_env: dict[str, str]) -> None:
    name = unique_name("pool")
    assert _only_line(fp("pool", "set", name, "--limit", "1", "-q", env=admin_env)) == name
    slot = _only_line(fp("pool", "acquire", name, "-q", env=member_env))
    assert slot.startswith("slot_"), slot
    full = fp("pool", "acquire", name, "-q", env=member_env)
    assert_clean_failure(full, 3)
    assert full.stdout == ""
    assert fp("pool", "renew", name, slot, env=member_env).returncode == 0
    released = fp("pool", "release", name, slot, "--status", "200", env=member_env)
    assert "released the slot" in released.stdout


def test_key_create_quiet_prints_the_secret_and_nothing_on_stderr(
        server: ServerProcess, admin_env: dict[str, str]) -> None:
    out = fp("key", "create", "--role", "reader", "--name", "quiet", "-q", env=admin_env)
    secret = _only_line(out)
    assert out.stderr == ""
    who = fp("whoami", env=cli_env(server, secret))
    assert who.returncode == 0 and "(reader)" in who.stdout


def test_quiet_and_json_together_are_refused_before_anything_is_done(
        admin_env: dict[str, str]) -> None:
    key = unique_name()
    both = fp("lock", "acquire", key, "-q", "--json", env=admin_env)
    assert_clean_failure(both, 2)
    assert "--json" in both.stderr
    assert "free" in fp("lock", "show", key, env=admin_env).stdout
