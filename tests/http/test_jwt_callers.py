"""Callers from an identity provider over HTTP (SPEC §5.1), on both stores: a
token alone, an application's key acting for its user, the Cloudflare Access
header, and every kind of bad token refused with its reason and nothing done."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from identity_provider import AUDIENCE, ISSUER, IdentityProvider, SigningKey

from pg_support import server_on
from support import (
    ServerProcess,
    assert_error,
    lock_headers,
    metric,
    new_token,
    unique_name,
    wait_for,
)

JWT_HEADER = "Cf-Access-Jwt-Assertion"


@pytest.fixture(scope="module")
def idp() -> Iterator[IdentityProvider]:
    made = IdentityProvider(SigningKey.make("RS256"), SigningKey.make("ES256"))
    yield made
    made.close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, idp: IdentityProvider,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder: Path = tmp_path_factory.mktemp("jwt")
    args = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-jwks", idp.jwks_url,
            "--jwt-header", JWT_HEADER, "--event-log", str(folder / "events.log")]
    with server_on(request.param, folder, args) as started:
        yield started


def _events(server: ServerProcess) -> list[dict[str, Any]]:
    path = server.workdir.parent / "events.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _as(server: ServerProcess, token: str, key: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"}
    if key is not None:
        headers["X-Api-Key"] = key
    return httpx.Client(base_url=server.base_url, headers=headers, timeout=30)


def _acquire(c: httpx.Client, key: str, token: str) -> httpx.Response:
    return c.put(f"/v1/locks/{key}/lease", headers=lock_headers(token), json={"ttl_seconds": 60})


def test_a_token_alone_holds_and_owns_a_lock(server: ServerProcess,
                                             idp: IdentityProvider) -> None:
    key, token = unique_name(), new_token()
    with _as(server, idp.token("alice", fencepost_role="member")) as alice:
        who = alice.get("/v1/whoami").json()
        assert who["key_id"] == "jwt:alice" and who["via"] == "jwt"
        assert (who["project"], who["role"], who["key_name"]) == ("default", "member", "Alice")
        assert "app_key_id" not in who  # no application acts for alice
        granted = _acquire(alice, key, token)
        assert granted.status_code == 201, granted.text
    with server.client() as admin:
        holder = admin.get(f"/v1/locks/{key}").json()["holder"]
        assert holder == {"key_id": "jwt:alice", "key_name": "Alice"}
        listed = admin.get("/v1/locks", params={"prefix": key}).json()["locks"]
        assert listed[0]["holder"] == holder
    # Another user of the same project may not force-release it; its owner may.
    with _as(server, idp.token("bob")) as bob:
        assert_error(bob.delete(f"/v1/locks/{key}"), 403)
    with _as(server, idp.token("alice")) as alice:
        assert alice.delete(f"/v1/locks/{key}").status_code == 200
    with server.client() as admin:
        assert admin.get(f"/v1/locks/{key}").json()["holder"] is None


def test_a_waiting_token_caller_is_named_in_the_line(server: ServerProcess,
                                                     idp: IdentityProvider) -> None:
    key, first = unique_name(), new_token()
    with server.client() as admin:
        assert _acquire(admin, key, first).status_code == 201

        def wait() -> None:
            with _as(server, idp.token("carol", name="Carol C.")) as carol:
                carol.put(f"/v1/locks/{key}/lease", headers=lock_headers(new_token()),
                          json={"ttl_seconds": 60, "wait_seconds": 5})

        waiter = threading.Thread(target=wait)
        waiter.start()
        try:
            line = wait_for(lambda: admin.get(f"/v1/locks/{key}").json()["line"])
            assert line[0]["key_id"] == "jwt:carol" and line[0]["key_name"] == "Carol C."
        finally:
            admin.delete(f"/v1/locks/{key}/lease", headers=lock_headers(first))
            waiter.join()


def test_a_token_caller_takes_pool_slots_as_itself(server: ServerProcess,
                                                   idp: IdentityProvider) -> None:
    pool = unique_name("pool")
    with server.client() as admin:
        assert admin.put(f"/v1/pools/{pool}", json={"limit": 2}).status_code in (200, 201)
    with _as(server, idp.token("dave")) as dave:
        slot = dave.post(f"/v1/pools/{pool}/lock/acquire", json={})
        assert slot.status_code in (200, 201), slot.text
    with server.client() as admin:
        slots = admin.get(f"/v1/pools/{pool}/slots").json()["slots"]
        assert [(s["key_id"], s["key_name"]) for s in slots] == [("jwt:dave", "Dave")]


def test_the_role_claim_bounds_what_a_token_may_do(server: ServerProcess,
                                                  idp: IdentityProvider) -> None:
    with _as(server, idp.token("erin", fencepost_role="reader")) as reader:
        assert reader.get("/v1/locks").status_code == 200
        assert_error(_acquire(reader, unique_name(), new_token()), 403)
    with _as(server, idp.token("frank", fencepost_role="admin")) as admin:
        made = admin.post("/v1/keys", json={"role": "reader", "name": "by-frank"})
        assert made.status_code == 201, made.text
        err = assert_error(admin.post("/v1/keys/refresh"), 403)
        assert "identity provider" in err["message"]


def test_an_app_key_acts_for_its_user(server: ServerProcess, idp: IdentityProvider) -> None:
    app = server.create_key("member", name="deploy-bot")
    key, token = unique_name(), new_token()
    # The user's token need carry no fencepost claims: the key gives project and role.
    user = idp.token("grace", fencepost_project=None, fencepost_role=None)
    with _as(server, user, key=app["key"]) as c:
        who = c.get("/v1/whoami").json()
        assert (who["key_id"], who["app_key_id"], who["role"]) == (
            "jwt:grace", app["id"], "member")
        assert _acquire(c, key, token).status_code == 201
        # The app's role is a ceiling: an admin claim does not lift a member key.
    with _as(server, idp.token("grace", fencepost_role="admin", fencepost_project=None),
             key=app["key"]) as c:
        assert c.get("/v1/whoami").json()["role"] == "member"
        assert_error(c.put(f"/v1/pools/{unique_name('pool')}", json={"limit": 1}), 403)
    with server.client() as admin:
        assert admin.get(f"/v1/locks/{key}").json()["holder"]["key_id"] == "jwt:grace"
    # The user owns it: the same app acting for another user may not force-release it.
    with _as(server, idp.token("heidi", fencepost_project=None), key=app["key"]) as c:
        assert_error(c.delete(f"/v1/locks/{key}"), 403)
    with _as(server, idp.token("grace", fencepost_project=None), key=app["key"]) as c:
        assert c.delete(f"/v1/locks/{key}").status_code == 200
    granted = [e for e in _events(server) if e.get("event") == "lease.granted"
               and e.get("lock") == key]
    assert granted and granted[0]["key_id"] == "jwt:grace"
    assert granted[0]["app_key_id"] == app["id"]


def test_an_app_acting_for_a_user_keeps_its_own_bounds(server: ServerProcess,
                                                       idp: IdentityProvider) -> None:
    reader_app = server.create_key("reader")
    user = idp.token("ivan", fencepost_project=None, fencepost_role="admin")
    with _as(server, user, key=reader_app["key"]) as c:
        assert_error(_acquire(c, unique_name(), new_token()), 403)
    # A token for another project is refused, not moved into the key's.
    other = idp.token("ivan", fencepost_project="elsewhere")
    member_app = server.create_key("member")
    with _as(server, other, key=member_app["key"]) as c:
        err = assert_error(c.get("/v1/whoami"), 403)
        assert "elsewhere" in err["message"]
    # A revoked app key ends what it did for its users too.
    with server.client() as admin:
        assert admin.delete(f"/v1/keys/{member_app['id']}").status_code == 200
    with _as(server, idp.token("ivan", fencepost_project=None), key=member_app["key"]) as c:
        assert wait_for(lambda: c.get("/v1/whoami").status_code == 401, timeout=5)
    # The app's allowlist holds for its users.
    fenced = server.create_key("member", allow_ips=["10.9.9.9/32"])
    with _as(server, idp.token("ivan", fencepost_project=None), key=fenced["key"]) as c:
        assert_error(c.get("/v1/whoami"), 403)


def test_the_access_header_carries_a_token(server: ServerProcess,
                                           idp: IdentityProvider) -> None:
    token = idp.token("judy")
    with httpx.Client(base_url=server.base_url, headers={JWT_HEADER: token}) as c:
        assert c.get("/v1/whoami").json()["key_id"] == "jwt:judy"
    # Behind Cloudflare Access with an app key: the key acts for the user.
    app = server.create_key("member")
    with httpx.Client(base_url=server.base_url,
                      headers={JWT_HEADER: idp.token("judy", fencepost_project=None),
                               "Authorization": f"Bearer {app['key']}"}) as c:
        who = c.get("/v1/whoami").json()
        assert (who["key_id"], who["app_key_id"]) == ("jwt:judy", app["id"])
    # Two different tokens in one request: which one counts would be a guess.
    with httpx.Client(base_url=server.base_url,
                      headers={JWT_HEADER: token,
                               "Authorization": f"Bearer {idp.token('mallory')}"}) as c:
        assert_error(c.get("/v1/whoami"), 401)


def test_a_rotated_signing_key_is_accepted_at_once(server: ServerProcess,
                                                   idp: IdentityProvider) -> None:
    # A fetch is allowed once per 30 s: earlier tests' unknown kids may have
    # spent this period's, so the new key is accepted within one period.
    new = idp.rotate("ES256")
    fetched = idp.fetches
    deadline = time.monotonic() + 35
    while True:
        with _as(server, idp.token("kim", key=new)) as c:
            resp = c.get("/v1/whoami")
        if resp.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert resp.status_code == 200, resp.text
    assert idp.fetches > fetched


def _bad_tokens(idp: IdentityProvider) -> dict[str, tuple[str, str]]:
    """name: (token, the reason it must be refused with)."""
    now = int(time.time())
    stranger = SigningKey.make("ES256")
    impostor = SigningKey.make(idp.keys[0].alg)  # the provider's key id, another key
    impostor.kid = idp.keys[0].kid
    return {
        "expired": (idp.token("mallory", exp=now - 120), "token_expired"),
        "not yet valid": (idp.token("mallory", nbf=now + 600), "token_not_yet_valid"),
        "wrong issuer": (idp.token("mallory", iss="https://evil.example"), "wrong_issuer"),
        "wrong audience": (idp.token("mallory", aud="other-app"), "wrong_audience"),
        "unknown kid": (idp.token("mallory", key=stranger), "unknown_key_id"),
        "bad signature": (idp.token("mallory", key=impostor), "bad_signature"),
        "alg none": (idp.unsigned(fencepost_role="admin"), "algorithm_not_allowed"),
        "hs256 with the public key": (idp.hmac_forgery(fencepost_role="admin"),
                                      "algorithm_not_allowed"),
        "oversized": (idp.token("mallory", padding="x" * 9000), "token_too_large"),
        "claims missing": (idp.token("mallory", fencepost_project=None), "claims_missing"),
        "unknown project": (idp.token("mallory", fencepost_project="nope"), "unknown_project"),
    }


def test_every_bad_token_is_refused_with_its_reason(server: ServerProcess,
                                                    idp: IdentityProvider) -> None:
    key = unique_name()
    for name, (token, reason) in _bad_tokens(idp).items():
        before = metric(server, "fencepost_tokens_refused_total", reason=reason)
        with _as(server, token) as c:
            resp = _acquire(c, key, new_token())
        err = assert_error(resp, 401)
        assert err.get("reason") == reason, (name, err)
        assert token not in resp.text and token[-20:] not in resp.text, name
        assert metric(server, "fencepost_tokens_refused_total", reason=reason) == before + 1
    with server.client() as admin:
        assert admin.get(f"/v1/locks/{key}").json()["holder"] is None  # nothing was done
    refused = [e for e in _events(server) if e.get("event") == "caller.refused"]
    assert {e.get("reason") for e in refused} >= {"token_expired", "bad_signature"}
    assert not any(token in json.dumps(refused) for token, _ in _bad_tokens(idp).values())


def test_a_server_without_jwt_settings_says_so(tmp_path: Path, idp: IdentityProvider) -> None:
    with server_on("sqlite", tmp_path) as plain:
        with _as(plain, idp.token("alice")) as c:
            err = assert_error(c.get("/v1/whoami"), 401)
            assert "--jwt-issuer" in err["message"]


def test_every_replica_accepts_a_token_and_names_its_holder(
    tmp_path: Path, idp: IdentityProvider,
) -> None:
    """On PostgreSQL, a lease a token caller took through one replica is shown
    with its name by another."""
    from pg_support import migrated_database

    args = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-jwks", idp.jwks_url]
    with migrated_database() as url:
        a = ServerProcess(tmp_path / "a", store=url, extra_args=args).start()
        b = ServerProcess(tmp_path / "b", store=url, extra_args=args).start()
        try:
            key = unique_name()
            with _as(a, idp.token("leo", name="Leo L.")) as c:
                assert _acquire(c, key, new_token()).status_code == 201
            with b.client() as admin:
                holder = admin.get(f"/v1/locks/{key}").json()["holder"]
            assert holder == {"key_id": "jwt:leo", "key_name": "Leo L."}
        finally:
            a.stop()
            b.stop()
