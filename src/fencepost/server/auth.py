"""Authentication, roles, IP allowlists and per-key quotas (SPEC §2, §5)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass

from fencepost.core.keys import Network, Role, ip_allowed, parse_networks
from fencepost.errors import FencepostError, Forbidden, QuotaExceeded, Unauthorized
from fencepost.events import ORIGIN, Events, Origin, Refused
from fencepost.server.jwt_auth import CALLER_PREFIX, JwtVerifier, TokenRefused, looks_like_jwt
from fencepost.server.messages import Request
from fencepost.store.base import KeyRecord, Store

_log = logging.getLogger(__name__)

# A key looked up in the store is trusted for this long, so a revocation on any
# replica is refused everywhere within 2 s (SPEC §5) without a store read per request.
KEY_CACHE_MS = 1000
MAX_KEY_LENGTH = 512
# A token caller's name is written to the store again after this long, so that
# callers long unseen can be forgotten (store/sql/keys.py IDENTITY_RETENTION_MS).
NOTE_AGAIN_MS = 3_600_000
_CACHE_HASH_KEY = os.urandom(32)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts as. `key_id` is an API key's id, or "jwt:" + sub for
    a caller from an identity provider (SPEC §5.1), which is then the holder
    and owner of what it takes; `app_key_id` is the API key an application
    sent beside the user's token (acting for its user), else None."""

    key_id: str
    project: str
    role: Role
    expires_ms: int | None = None
    # The first key of the caller's refresh chain (SPEC §5): bounds that a
    # key's successors share count by it. A first key is its own lineage.
    lineage: str = ""
    key_name: str | None = None
    app_key_id: str | None = None

    @property
    def from_token(self) -> bool:
        """A caller from an identity provider: it has no API key of its own."""
        return self.key_id.startswith(CALLER_PREFIX)


@dataclass(slots=True)
class _CachedKey:
    record: KeyRecord | None
    networks: list[Network]
    fetched_ms: float


def _monotonic_ms() -> float:
    return time.monotonic() * 1000


class Authenticator:
    def __init__(
        self, store: Store, events: Events | None = None, jwt: JwtVerifier | None = None
    ) -> None:
        self._store = store
        self._events = events
        self._cache: dict[bytes, _CachedKey] = {}
        self.jwt = jwt
        # Projects a token named, and when that was read (monotonic ms).
        self._projects: dict[str, tuple[bool, float]] = {}
        # Callers from tokens whose name this process wrote to the store, and when.
        self._noted: dict[tuple[str, str], tuple[str | None, str | None, float]] = {}

    def forget(self, key_id: str) -> None:
        """Drop a key and the successors minted from it from the cache at once
        (they were revoked here)."""
        gone = {key_id}
        while True:  # successors of successors, to a fixpoint
            dropped = [
                digest for digest, cached in self._cache.items()
                if cached.record is not None and (
                    cached.record.id in gone or cached.record.parent_id in gone
                    or cached.record.root_id == key_id
                )
            ]
            if not dropped:
                return
            for digest in dropped:
                record = self._cache.pop(digest).record
                assert record is not None
                gone.add(record.id)

    async def authenticate(self, request: Request, needs: Role) -> Principal:
        """The caller's key, or a refusal (reported as an event: 401, 403, or
        429 over the key's quota). What the store does next for this request is
        reported with the request's origin (see fencepost.events.ORIGIN)."""
        known: list[KeyRecord] = []
        try:
            principal = await self._authenticate(request, needs, known)
        except (Unauthorized, Forbidden, QuotaExceeded) as refusal:
            if self._events is not None:
                record = known[0] if known else None
                self._events.emit(Refused(
                    refusal.http_status, refusal.code, request.request_id,
                    None if record is None else record.project,
                    None if record is None else record.id,
                    request.client.host if request.client else None,
                    refusal.why if isinstance(refusal, TokenRefused) else None,
                ))
            raise
        ORIGIN.set(Origin(request.request_id, principal.project, principal.key_id,
                          principal.app_key_id))
        return principal

    async def _authenticate(
        self, request: Request, needs: Role, known: list[KeyRecord]
    ) -> Principal:
        secret, token = _presented(request, self.jwt)
        if token is None:
            assert secret is not None
            return await self._by_key(request, secret, needs, known)
        assert self.jwt is not None
        identity = await self.jwt.verify(token, needs_claims=secret is None)
        if secret is None:
            assert identity.project is not None and identity.role is not None
            if not await self._project_exists(identity.project):
                raise TokenRefused("unknown_project", f"The token's project "
                                   f"{identity.project!r} does not exist on this server.")
            principal = Principal(identity.caller_id, identity.project, identity.role,
                                  identity.expires_ms, identity.caller_id, identity.name)
        else:
            # An application acting for its user: the key says where and how
            # much (its project, allowlist, quota, and its role as a ceiling),
            # the token says who.
            app = await self._by_key(request, secret, Role.READER, known)
            if identity.project is not None and identity.project != app.project:
                raise Forbidden(f"The token is for project {identity.project!r}; the API key "
                                f"is for {app.project!r}.")
            role = app.role if identity.role is None else min(app.role, identity.role)
            expires = identity.expires_ms if app.expires_ms is None else min(
                app.expires_ms, identity.expires_ms)
            principal = Principal(identity.caller_id, app.project, role, expires,
                                  identity.caller_id, identity.name, app.key_id)
        if principal.role < needs:
            raise Forbidden(f"This route needs the {needs.label} role; the token gives "
                            f"{principal.role.label}.")
        await self._note(principal)
        return principal

    async def _project_exists(self, project: str) -> bool:
        now = _monotonic_ms()
        cached = self._projects.get(project)
        if cached is None or now - cached[1] > KEY_CACHE_MS:
            if len(self._projects) > 10_000:
                self._projects.clear()  # bound memory under tokens naming many projects
            cached = (await self._store.project_exists(project), now)
            self._projects[project] = cached
        return cached[0]

    async def _note(self, principal: Principal) -> None:
        """Write the caller's name to the store when this process has not yet,
        or it changed, or NOTE_AGAIN_MS passed (so the store can forget callers
        long unseen). A failure is logged, never the request's."""
        now = _monotonic_ms()
        place = (principal.project, principal.key_id)
        noted = self._noted.get(place)
        if noted is not None and noted[:2] == (principal.key_name, principal.app_key_id) and (
                now - noted[2] < NOTE_AGAIN_MS):
            return
        if len(self._noted) > 100_000:
            self._noted.clear()
        self._noted[place] = (principal.key_name, principal.app_key_id, now)
        try:
            await self._store.note_identity(principal.project, principal.key_id,
                                            principal.key_name, principal.app_key_id)
        except FencepostError as exc:
            self._noted.pop(place, None)
            _log.warning("could not record the name of %s: %s", principal.key_id, exc.message)

    async def _by_key(
        self, request: Request, secret: str, needs: Role, known: list[KeyRecord]
    ) -> Principal:
        record, networks = await self._lookup(secret)
        if record is not None:
            known.append(record)  # a refusal names the key (revoked ones too)
        now_ms = await self._store.now_ms()
        if record is None or record.ended:
            raise Unauthorized("The API key is unknown, revoked or retired.")
        if record.expires_ms is not None and now_ms >= record.expires_ms:
            raise Unauthorized("The API key has expired.")
        client_ip = request.client.host if request.client else None
        if not ip_allowed(client_ip, networks):
            raise Forbidden("This key may not be used from your address.")
        await self._count_request(record)
        if record.role < needs:
            raise Forbidden(
                f"This route needs the {needs.label} role; the key is a {record.role.label}."
            )
        return Principal(record.id, record.project, record.role, record.expires_ms,
                         record.root_id or record.id, record.name)

    async def _lookup(self, secret: str) -> tuple[KeyRecord | None, list[Network]]:
        # Cache by a keyed hash so raw secrets are not kept as dictionary keys.
        digest = hashlib.blake2b(secret.encode(), key=_CACHE_HASH_KEY, digest_size=16).digest()
        now = _monotonic_ms()
        cached = self._cache.get(digest)
        if cached is None or now - cached.fetched_ms > KEY_CACHE_MS:
            record = await self._store.find_key(secret)
            networks = parse_networks(record.allow_ips) if record else []
            if len(self._cache) > 100_000:
                self._cache.clear()  # bound memory under a flood of random keys
            cached = _CachedKey(record, networks, now)
            self._cache[digest] = cached
        return cached.record, cached.networks

    async def _count_request(self, record: KeyRecord) -> None:
        """Every authenticated request counts, a retry under a reused request ID
        too. Counted in the store, so a quota holds across replicas; keys
        without a quota cost nothing here."""
        if record.rpm_quota is None:
            return
        # One budget per refresh chain: a key must not multiply its quota by
        # minting successors (SPEC §5), each of which would start afresh.
        budget = record.root_id or record.id
        wait_ms = await self._store.admit_request(budget, record.rpm_quota)
        if wait_ms is not None:
            raise QuotaExceeded(retry_after_ms=wait_ms)


def _presented(request: Request, jwt: JwtVerifier | None) -> tuple[str | None, str | None]:
    """The API key secret and the JWT the request carries (at least one).

    A bearer that is a JWT is the token; any other is a key. `X-Api-Key` is
    always a key: with a token beside it, an application acting for its user.
    With `--jwt-header`, that header carries a bare token too."""
    bearer = None
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, bearer = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not bearer.strip():
            raise Unauthorized("The Authorization header must be `Bearer <key>`.")
        bearer = bearer.strip()
    token = None
    if jwt is not None and jwt.settings.header is not None:
        token = (request.headers.get(jwt.settings.header.lower()) or "").strip() or None
    if bearer is not None and looks_like_jwt(bearer):
        if jwt is None:
            raise Unauthorized("This server does not accept JWTs (it was started without "
                               "--jwt-issuer); use an API key.")
        if token is not None and token != bearer:
            raise Unauthorized(f"The request carries two different tokens (Authorization "
                               f"and {jwt.settings.header}).")
        token, bearer = bearer, None
    secret = bearer
    api_key = (request.headers.get("x-api-key") or "").strip()
    if api_key and secret is None:
        secret = api_key
    if secret is not None and (len(secret) > MAX_KEY_LENGTH or not secret.isprintable()):
        raise Unauthorized("The API key is malformed.")
    if secret is None and token is None:
        raise Unauthorized("An API key is required (Authorization: Bearer or X-Api-Key).")
    return secret, token
