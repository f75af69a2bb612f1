"""An identity provider for the JWT tests (SPEC §5.1): real signing keys made
with `cryptography` (RSA 2048, EC P-256, Ed25519), a JWKS served over HTTP by a
local server that counts its fetches, tokens signed with PyJWT, and key
rotation. What it publishes is a real provider's document: `keys` with kty,
kid, use and alg, as Keycloak and Cloudflare Access publish them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

ISSUER = "https://idp.example.test/realms/ops"
AUDIENCE = "fencepost"


@dataclass
class SigningKey:
    alg: str
    private: Any
    kid: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @classmethod
    def make(cls, alg: str = "RS256", bits: int = 2048) -> SigningKey:
        if alg == "RS256":
            return cls(alg, rsa.generate_private_key(public_exponent=65537, key_size=bits))
        if alg == "ES256":
            return cls(alg, ec.generate_private_key(ec.SECP256R1()))
        if alg == "EdDSA":
            return cls(alg, ed25519.Ed25519PrivateKey.generate())
        raise ValueError(alg)

    def jwk(self) -> dict[str, Any]:
        public = self.private.public_key()
        codec = {"RS256": RSAAlgorithm, "ES256": ECAlgorithm, "EdDSA": OKPAlgorithm}[self.alg]
        entry: dict[str, Any] = json.loads(codec.to_jwk(public))
        entry.update(kid=self.kid, use="sig", alg=self.alg)
        return entry


class IdentityProvider:
    """Keys, tokens and a JWKS endpoint (`jwks_url`), or a JWKS file (`write_file`)."""

    def __init__(self, *keys: SigningKey, issuer: str = ISSUER, audience: str = AUDIENCE) -> None:
        self.keys = list(keys) or [SigningKey.make("RS256")]
        self.issuer, self.audience = issuer, audience
        self.fetches = 0
        self.fail = False  # answer 503 to fetches (an outage)
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                provider.fetches += 1
                if provider.fail:
                    self.send_response(503)
                    self.end_headers()
                    return
                body = json.dumps(provider.document()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def jwks_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/protocol/openid-connect/certs"

    def document(self) -> dict[str, Any]:
        return {"keys": [key.jwk() for key in self.keys]}

    def write_file(self, path: Path) -> Path:
        path.write_text(json.dumps(self.document()))
        return path

    def rotate(self, alg: str = "RS256", keep_old: bool = True) -> SigningKey:
        """A new signing key, published first in the set (the old one kept
        for tokens still in flight unless `keep_old` is False)."""
        new = SigningKey.make(alg)
        self.keys = [new, *self.keys] if keep_old else [new]
        return new

    def claims(self, sub: str | None = "alice", **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer, "aud": self.audience, "sub": sub, "iat": now,
            "nbf": now, "exp": now + 300, "name": sub.title() if sub else None,
            "fencepost_project": "default", "fencepost_role": "member",
        }
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, sub: str | None = "alice", *, key: SigningKey | None = None,
              headers: dict[str, Any] | None = None, **overrides: Any) -> str:
        """A token signed by the provider's first key (or `key`); a claim given
        as None is left out."""
        signer = key or self.keys[0]
        return jwt.encode(self.claims(sub, **overrides), signer.private, algorithm=signer.alg,
                          headers={"kid": signer.kid, **(headers or {})})

    def unsigned(self, sub: str = "mallory", **overrides: Any) -> str:
        """A token with `alg: none`, under the provider's first key id."""
        return jwt.encode(self.claims(sub, **overrides), None, algorithm="none",
                          headers={"kid": self.keys[0].kid})

    def hmac_forgery(self, sub: str = "mallory", **overrides: Any) -> str:
        """The classic confusion (RFC 8725 §2.1): HS256 with the provider's
        published public key, as PEM, used as the HMAC secret."""
        public = self.keys[0].private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

        def part(data: bytes) -> bytes:
            return base64.urlsafe_b64encode(data).rstrip(b"=")

        head = part(json.dumps({"alg": "HS256", "typ": "JWT", "kid": self.keys[0].kid}).encode())
        body = part(json.dumps(self.claims(sub, **overrides)).encode())
        mac = hmac.new(public, head + b"." + body, hashlib.sha256).digest()
        return b".".join([head, body, part(mac)]).decode()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
