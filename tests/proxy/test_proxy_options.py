"""Proxy mode's server options (SPEC §4.7): `--upstream-allow` keeps pool
admins from pointing the server at addresses it should not call, and https
upstreams are called with certificate checks (a private authority through
`--upstream-ca-file`). Each test runs a server of its own."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from proxy_upstreams import Upstream

from pool_support import make_pool
from support import ServerProcess, unique_name


@pytest.fixture
def tls_upstream(tmp_path: Path) -> Iterator[tuple[Upstream, Path]]:
    """An https upstream whose certificate (for localhost) a private authority
    signed; the authority's PEM file."""
    authority = trustme.CA()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("localhost").configure_cert(context)
    ca_file = tmp_path / "upstream-ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    made = Upstream(tls=context)
    yield made, ca_file
    made.close()


def start(tmp_path: Path, *args: str) -> ServerProcess:
    return ServerProcess(tmp_path / "server", extra_args=list(args)).start()


def test_https_upstreams_are_checked_against_the_public_roots_and_the_ca_file(
        tmp_path: Path, tls_upstream: tuple[Upstream, Path]) -> None:
    upstream, ca_file = tls_upstream
    trusting = start(tmp_path, "--upstream-ca-file", str(ca_file))
    try:
        with trusting.client() as c:
            pool = make_pool(c, upstream={"base_url": upstream.url})
            resp = c.get(f"/v1/pools/{pool}/proxy/echo")
            assert resp.status_code == 200, resp.text
            assert resp.json()["method"] == "GET"
    finally:
        trusting.stop()
    doubting = ServerProcess(tmp_path / "doubting").start()
    try:
        with doubting.client() as c:
            pool = make_pool(c, upstream={"base_url": upstream.url})
            before = len(upstream.seen)
            resp = c.get(f"/v1/pools/{pool}/proxy/echo")
            assert resp.status_code == 502, resp.text
            assert "certificate" in resp.json()["error"]["message"]
            assert len(upstream.seen) == before  # nothing was sent to an unverified host
    finally:
        doubting.stop()


def test_upstream_allow_refuses_what_it_does_not_name(
        tmp_path: Path, tls_upstream: tuple[Upstream, Path]) -> None:
    upstream, _ = tls_upstream
    plain = Upstream()
    server = start(tmp_path, "--upstream-allow", "api.example.com,*.internal.example, 10.0.0.0/8")
    try:
        with server.client() as c:
            for url in (plain.url, "http://localhost:1", "http://169.254.169.254/latest",
                        "http://[::1]:8080", "http://2130706433/"):
                name = unique_name("denied")
                resp = c.put(f"/v1/pools/{name}", json={"limit": 1, "upstream": {"base_url": url}})
                assert resp.status_code == 422, (url, resp.text)
                detail = resp.json()["error"]["details"][0]
                assert detail["field"] == "upstream.base_url" and "upstream-allow" in \
                    detail["message"], detail
                assert c.get(f"/v1/pools/{name}").status_code == 404
            # Named hosts pass without being resolved (a name the operator trusts).
            for url in ("https://api.example.com/v1", "https://llm.internal.example",
                        "http://10.1.2.3:8080"):
                assert make_pool(c, upstream={"base_url": url})
            # A PATCH cannot move a pool's upstream outside either.
            allowed = make_pool(c, upstream={"base_url": "https://api.example.com"})
            moved = c.patch(f"/v1/pools/{allowed}", json={"upstream": {"base_url": plain.url}})
            assert moved.status_code == 422
            assert c.get(f"/v1/pools/{allowed}").json()["upstream"]["base_url"] == \
                "https://api.example.com"
    finally:
        server.stop()
        plain.close()


def test_upstream_allow_by_network_judges_every_address_a_name_has(tmp_path: Path) -> None:
    plain = Upstream()
    server = start(tmp_path, "--upstream-allow", "127.0.0.0/8")
    try:
        with server.client() as c:
            pool = make_pool(c, upstream={"base_url": plain.url})
            assert c.get(f"/v1/pools/{pool}/proxy/echo").status_code == 200
            # localhost resolves to 127.0.0.1 (allowed) and may to ::1 (not):
            # a name is allowed only when every address it has is.
            by_name = c.put(f"/v1/pools/{unique_name('lh')}",
                            json={"limit": 1, "upstream": {"base_url": "http://localhost:9"}})
            addresses = {info[4][0] for info in socket.getaddrinfo("localhost", None)}
            expected = 201 if all(a.startswith("127.") for a in addresses) else 422
            assert by_name.status_code == expected, (addresses, by_name.text)
    finally:
        server.stop()
        plain.close()


@pytest.mark.parametrize(("args", "needle"), [
    (["--upstream-allow", "bad host!"], "--upstream-allow"),
    (["--upstream-allow", "*."], "--upstream-allow"),
    (["--upstream-ca-file", "/nonexistent/ca.pem"], "--upstream-ca-file"),
])
def test_bad_options_stop_the_start(tmp_path: Path, args: list[str], needle: str) -> None:
    done = subprocess.run([sys.executable, "-m", "fencepost", "serve", "--port", "0",
                           "--store", f"sqlite:///{tmp_path}/fp.db", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "fp.db").exists()


def test_a_ca_file_that_is_no_certificate_stops_the_start(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    done = subprocess.run([sys.executable, "-m", "fencepost", "serve", "--port", "0",
                           "--store", f"sqlite:///{tmp_path}/fp.db",
                           "--upstream-ca-file", str(junk)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--upstream-ca-file" in done.stderr, done.stderr
