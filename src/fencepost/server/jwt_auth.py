"""Tokens from an identity provider (SPEC §5.1): a JWT's signature, times,
issuer and audience checked with PyJWT against the provider's keys
(server/jwks.py), then the claims that say who the caller is and what it may do.

Every refusal is a 401 whose message names the reason and whose `reason` field
names it for programs (`token_expired`, `wrong_audience`, `unknown_key_id`...);
neither ever repeats the token or a key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jwt
from jwt import exceptions as jwt_errors

from fencepost.core.keys import Role
from fencepost.errors import Unauthorized
from fencepost.server.jwks import ALGORITHMS, KeySet

# The leeway on `exp` and `nbf` (SPEC §5.1): clocks of the provider and of this
# server may differ by this much.
LEEWAY_S = 30
# Larger tokens are refused before any parsing (a provider's are 1-4 KB).
MAX_TOKEN_BYTES = 8192
# The longest `sub`, and the longest name shown for it (characters).
MAX_SUBJECT = 200
MAX_NAME = 200
# The prefix that tells a token's caller id from an API key's (`key_...`).
CALLER_PREFIX = "jwt:"
DEFAULT_PROJECT_CLAIM = "fencepost_project"
DEFAULT_ROLE_CLAIM = "fencepost_role"


@dataclass(frozen=True, slots=True)
class JwtSettings:
    issuer: str
    audience: str
    jwks: str  # a file path or an http(s) URL
    header: str | None = None  # a header carrying the bare token (Cf-Access-Jwt-Assertion)
    project_claim: str = DEFAULT_PROJECT_CLAIM
    role_claim: str = DEFAULT_ROLE_CLAIM


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a valid token says the caller is. `project` and `role` are None
    when the token does not carry them (allowed only when an API key in the
    same request gives them)."""

    caller_id: str  # "jwt:" + sub
    name: str | None
    project: str | None
    role: Role | None
    expires_ms: int


class TokenRefused(Unauthorized):
    """A JWT that is not accepted; `reason` is one word for programs and metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, reason=reason)
        self.why = reason


def looks_like_jwt(value: str) -> bool:
    """A compact JWS (three base64url parts); API keys never hold a dot."""
    return value.count(".") == 2 and value.startswith("eyJ")


def _claim(claims: dict[str, Any], path: str) -> Any:
    """A claim by name, or by a dotted path into nested objects
    (`realm_access.roles`)."""
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _role_of(value: Any) -> Role | None:
    """A role claim: one role name, or a list of names of which the highest
    known one counts (providers often give roles as a list)."""
    names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    roles = []
    for name in names:
        if isinstance(name, str) and name.lower() in ("admin", "member", "reader"):
            roles.append(Role.parse(name.lower()))
    return max(roles) if roles else None


def _printable(value: Any, limit: int) -> str | None:
    if not isinstance(value, str) or not value or not value.isprintable():
        return None
    return value[:limit]


class JwtVerifier:
    def __init__(self, settings: JwtSettings, keys: KeySet | None = None) -> None:
        self.settings = settings
        self.keys = keys or KeySet(settings.jwks)

    async def verify(self, token: str, *, needs_claims: bool = True) -> Identity:
        """The caller a token names, or TokenRefused. `needs_claims`: the token
        alone must give the project and role (no API key beside it)."""
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenRefused("token_too_large",
                               f"The token is larger than {MAX_TOKEN_BYTES} bytes.")
        try:
            header = jwt.get_unverified_header(token)
        except jwt_errors.PyJWTError:
            raise TokenRefused("malformed_token", "The token is not a well-formed JWT.") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            shown = alg if isinstance(alg, str) and alg.isprintable() and len(alg) < 20 else "?"
            raise TokenRefused(
                "algorithm_not_allowed",
                f"The token's algorithm {shown} is not allowed (only {', '.join(ALGORITHMS)}).",
            )
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise TokenRefused("malformed_token", "The token's key id (kid) is not a string.")
        candidates = await self.keys.keys_for(kid, alg)
        if not candidates:
            unreachable = (" (the identity provider's keys could not be read)"
                           if self.keys.unreachable else "")
            raise TokenRefused(
                "unknown_key_id",
                "The token is signed with a key id the identity provider does not publish"
                + unreachable + "." if kid is not None else
                "The token names no key id and no published key fits its algorithm"
                + unreachable + ".",
            )
        claims = self._decode(token, alg, candidates)
        return self._identity(claims, needs_claims)

    def _decode(self, token: str, alg: str, candidates: list[Any]) -> dict[str, Any]:
        settings = self.settings
        refusal: TokenRefused | None = None
        for candidate in candidates[:8]:
            try:
                claims: dict[str, Any] = jwt.decode(
                    token, candidate.key, algorithms=[alg], audience=settings.audience,
                    issuer=settings.issuer, leeway=LEEWAY_S,
                    options={"require": ["exp", "iss", "aud", "sub"]},
                )
                return claims
            except jwt_errors.InvalidSignatureError:
                refusal = TokenRefused("bad_signature", "The token's signature is not valid.")
            except jwt_errors.ExpiredSignatureError:
                raise TokenRefused("token_expired", "The token has expired.") from None
            except jwt_errors.ImmatureSignatureError:
                raise TokenRefused(
                    "token_not_yet_valid", "The token is not valid yet (nbf or iat in the future)."
                ) from None
            except jwt_errors.InvalidIssuerError:
                raise TokenRefused("wrong_issuer",
                                   "The token was issued by another issuer.") from None
            except jwt_errors.InvalidAudienceError:
                raise TokenRefused("wrong_audience",
                                   "The token is meant for another audience.") from None
            except jwt_errors.MissingRequiredClaimError as missing:
                raise TokenRefused("claims_missing",
                                   f"The token lacks the {missing.claim} claim.") from None
            except jwt_errors.PyJWTError:
                raise TokenRefused("malformed_token",
                                   "The token is not a well-formed JWT.") from None
        assert refusal is not None
        raise refusal

    def _identity(self, claims: dict[str, Any], needs_claims: bool) -> Identity:
        settings = self.settings
        subject = _printable(claims.get("sub"), MAX_SUBJECT + 1)
        if subject is None or len(subject) > MAX_SUBJECT:
            raise TokenRefused("claims_invalid", "The token's sub claim is not a usable id "
                               f"(printable, 1-{MAX_SUBJECT} characters).")
        expires = claims.get("exp")
        if not isinstance(expires, (int, float)):
            raise TokenRefused("claims_invalid", "The token's exp claim is not a number.")
        project_value = _claim(claims, settings.project_claim)
        role_value = _claim(claims, settings.role_claim)
        project = _printable(project_value, 200) if project_value is not None else None
        role = _role_of(role_value) if role_value is not None else None
        if project_value is not None and project is None:
            raise TokenRefused("claims_invalid",
                               f"The token's {settings.project_claim} claim is not a name.")
        if role_value is not None and role is None:
            raise TokenRefused("claims_invalid", f"The token's {settings.role_claim} claim "
                               "names no role (admin, member or reader).")
        if needs_claims:
            for claim, value in ((settings.project_claim, project), (settings.role_claim, role)):
                if value is None:
                    raise TokenRefused("claims_missing", f"The token lacks the {claim} claim.")
        shown = (_printable(claims.get("name"), MAX_NAME)
                 or _printable(claims.get("email"), MAX_NAME))
        return Identity(CALLER_PREFIX + subject, shown, project, role, int(expires * 1000))
