"""The Python client and the CLI with a JWT from a file or a command (SPEC
§5.1): sent as the bearer, read again before it expires and after a refusal,
and beside an application's key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from identity_provider import AUDIENCE, ISSUER, IdentityProvider, SigningKey

import fencepost
from fencepost.client.bearer_token import REREAD_BEFORE_S, BearerToken
from fencepost.errors import Unauthorized
from support import ServerProcess, unique_name


@pytest.fixture(scope="module")
def idp() -> Iterator[IdentityProvider]:
    made = IdentityProvider(SigningKey.make("ES256"))
    yield made
    made.close()


@pytest.fixture(scope="module")
def server(idp: IdentityProvider, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ServerProcess]:
    args = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-jwks", idp.jwks_url]
    started = ServerProcess(tmp_path_factory.mktemp("tokens"), extra_args=args).start()
    yield started
    started.stop()


def test_a_token_file_is_the_bearer_and_holds_a_lock(
    server: ServerProcess, idp: IdentityProvider, tmp_path: Path,
) -> None:
    path = tmp_path / "token"
    path.write_text(idp.token("alice") + "\n")
    key = unique_name()
    with fencepost.Client(server.base_url, token_file=str(path)) as client:
        me = client.whoami()
        assert (me.key_id, me.via, me.key_name) == ("jwt:alice", "jwt", "Alice")
        with client.lock(key, ttl=30) as hold:
            assert client.get_lock(key).holder.key_id == "jwt:alice"  # type: ignore[union-attr]
            assert hold.fencing_token > 0


def test_a_refused_token_is_read_again_and_the_call_sent_once_more(
    server: ServerProcess, idp: IdentityProvider, tmp_path: Path,
) -> None:
    path = tmp_path / "token"
    # Signed by a key the provider never published: refused, whatever it says.
    path.write_text(idp.token("alice", key=SigningKey.make("ES256")))
    with fencepost.Client(server.base_url, token_file=str(path)) as client:
        with pytest.raises(Unauthorized) as refused:
            client.whoami()  # read again after the 401: the same token, so no resend
        assert refused.value.extra.get("reason") == "unknown_key_id"
        path.write_text(idp.token("bob"))  # the sidecar wrote a new one
        assert client.whoami().key_id == "jwt:bob"


async def test_the_async_client_runs_a_token_command(
    server: ServerProcess, idp: IdentityProvider, tmp_path: Path,
) -> None:
    path, runs = tmp_path / "token", tmp_path / "runs"
    path.write_text(idp.token("carol"))
    script = tmp_path / "print-token"
    script.write_text(f"#!/bin/sh\necho run >> {runs}\ncat {path}\n")
    script.chmod(0o755)
    async with fencepost.AsyncClient(server.base_url, token_command=str(script)) as client:
        for _ in range(3):
            assert (await client.whoami()).key_id == "jwt:carol"
    assert runs.read_text().count("run") == 1  # kept while it is far from expiring


def test_an_app_key_with_a_user_token_acts_for_the_user(
    server: ServerProcess, idp: IdentityProvider, tmp_path: Path,
) -> None:
    app = server.create_key("member", name="ci-app")
    path = tmp_path / "token"
    path.write_text(idp.token("dave", fencepost_project=None, fencepost_role=None))
    with fencepost.Client(server.base_url, app["key"], token_file=str(path)) as client:
        me = client.whoami()
    assert (me.key_id, me.app_key_id, me.role) == ("jwt:dave", app["id"], "member")


def test_a_token_is_read_again_shortly_before_it_expires(tmp_path: Path,
                                                         idp: IdentityProvider) -> None:
    now = [time.time()]
    path = tmp_path / "token"
    path.write_text(idp.token("erin", exp=int(now[0]) + 300))
    token = BearerToken(file=str(path), clock=lambda: now[0])
    first = token.current()
    path.write_text(idp.token("erin", exp=int(now[0]) + 900, jti="second"))
    assert token.current() == first  # far from its exp: kept
    now[0] += 300 - REREAD_BEFORE_S + 1
    assert token.current() != first


def test_a_token_source_that_fails_says_why(tmp_path: Path) -> None:
    with pytest.raises(Unauthorized, match="Could not read the token from the file"):
        BearerToken(file=str(tmp_path / "missing")).current()
    with pytest.raises(Unauthorized, match="exited with 3"):
        BearerToken(command="sh -c 'echo nope >&2; exit 3'").current()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(Unauthorized, match="gave no token"):
        BearerToken(file=str(tmp_path / "empty")).current()
    with pytest.raises(ValueError):
        BearerToken(file="a", command="b")


def _cli(server: ServerProcess, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    environment.update(FENCEPOST_URL=server.base_url, **env)
    return subprocess.run([sys.executable, "-m", "fencepost", *args], capture_output=True,
                          text=True, env=environment, timeout=60)


def test_the_cli_takes_a_token_file_or_command(server: ServerProcess, idp: IdentityProvider,
                                               tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(idp.token("frank", name="Frank F."))
    done = _cli(server, "whoami", "--token-file", str(path))
    assert done.returncode == 0, done.stderr
    assert "jwt:frank (Frank F.)" in done.stdout
    done = _cli(server, "whoami", "--json", FENCEPOST_TOKEN_COMMAND=f"cat {path}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["key_id"] == "jwt:frank"
    key = unique_name()
    done = _cli(server, "run", "--lock", key, "--", sys.executable, "-c", "print('ran')",
                FENCEPOST_TOKEN_FILE=str(path))
    assert (done.returncode, done.stdout.strip()) == (0, "ran"), done.stderr


def test_the_cli_refuses_two_token_sources_and_explains_a_refusal(
    server: ServerProcess, idp: IdentityProvider, tmp_path: Path,
) -> None:
    path = tmp_path / "token"
    path.write_text(idp.token("gina", aud="someone-else"))
    done = _cli(server, "whoami", "--token-file", str(path), "--token-command", "true")
    assert done.returncode == 2 and "not both" in done.stderr
    done = _cli(server, "whoami", "--token-file", str(path))
    assert done.returncode == 6, done.stderr
    assert "another audience" in done.stderr


async def test_proxy_clients_send_the_token(server: ServerProcess, idp: IdentityProvider,
                                            tmp_path: Path) -> None:
    """Proxy mode's httpx clients carry the token like every other call: without
    it, a client with no key would be refused (401) before the upstream."""
    from proxy_upstreams import Upstream

    upstream = Upstream()
    try:
        pool = unique_name("pool")
        with server.client() as admin:
            made = admin.put(f"/v1/pools/{pool}", json={
                "limit": 2, "upstream": {"base_url": upstream.url}})
            assert made.status_code == 201, made.text
        path = tmp_path / "token"
        path.write_text(idp.token("hana"))
        with fencepost.Client(server.base_url, api_key="", token_file=str(path)) as client, \
                client.proxy_client(pool, wait=5) as proxied:
            answer = proxied.post("echo", json={"q": 1})
            assert answer.status_code == 200, answer.text
        async with fencepost.AsyncClient(server.base_url, api_key="",
                                         token_file=str(path)) as aclient:
            async with aclient.proxy_client(pool, wait=5) as aproxied:
                answer = await aproxied.get("echo")
                assert answer.status_code == 200, answer.text
        # The user's token went to fencepost, never on to the upstream.
        sent = [dict((k.lower(), v) for k, v in seen["headers"]) for seen in upstream.seen]
        assert len(sent) == 2 and all("authorization" not in h for h in sent)
    finally:
        upstream.close()
