"""Helpers for the documentation's tests: a real server started as a reader's
would be (no bootstrap key: it writes fencepost.db.admin-key), a small stand-in
for the upstream API the recipes guard, and the environment examples run in."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from identity_provider import AUDIENCE, ISSUER, IdentityProvider, SigningKey

from support import ServerProcess

_IDENTITY_PROVIDER: IdentityProvider | None = None


def identity_provider() -> IdentityProvider:
    """The identity provider the docs' JWT examples sign in with (one per test
    process): its tokens reach the examples as $JWT, $USER_JWT and $TOKEN_FILE."""
    global _IDENTITY_PROVIDER
    if _IDENTITY_PROVIDER is None:
        _IDENTITY_PROVIDER = IdentityProvider(SigningKey.make("ES256"))
    return _IDENTITY_PROVIDER


class FirstStartServer(ServerProcess):
    """`fencepost serve` as on a first start: it generates the admin key and
    saves it beside the database, where the docs' examples read it. It takes
    JWTs from the docs' identity provider too, as docs/operations.md shows."""

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in super().env().items() if not k.startswith("FENCEPOST_")}
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 20.0) -> FirstStartServer:
        if "--jwt-issuer" not in self.extra_args:
            idp = identity_provider()
            self.extra_args += ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE,
                                "--jwt-jwks", idp.jwks_url]
        super().start(timeout)
        key_file = self.workdir / "fencepost.db.admin-key"
        deadline = time.monotonic() + timeout
        while not key_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.admin_key = key_file.read_text().strip()
        return self


class Upstream:
    """The API a pool guards: answers `status` (200 by default) with a small
    JSON body, and counts the calls."""

    def __init__(self) -> None:
        self.status = 200
        self.calls = 0
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                upstream.calls += 1
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = json.dumps({"ok": upstream.status < 400}).encode()
                self.send_response(upstream.status)
                if upstream.status == 429:
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def example_env(server: ServerProcess, upstream_url: str) -> dict[str, str]:
    """What a reader's shell has after the docs' setup: the `fencepost` command
    on PATH and the server's URL and admin key in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["FENCEPOST_URL"] = server.base_url
    env["FENCEPOST_API_KEY"] = server.admin_key
    env["UPSTREAM"] = upstream_url
    # What a reader signed in at an identity provider has: a member's token
    # ($JWT, and in $TOKEN_FILE as a sidecar would keep it), a user's token
    # without fencepost claims ($USER_JWT) and an application's key ($APP_KEY).
    idp = identity_provider()
    hour = int(time.time()) + 3600
    env["JWT"] = idp.token("ada", name="Ada Lovelace", exp=hour)
    token_file = server.workdir / "token"
    token_file.write_text(env["JWT"] + "\n")
    env["TOKEN_FILE"] = str(token_file)
    env["USER_JWT"] = idp.token("grace", name="Grace Hopper", exp=hour,
                                fencepost_project=None, fencepost_role=None)
    env["APP_KEY"] = server.create_key("member", name="web-app")["key"]
    return env
