"""Authentication, roles, IP allowlists and per-key quotas (SPEC §2, §5)."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

from fencepost.core.keys import Network, Role, ip_allowed, parse_networks
from fencepost.errors import Forbidden, QuotaExceeded, Unauthorized
from fencepost.events import ORIGIN, Events, Origin, Refused
from fencepost.server.messages import Request
from fencepost.store.base import KeyRecord, Store

# A key looked up in the store is trusted for this long, so a revocation on any
# replica is refused everywhere within 2 s (SPEC §5) without a store read per request.
KEY_CACHE_MS = 1000
MAX_KEY_LENGTH = 512
_CACHE_HASH_KEY = os.urandom(32)


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: str
    project: str
    role: Role
    expires_ms: int | None = None
    # The first key of the caller's refresh chain (SPEC §5): bounds that a
    # key's successors share count by it. A first key is its own lineage.
    lineage: str = ""


@dataclass(slots=True)
class _CachedKey:
    record: KeyRecord | None
    networks: list[Network]
    fetched_ms: float


def _monotonic_ms() -> float:
    return time.monotonic() * 1000


class Authenticator:
    def __init__(self, store: Store, events: Events | None = None) -> None:
        self._store = store
        self._events = events
        self._cache: dict[bytes, _CachedKey] = {}

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
                ))
            raise
        ORIGIN.set(Origin(request.request_id, principal.project, principal.key_id))
        return principal

    async def _authenticate(
        self, request: Request, needs: Role, known: list[KeyRecord]
    ) -> Principal:
        secret = _presented_secret(request)
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
                         record.root_id or record.id)

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


def _presented_secret(request: Request) -> str:
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, secret = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise Unauthorized("The Authorization header must be `Bearer <key>`.")
        secret = secret.strip()
    else:
        secret = (request.headers.get("x-api-key") or "").strip()
        if not secret:
            raise Unauthorized("An API key is required (Authorization: Bearer or X-Api-Key).")
    if len(secret) > MAX_KEY_LENGTH or not secret.isprintable():
        raise Unauthorized("The API key is malformed.")
    return secret
