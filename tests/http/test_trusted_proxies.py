"""`fencepost serve --trusted-proxies`: X-Forwarded-For decides the caller's
address (for key IP allowlists) only when the TCP peer is a configured proxy."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from support import (
    ServerProcess,
    free_port,
    lock_headers,
    new_token,
    unique_name,
)

CLIENT = "203.0.113.7"
OTHER = "198.51.100.1"


def without_fencepost_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    env.update(extra)
    return env


@pytest.fixture(scope="module", params=["flag", "env"])
def proxied(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that trusts 127.0.0.1 (where the tests connect from) as a proxy,
    configured by the command-line flag or by its environment variable."""
    workdir = tmp_path_factory.mktemp(f"proxied-{request.param}")
    if request.param == "flag":
        proc: ServerProcess = ServerProcess(workdir,
                                            extra_args=["--trusted-proxies", "127.0.0.1"])
    else:
        proc = ServerProcess(
            workdir, extra_env={"FENCEPOST_TRUSTED_PROXIES": "10.0.0.0/8, 127.0.0.1"})
    proc.start()
    yield proc
    proc.stop()


def whoami(server: ServerProcess, key: str, forwarded: str | None) -> httpx.Response:
    headers = {"X-Forwarded-For": forwarded} if forwarded is not None else {}
    with server.client(key) as c:
        return c.get("/v1/whoami", headers=headers)


def assert_forbidden(resp: httpx.Response) -> None:
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"]["code"] == "forbidden", resp.text
    assert resp.headers.get("x-request-id")


def test_allowlisted_address_in_forwarded_for_is_accepted(proxied: ServerProcess) -> None:
    key = proxied.create_key("member", allow_ips=[CLIENT])["key"]
    resp = whoami(proxied, key, CLIENT)
    assert resp.status_code == 200, resp.text
    assert resp.json()["role"] == "member"
    name = unique_name("xff")
    with proxied.client(key) as c:
        acquired = c.put(f"/v1/locks/{name}/lease", headers={
            **lock_headers(new_token()), "X-Forwarded-For": CLIENT}, json={"ttl_seconds": 30})
    assert acquired.status_code == 201, acquired.text


@pytest.mark.parametrize("forwarded", [None, OTHER, f"{CLIENT}, {OTHER}", "garbage"],
                         ids=["none", "other", "forged-left-hop", "garbage"])
def test_other_forwarded_for_is_refused(proxied: ServerProcess, forwarded: str | None) -> None:
    key = proxied.create_key("member", allow_ips=[CLIENT])["key"]
    assert_forbidden(whoami(proxied, key, forwarded))
    name = unique_name("xff")
    headers = {**lock_headers(new_token())}
    if forwarded is not None:
        headers["X-Forwarded-For"] = forwarded
    with proxied.client(key) as c:
        assert_forbidden(c.put(f"/v1/locks/{name}/lease", headers=headers,
                               json={"ttl_seconds": 30}))
        state = c.get(f"/v1/locks/{name}")
    # The refused caller took nothing (reading with the same key is refused too).
    assert_forbidden(state)
    with proxied.client() as admin:
        assert admin.get(f"/v1/locks/{name}").json()["held"] is False


@pytest.mark.parametrize("forwarded", [f"{OTHER}, {CLIENT}", f"{CLIENT}, 127.0.0.1",
                                       f"{OTHER} ,  ,{CLIENT}"],
                         ids=["proxy-appended", "behind-inner-proxy", "spaces"])
def test_right_most_untrusted_hop_is_the_caller(proxied: ServerProcess, forwarded: str) -> None:
    key = proxied.create_key("member", allow_ips=[CLIENT])["key"]
    resp = whoami(proxied, key, forwarded)
    assert resp.status_code == 200, resp.text


def test_the_proxy_address_itself_no_longer_passes_when_forwarded_for_names_a_client(
    proxied: ServerProcess,
) -> None:
    # A key for the proxy's own address: the request comes from CLIENT, not from it.
    key = proxied.create_key("member", allow_ips=["127.0.0.1"])["key"]
    assert_forbidden(whoami(proxied, key, CLIENT))
    assert whoami(proxied, key, None).status_code == 200  # no header: the peer is the caller


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize("value", ["not-an-ip", "10.0.0.0/33", "127.0.0.1, bogus"])
def test_bad_trusted_proxies_exit_non_zero_with_a_clear_message(
    tmp_path: Path, how: str, value: str,
) -> None:
    args = [sys.executable, "-m", "fencepost", "serve",
            "--store", f"sqlite:///{tmp_path / 'f.db'}",
            "--host", "127.0.0.1", "--port", str(free_port())]
    env = without_fencepost_env()
    if how == "flag":
        args += ["--trusted-proxies", value]
    else:
        env["FENCEPOST_TRUSTED_PROXIES"] = value
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env,
                             cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve with --trusted-proxies {value!r} did not exit (it is serving?)")
    assert out.returncode != 0, out
    assert "Traceback" not in out.stderr, out.stderr
    assert "trusted-proxies" in out.stderr, out.stderr
    bad = "bogus" if "bogus" in value else value
    assert bad in out.stderr, out.stderr
