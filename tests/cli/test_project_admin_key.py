"""`fencepost project create` saves the new project's admin key like the
bootstrap key, and `fencepost project admin-key` is the way back when a
project's admin keys are lost (SPEC §6): both work on the store directly."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx

from support import ServerProcess, true_within, unique_name


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    return subprocess.run([sys.executable, "-m", "fencepost", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=cwd)


def whoami(server: ServerProcess, key: str) -> httpx.Response:
    return httpx.get(f"{server.base_url}/v1/whoami",
                     headers={"Authorization": f"Bearer {key}"}, timeout=10)


def key_count(server: ServerProcess, key: str) -> int:
    resp = httpx.get(f"{server.base_url}/v1/keys", params={"limit": "1000"},
                     headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert resp.status_code == 200, resp.text
    return len(resp.json()["keys"])


def assert_private(path: Path) -> None:
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, oct(path.stat().st_mode)


def test_project_create_saves_the_key_beside_the_store(fresh_server: ServerProcess) -> None:
    name = unique_name("saved")
    out = cli("project", "create", name, "--store", fresh_server.store_url)
    assert out.returncode == 0, out.stderr
    key = out.stdout.strip()
    assert out.stdout == key + "\n"  # KEY=$(fencepost project create NAME) still works
    saved = Path(f"{fresh_server.db_path}.{name}.admin-key")
    assert saved.read_text() == key + "\n"
    assert_private(saved)
    assert str(saved) in out.stderr and key not in out.stderr
    # Not the bootstrap key's file (the test server's bootstrap key comes from
    # its environment, so it has none).
    assert not Path(f"{fresh_server.db_path}.admin-key").exists()


def test_a_lost_admin_key_comes_back_with_new(fresh_server: ServerProcess) -> None:
    name = unique_name("lost")
    created = cli("project", "create", name, "--store", fresh_server.store_url)
    first = created.stdout.strip()
    saved = Path(f"{fresh_server.db_path}.{name}.admin-key")

    where = cli("project", "admin-key", name, "--store", fresh_server.store_url)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip() == str(saved.resolve()) and first not in where.stdout

    saved.unlink()  # the key is lost
    refused = cli("project", "admin-key", name, "--store", fresh_server.store_url)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "--new" in refused.stderr and len(refused.stderr.splitlines()) == 1

    minted = cli("project", "admin-key", name, "--new", "--store", fresh_server.store_url)
    made = time.monotonic()
    assert minted.returncode == 0, minted.stderr
    second = minted.stdout.strip()
    assert minted.stdout == second + "\n" and second != first
    assert saved.read_text() == second + "\n"
    assert_private(saved)
    assert true_within(lambda: whoami(fresh_server, second).status_code == 200, made, 2.0)
    me = whoami(fresh_server, second).json()
    assert (me["project"], me["role"]) == (name, "admin")
    # The new key sees the project's keys, names itself, and the old key still
    # works until an admin retires or revokes it.
    listed = httpx.get(f"{fresh_server.base_url}/v1/keys",
                       headers={"Authorization": f"Bearer {second}"}, timeout=10).json()["keys"]
    assert {k["name"] for k in listed} == {"first admin", "recovered admin"}
    assert whoami(fresh_server, first).status_code == 200


def test_admin_key_refuses_bad_input_and_changes_nothing(
        fresh_server: ServerProcess, tmp_path: Path) -> None:
    name = unique_name("intact")
    key = cli("project", "create", name, "--store", fresh_server.store_url).stdout.strip()
    before = key_count(fresh_server, key)
    store = fresh_server.store_url
    for args, code, needle in [
        (["project", "admin-key", "nobody", "--new", "--store", store], 1, "No project"),
        (["project", "admin-key", "../etc", "--new", "--store", store], 2, "not a valid"),
        (["project", "admin-key", "", "--new", "--store", store], 2, "not a valid"),
        (["project", "admin-key", name, "--new", "--store",
          f"sqlite:///{tmp_path}/absent.db"], 1, "no fencepost store"),
        (["project", "admin-key", name, "--new", "--store", "mysql://x/y"], 2, "store"),
        (["project", "admin-key"], 2, "NAME"),
    ]:
        out = cli(*args, cwd=tmp_path)
        assert out.returncode == code, (args, out.returncode, out.stderr)
        assert out.stdout == "" and needle in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr
    assert not (tmp_path / "absent.db").exists()
    assert not list(tmp_path.glob("*.admin-key"))
    assert key_count(fresh_server, key) == before


def test_the_key_file_may_be_chosen_and_an_unwritable_one_is_not_fatal(
        fresh_server: ServerProcess, tmp_path: Path) -> None:
    chosen = tmp_path / "acme.key"
    name = unique_name("chosen")
    out = cli("project", "create", name, "--store", fresh_server.store_url,
              "--key-file", str(chosen))
    assert out.returncode == 0, out.stderr
    assert chosen.read_text() == out.stdout and str(chosen) in out.stderr
    assert_private(chosen)
    # A folder that is not there: the key was minted all the same, and printed.
    again = cli("project", "admin-key", name, "--new", "--store", fresh_server.store_url,
                "--key-file", str(tmp_path / "missing" / "acme.key"))
    assert again.returncode == 0, again.stderr
    secret = again.stdout.strip()
    assert secret and "could not save" in again.stderr and secret not in again.stderr
    assert true_within(lambda: whoami(fresh_server, secret).status_code == 200,
                       time.monotonic(), 2.0)


def test_admin_key_new_on_postgresql(tmp_path: Path) -> None:
    from pg_support import temporary_database

    with temporary_database() as url:
        created = cli("project", "create", "acme", "--store", url, "--create", cwd=tmp_path)
        assert created.returncode == 0, created.stderr
        minted = cli("project", "admin-key", "acme", "--new", "--store", url, cwd=tmp_path)
        assert minted.returncode == 0, minted.stderr
        secret = minted.stdout.strip()
        assert (tmp_path / "fencepost.acme.admin-key").read_text() == secret + "\n"
        server = ServerProcess(tmp_path / "pg", store=url).start()
        try:
            me = whoami(server, secret).json()
            assert (me["project"], me["role"]) == ("acme", "admin")
            assert key_count(server, secret) == 2
        finally:
            server.stop()
