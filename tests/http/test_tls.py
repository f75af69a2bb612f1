"""`fencepost serve --tls-cert/--tls-key` serves HTTPS (SPEC §6), and the
client and CLI trust a private CA through `ca_bundle` / FENCEPOST_CA_BUNDLE.
The certificates are made in the test (trustme)."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

import fencepost
from fencepost.errors import TransportError
from support import ServerProcess, free_port, unique_name

GUARD_S = 20.0


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_server(
    authority: trustme.CA, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerProcess, Path]]:
    workdir = tmp_path_factory.mktemp("tls")
    cert = authority.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = workdir / "cert.pem", workdir / "key.pem", workdir / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    authority.cert_pem.write_to_path(str(ca_file))
    server = ServerProcess(workdir / "server",
                           extra_args=["--tls-cert", str(cert_file), "--tls-key", str(key_file)])
    server.spawn()
    context = ssl.create_default_context(cafile=str(ca_file))
    deadline = time.monotonic() + GUARD_S
    try:
        while True:
            assert server.proc is not None and server.proc.poll() is None, \
                server.stderr_path.read_text()
            try:
                if httpx.get(f"https://127.0.0.1:{server.port}/healthz", verify=context,
                             timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, server.stderr_path.read_text()
            time.sleep(0.05)
        yield server, ca_file
    finally:
        server.stop()


def https_url(server: ServerProcess) -> str:
    return f"https://127.0.0.1:{server.port}"


def test_the_client_trusts_a_private_ca_bundle(tls_server: tuple[ServerProcess, Path]) -> None:
    server, ca_file = tls_server
    with fencepost.Client(https_url(server), server.admin_key, ca_bundle=str(ca_file)) as client:
        assert client.whoami().role == "admin"
        with client.lock(unique_name("tls"), ttl=30) as held:
            assert held.fencing_token > 0
    assert "serving on https://" in server.stderr_path.read_text()


async def test_the_async_client_reads_the_bundle_from_the_environment(
    tls_server: tuple[ServerProcess, Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, ca_file = tls_server
    monkeypatch.setenv("FENCEPOST_CA_BUNDLE", str(ca_file))
    async with fencepost.AsyncClient(https_url(server), server.admin_key) as client:
        assert (await client.whoami()).role == "admin"


def test_a_client_without_the_ca_refuses_the_server(
    tls_server: tuple[ServerProcess, Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, _ = tls_server
    monkeypatch.delenv("FENCEPOST_CA_BUNDLE", raising=False)
    with fencepost.Client(https_url(server), server.admin_key,
                          retries=fencepost.Retries(attempts=1)) as client:
        with pytest.raises(TransportError) as caught:
            client.whoami()
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value) or "certificate" in str(caught.value)


async def test_the_async_client_without_the_ca_refuses_the_server_before_sending(
    tls_server: tuple[ServerProcess, Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, _ = tls_server
    monkeypatch.delenv("FENCEPOST_CA_BUNDLE", raising=False)
    async with fencepost.AsyncClient(https_url(server), server.admin_key,
                                     retries=fencepost.Retries(attempts=1)) as client:
        with pytest.raises(TransportError) as caught:
            await client.whoami()
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
    assert caught.value.maybe_sent is False  # the handshake failed: no request went out


def test_the_cli_trusts_the_bundle_from_the_environment(
    tls_server: tuple[ServerProcess, Path],
) -> None:
    server, ca_file = tls_server
    env = {**os.environ, "FENCEPOST_URL": https_url(server), "FENCEPOST_API_KEY": server.admin_key,
           "FENCEPOST_CA_BUNDLE": str(ca_file)}
    out = subprocess.run([sys.executable, "-m", "fencepost", "whoami"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert "admin" in out.stdout


def test_plain_http_on_the_tls_port_gets_no_answer_and_harms_nobody(
    tls_server: tuple[ServerProcess, Path],
) -> None:
    server, ca_file = tls_server
    with socket.create_connection(("127.0.0.1", server.port), timeout=GUARD_S) as sock:
        sock.sendall(b"GET /v1/whoami HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = sock.recv(4096)
        except ConnectionResetError:
            answer = b""
        assert not answer.startswith(b"HTTP/1.1 200"), answer
    with fencepost.Client(https_url(server), server.admin_key, ca_bundle=str(ca_file)) as client:
        assert client.whoami().role == "admin"


def serve_args(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    return subprocess.run(
        [sys.executable, "-m", "fencepost", "serve", "--store",
         f"sqlite:///{tmp_path / 'f.db'}", "--port", str(free_port()), *extra],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)


@pytest.mark.parametrize("args,needle", [
    (["--tls-cert", "cert.pem"], "--tls-key"),
    (["--tls-key", "key.pem"], "--tls-cert"),
    (["--tls-cert", "missing.pem", "--tls-key", "missing-key.pem"], "missing"),
    (["--tls-cert", "garbage.pem", "--tls-key", "garbage.pem"], "garbage.pem"),
], ids=["cert-alone", "key-alone", "missing-files", "not-pem"])
def test_bad_tls_options_are_one_line_errors_that_create_nothing(
    tmp_path: Path, args: list[str], needle: str,
) -> None:
    (tmp_path / "garbage.pem").write_text("not a certificate\n")
    out = serve_args(tmp_path, *args)
    assert out.returncode != 0, out
    assert "Traceback" not in out.stderr, out.stderr
    assert needle in out.stderr, out.stderr
    assert not (tmp_path / "f.db").exists()
    assert not list(tmp_path.glob("f.db*"))
