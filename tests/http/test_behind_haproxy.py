"""fencepost behind a real HAProxy (Debian's package) with `option forwardfor`:
the proxy appends its own X-Forwarded-For line after whatever the client sent,
so a forged first line must not decide the caller's address (SPEC §2)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from support import ServerProcess, free_port, lock_headers, missing, new_token, unique_name

# The test's client connects from a second loopback address, so that the
# trusted proxy (127.0.0.1, HAProxy's own source address) and the caller differ.
CALLER = "127.0.0.2"
FORGED = "10.1.2.3"

CONFIG = """
global
    maxconn 256
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend front
    bind 127.0.0.1:{front}
    option forwardfor
    default_backend fencepost
backend fencepost
    server one 127.0.0.1:{back}
"""


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy"
                                        if os.path.exists("/usr/sbin/haproxy") else None)
    if found is None:
        missing("haproxy (.ci/run installs Debian's haproxy)")
    return found


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    binary = haproxy_binary()
    workdir = tmp_path_factory.mktemp("haproxy")
    server = ServerProcess(workdir / "server", extra_args=["--trusted-proxies", "127.0.0.1"])
    server.start()
    front = free_port()
    config = workdir / "haproxy.cfg"
    config.write_text(CONFIG.format(front=front, back=server.port))
    proxy = subprocess.Popen([binary, "-db", "-f", str(config)],
                             stdout=subprocess.DEVNULL, stderr=open(workdir / "haproxy.err", "w"))
    base = f"http://127.0.0.1:{front}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proxy.poll() is None, (workdir / "haproxy.err").read_text()
            assert time.monotonic() < deadline, "haproxy never passed a request through"
            time.sleep(0.05)
        yield server, base
    finally:
        proxy.send_signal(signal.SIGTERM)
        try:
            proxy.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait(timeout=5)
        server.stop()


def through_proxy(base: str, key: str) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=CALLER)
    return httpx.Client(base_url=base, transport=transport, timeout=30,
                        headers={"Authorization": f"Bearer {key}"})


def test_a_forged_forwarded_for_line_does_not_pass_the_allowlist(
    proxied: tuple[ServerProcess, str],
) -> None:
    server, base = proxied
    key = server.create_key("member", allow_ips=["10.0.0.0/8"])["key"]
    name = unique_name("haproxy")
    with through_proxy(base, key) as c:
        who = c.get("/v1/whoami", headers={"X-Forwarded-For": FORGED})
        assert who.status_code == 403, who.text
        grab = c.put(f"/v1/locks/{name}/lease", json={"ttl_seconds": 30},
                     headers={**lock_headers(new_token()), "X-Forwarded-For": FORGED})
        assert grab.status_code == 403, grab.text
    with server.client() as admin:
        assert admin.get(f"/v1/locks/{name}").json()["held"] is False


def test_the_real_caller_address_passes_its_allowlist(proxied: tuple[ServerProcess, str]) -> None:
    server, base = proxied
    key = server.create_key("member", allow_ips=[f"{CALLER}/32"])["key"]
    with through_proxy(base, key) as c:
        assert c.get("/v1/whoami").status_code == 200
        # A forged line in front changes nothing: the proxy's line names the caller.
        assert c.get("/v1/whoami", headers={"X-Forwarded-For": FORGED}).status_code == 200


def test_repeated_authorization_through_the_proxy_is_400(
    proxied: tuple[ServerProcess, str],
) -> None:
    server, base = proxied
    with httpx.Client(base_url=base, timeout=30) as c:
        resp = c.get("/v1/whoami", headers=[("Authorization", f"Bearer {server.admin_key}"),
                                            ("Authorization", "Bearer fp_someone_else")])
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_request"


