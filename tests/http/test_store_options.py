"""`fencepost serve`'s store options (SPEC §6): both libpq multi-host URL
forms, `--store-timeout` and `--require-sync-replication`, and what bad values
of them get: one line and exit 2, nothing created."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from pg_support import ADMIN_URL, migrated_database
from support import ServerProcess, free_port, lock_headers, new_token


def _multi_host(url: str, form: str) -> str:
    """The database at `url` named twice over (the same server both times), in
    one of libpq's two multi-host forms."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or 5432
    user = parts.username or "postgres"
    if form == "authority":
        return f"postgresql://{user}@{host}:{port},{host}:{port}{parts.path}"
    return f"postgresql://{user}@{parts.path}?host={host},{host}&port={port},{port}"


@pytest.mark.parametrize("form", ["authority", "query"])
def test_both_multi_host_forms_serve(tmp_path: Path, form: str) -> None:
    with migrated_database() as url:
        store = _multi_host(url, form)
        server = ServerProcess(tmp_path / form, store=store).start()
        try:
            with server.client() as client:
                resp = client.put("/v1/locks/multi/lease", headers=lock_headers(new_token()),
                                  json={"ttl_seconds": 30})
                assert resp.status_code == 201, resp.text
                ready = client.get("/readyz").json()
                assert ready["replication"]["mode"] in ("none", "async", "sync")
        finally:
            server.stop()


def _serve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencepost", "serve", "--port", str(free_port()), *args],
        capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.parametrize("value", ["0", "-1", "0.1", "301", "abc", "", "nan", "1e400"])
def test_a_bad_store_timeout_is_refused(tmp_path: Path, value: str) -> None:
    result = _serve("--store-timeout", value, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "--store-timeout" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no store file, no key file


def test_require_sync_replication_on_sqlite_is_refused(tmp_path: Path) -> None:
    result = _serve("--require-sync-replication", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "PostgreSQL" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_store_url_libpq_cannot_read_is_refused(tmp_path: Path) -> None:
    result = _serve("--store", "postgresql://u:s3cret@h/db?nosuchparameter=1", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "libpq" in result.stderr and "s3cret" not in result.stderr


def test_the_store_timeout_is_read_from_the_environment(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    env["FENCEPOST_STORE_TIMEOUT"] = "zero"
    result = subprocess.run(
        [sys.executable, "-m", "fencepost", "serve", "--port", str(free_port())],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert result.returncode == 2 and "--store-timeout" in result.stderr


def test_readyz_on_sqlite_reports_no_replication(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path).start()
    try:
        ready = httpx.get(f"{server.base_url}/readyz", timeout=10).json()
        assert "replication" not in ready
        assert "fencepost_store_replication" not in httpx.get(
            f"{server.base_url}/metrics", timeout=10).text
    finally:
        server.stop()


def test_a_password_in_the_query_is_not_logged(tmp_path: Path) -> None:
    with migrated_database() as url:
        store = f"{url}?password=not-this-one"
        server = ServerProcess(tmp_path, store=store).start()
        try:
            assert "not-this-one" not in server.stderr_path.read_text()
        finally:
            server.stop()
    assert ADMIN_URL  # the suite's server: nothing above touched it but its own database
