"""The JWT rules (SPEC §5.1) on their own: which tokens pass, and the reason
each refused one gets, with real keys and a JWKS served over HTTP."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from identity_provider import AUDIENCE, ISSUER, IdentityProvider, SigningKey

from fencepost.core.keys import Role
from fencepost.server import jwks
from fencepost.server.jwks import KeySet, parse_jwks
from fencepost.server.jwt_auth import (
    LEEWAY_S,
    MAX_TOKEN_BYTES,
    JwtSettings,
    JwtVerifier,
    TokenRefused,
    looks_like_jwt,
)


@pytest.fixture
def idp() -> Iterator[IdentityProvider]:
    made = IdentityProvider(SigningKey.make("RS256"), SigningKey.make("ES256"),
                            SigningKey.make("EdDSA"))
    yield made
    made.close()


def _verifier(idp: IdentityProvider, **settings: Any) -> JwtVerifier:
    return JwtVerifier(JwtSettings(ISSUER, AUDIENCE, idp.jwks_url, **settings))


async def _refused(verifier: JwtVerifier, token: str, **kwargs: Any) -> TokenRefused:
    with pytest.raises(TokenRefused) as refused:
        await verifier.verify(token, **kwargs)
    assert refused.value.http_status == 401
    assert token not in refused.value.message
    return refused.value


@pytest.mark.parametrize("index", [0, 1, 2], ids=["RS256", "ES256", "EdDSA"])
async def test_each_allowed_algorithm_is_accepted(idp: IdentityProvider, index: int) -> None:
    verifier = _verifier(idp)
    identity = await verifier.verify(idp.token("alice", key=idp.keys[index]))
    assert identity.caller_id == "jwt:alice"
    assert identity.name == "Alice"
    assert (identity.project, identity.role) == ("default", Role.MEMBER)


async def test_the_name_falls_back_to_the_email(idp: IdentityProvider) -> None:
    identity = await _verifier(idp).verify(idp.token("u-1", name=None, email="u1@example.test"))
    assert identity.name == "u1@example.test"


async def test_expired_and_not_yet_valid_are_refused_past_the_leeway(
    idp: IdentityProvider,
) -> None:
    verifier = _verifier(idp)
    now = int(time.time())
    assert (await _refused(verifier, idp.token(exp=now - LEEWAY_S - 5))).why == "token_expired"
    assert (await _refused(verifier, idp.token(nbf=now + LEEWAY_S + 30))).why == \
        "token_not_yet_valid"
    # Within the leeway, a clock a few seconds apart is forgiven.
    await verifier.verify(idp.token(exp=now - LEEWAY_S + 10))
    await verifier.verify(idp.token(nbf=now + LEEWAY_S - 10))


async def test_wrong_issuer_or_audience_is_refused(idp: IdentityProvider) -> None:
    verifier = _verifier(idp)
    assert (await _refused(verifier, idp.token(iss="https://other.example"))).why == \
        "wrong_issuer"
    assert (await _refused(verifier, idp.token(aud="another-app"))).why == "wrong_audience"
    # An audience list that includes ours is meant for us too.
    await verifier.verify(idp.token(aud=["another-app", AUDIENCE]))


@pytest.mark.parametrize("claim", ["exp", "iss", "aud", "sub"])
async def test_a_required_claim_missing_is_named(idp: IdentityProvider, claim: str) -> None:
    refused = await _refused(_verifier(idp), idp.token(**{claim: None}))
    assert refused.why == "claims_missing"
    assert claim in refused.message


@pytest.mark.parametrize("claim", ["fencepost_project", "fencepost_role"])
async def test_project_and_role_are_needed_unless_a_key_gives_them(
    idp: IdentityProvider, claim: str,
) -> None:
    verifier = _verifier(idp)
    token = idp.token(**{claim: None})
    refused = await _refused(verifier, token)
    assert (refused.why, claim in refused.message) == ("claims_missing", True)
    identity = await verifier.verify(token, needs_claims=False)
    assert getattr(identity, claim.removeprefix("fencepost_")) is None


async def test_a_role_that_is_no_role_is_refused(idp: IdentityProvider) -> None:
    verifier = _verifier(idp)
    assert (await _refused(verifier, idp.token(fencepost_role="root"))).why == "claims_invalid"
    assert (await _refused(verifier, idp.token(fencepost_project=7))).why == "claims_invalid"
    assert (await _refused(verifier, idp.token(sub="x" * 201))).why == "claims_invalid"


async def test_roles_as_a_list_and_claims_by_path(idp: IdentityProvider) -> None:
    verifier = _verifier(idp, project_claim="tenant", role_claim="realm_access.roles")
    token = idp.token(fencepost_project=None, fencepost_role=None, tenant="default",
                      realm_access={"roles": ["offline_access", "reader", "admin"]})
    identity = await verifier.verify(token)
    assert (identity.project, identity.role) == ("default", Role.ADMIN)


async def test_a_bad_signature_is_refused(idp: IdentityProvider) -> None:
    verifier = _verifier(idp)
    header, payload, signature = idp.token().split(".")
    forged = json.loads(base64.urlsafe_b64decode(payload + "=="))
    forged["fencepost_role"] = "admin"
    tampered = base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode()
    assert (await _refused(verifier, f"{header}.{tampered}.{signature}")).why == "bad_signature"
    # Signed by a key the provider does not have, under the provider's key id.
    stranger = SigningKey.make("RS256")
    stranger.kid = idp.keys[0].kid
    assert (await _refused(verifier, idp.token(key=stranger))).why == "bad_signature"


async def test_none_and_hmac_with_the_public_key_are_refused(idp: IdentityProvider) -> None:
    verifier = _verifier(idp)
    refused = await _refused(verifier, idp.unsigned("alice"))
    assert (refused.why, "none" in refused.message) == ("algorithm_not_allowed", True)
    # The RSA public key, as published, used as an HMAC secret.
    refused = await _refused(verifier, idp.hmac_forgery("alice"))
    assert (refused.why, "HS256" in refused.message) == ("algorithm_not_allowed", True)


async def test_an_algorithm_the_key_does_not_fit_is_unknown(idp: IdentityProvider) -> None:
    """A token claiming ES256 under the RSA key's id finds no key to check it."""
    verifier = _verifier(idp)
    es = idp.keys[1]
    token = jwt.encode(idp.claims(), es.private, algorithm="ES256",
                       headers={"kid": idp.keys[0].kid})
    assert (await _refused(verifier, token)).why == "unknown_key_id"


async def test_oversized_and_malformed_tokens_are_refused(idp: IdentityProvider) -> None:
    verifier = _verifier(idp)
    huge = idp.token(padding="x" * MAX_TOKEN_BYTES)
    refused = await _refused(verifier, huge)
    assert refused.why == "token_too_large"
    assert idp.fetches == 0  # refused before any work
    assert (await _refused(verifier, "eyJ.not.atoken")).why == "malformed_token"


async def test_an_unknown_key_id_fetches_at_most_once_per_period(
    idp: IdentityProvider, monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    keys = KeySet(idp.jwks_url, clock=lambda: now[0])
    verifier = JwtVerifier(JwtSettings(ISSUER, AUDIENCE, idp.jwks_url), keys)
    await verifier.verify(idp.token())
    assert idp.fetches == 1
    stranger = SigningKey.make("RS256")
    for _ in range(20):
        assert (await _refused(verifier, idp.token(key=stranger))).why == "unknown_key_id"
    # The first unknown kid within 30 s of the last fetch may not fetch again.
    assert idp.fetches == 1
    now[0] += jwks.REFETCH_S
    await _refused(verifier, idp.token(key=stranger))
    assert idp.fetches == 2
    # Rotation: the provider's new key is fetched when a token first names it.
    new = idp.rotate("ES256")
    now[0] += jwks.REFETCH_S
    identity = await verifier.verify(idp.token("bob", key=new))
    assert identity.caller_id == "jwt:bob"
    assert idp.fetches == 3


async def test_an_old_set_is_refreshed_so_a_withdrawn_key_stops_working(
    idp: IdentityProvider,
) -> None:
    now = [1000.0]
    keys = KeySet(idp.jwks_url, clock=lambda: now[0])
    verifier = JwtVerifier(JwtSettings(ISSUER, AUDIENCE, idp.jwks_url), keys)
    old = idp.keys[0]
    await verifier.verify(idp.token(key=old))
    idp.rotate("RS256", keep_old=False)
    now[0] += jwks.MAX_AGE_S + 1
    await verifier.verify(idp.token(key=old))  # served from the old set; refreshes behind
    assert keys._refresh is not None
    await keys._refresh
    assert (await _refused(verifier, idp.token(key=old))).why == "unknown_key_id"


async def test_an_outage_keeps_the_keys_held(idp: IdentityProvider) -> None:
    now = [1000.0]
    keys = KeySet(idp.jwks_url, clock=lambda: now[0])
    verifier = JwtVerifier(JwtSettings(ISSUER, AUDIENCE, idp.jwks_url), keys)
    await verifier.verify(idp.token())
    idp.fail = True
    now[0] += jwks.MAX_AGE_S + 1
    await verifier.verify(idp.token())
    assert keys._refresh is not None
    await keys._refresh
    await verifier.verify(idp.token())  # still trusted: nothing said otherwise
    refused = await _refused(verifier, idp.token(key=SigningKey.make("RS256")))
    assert "could not be read" in refused.message


def test_a_jwks_file_keeps_only_usable_signing_keys(tmp_path: Path) -> None:
    weak = SigningKey.make("RS256", bits=1024)
    good = SigningKey.make("EdDSA")
    enc = SigningKey.make("RS256").jwk() | {"use": "enc"}
    hmac_key = {"kty": "oct", "k": "c2VjcmV0", "kid": "h"}
    document = {"keys": [weak.jwk(), good.jwk(), enc, hmac_key, {"kty": "RSA"}]}
    kept = parse_jwks(json.dumps(document))
    assert [key.kid for key in kept] == [good.kid]
    with pytest.raises(ValueError, match="no usable signing key"):
        parse_jwks(json.dumps({"keys": [weak.jwk(), hmac_key]}))
    with pytest.raises(ValueError, match="not JSON"):
        parse_jwks("{")
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(document))
    assert [key["kid"] for key in KeySet(str(path)).held()] == [good.kid]


async def test_a_jwks_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    idp = IdentityProvider()
    try:
        path = idp.write_file(tmp_path / "jwks.json")
        now = [1000.0]
        keys = KeySet(str(path), clock=lambda: now[0])
        verifier = JwtVerifier(JwtSettings(ISSUER, AUDIENCE, str(path)), keys)
        await verifier.verify(idp.token())
        new = idp.rotate("EdDSA")
        idp.write_file(path)
        now[0] += jwks.REFETCH_S
        assert (await verifier.verify(idp.token("carol", key=new))).caller_id == "jwt:carol"
    finally:
        idp.close()


def test_what_looks_like_a_jwt() -> None:
    assert looks_like_jwt("eyJhbGciOi.eyJzdWIi.c2ln")
    assert not looks_like_jwt("fp_" + "a" * 43)
    assert not looks_like_jwt("eyJ.only-one-dot")


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    return subprocess.run(
        [sys.executable, "-m", "fencepost", "serve", "--store",
         f"sqlite:///{tmp_path / 'fp.db'}", "--port", "0", *args],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)


@pytest.mark.parametrize("args, said", [
    (["--jwt-issuer", ISSUER], "--jwt-audience, --jwt-jwks"),
    (["--jwt-issuer", ISSUER, "--jwt-jwks", "https://idp.example/certs"], "--jwt-audience"),
    (["--jwt-header", "Cf-Access-Jwt-Assertion"], "--jwt-header needs"),
    (["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-jwks", "/no/such/jwks.json"],
     "--jwt-jwks"),
    (["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-jwks",
      "https://idp.example/certs", "--jwt-header", "X-Api-Key"], "cannot carry a token"),
])
def test_serve_refuses_half_a_jwt_setup_and_creates_nothing(
    tmp_path: Path, args: list[str], said: str,
) -> None:
    done = _serve(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr
    assert not (tmp_path / "fp.db").exists()


def test_serve_refuses_a_jwks_file_without_usable_keys(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}))
    done = _serve(tmp_path, "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE,
                  "--jwt-jwks", str(path))
    assert done.returncode == 2 and "no usable signing key" in done.stderr
