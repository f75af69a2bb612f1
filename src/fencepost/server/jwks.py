"""The identity provider's signing keys (SPEC §5.1 `--jwt-jwks`): a JWKS file or
URL, parsed by PyJWT, cached, and fetched again

- when a token names a key id the set lacks, at most once per REFETCH_S (a
  signing key rotated at the provider is picked up at once; a flood of tokens
  with made-up key ids costs one fetch per REFETCH_S, not one per token), and
- when the set is older than MAX_AGE_S (a key the provider withdrew stops
  being trusted within that time), in the background: the old set keeps
  serving until the new one is in.

A fetch that fails keeps the set held before; the failure is logged once per
spell, never a token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
from dataclasses import dataclass
from typing import Any, Callable

import certifi
from jwt import PyJWK, PyJWKSet
from jwt.exceptions import PyJWKError, PyJWKSetError

_log = logging.getLogger(__name__)

REFETCH_S = 30.0
MAX_AGE_S = 600.0
FETCH_TIMEOUT_S = 5.0
MAX_JWKS_BYTES = 1 << 20
# An RSA key shorter than this is not trusted, whatever the provider publishes.
MIN_RSA_BITS = 2048

# The signature algorithms a token may use, and the key each needs (SPEC §5.1:
# never `none`, never an HMAC, whose "secret" could be a public key).
ALGORITHMS = ("RS256", "ES256", "EdDSA")
_KEY_TYPE = {"RS256": ("RSA", None), "ES256": ("EC", "P-256"), "EdDSA": ("OKP", None)}


@dataclass(frozen=True, slots=True)
class SigningKey:
    kid: str | None
    alg: str | None  # the JWK's own `alg`, when it names one
    kty: str
    crv: str | None
    key: PyJWK

    def signs(self, alg: str) -> bool:
        """Whether a token signed with `alg` may be checked with this key."""
        kty, crv = _KEY_TYPE[alg]
        return (self.kty == kty and (crv is None or self.crv == crv)
                and (self.alg is None or self.alg == alg))


def parse_jwks(text: str | bytes) -> list[SigningKey]:
    """The usable signing keys of a JWKS document; raises ValueError when the
    document is not one or holds no usable key. Keys for encryption, of other
    types, or too weak are left out (a provider may publish them)."""
    try:
        document = json.loads(text)
    except ValueError:
        raise ValueError("the key set is not JSON") from None
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError('the key set is not a JWKS document (an object with "keys")')
    keys = []
    for entry in document["keys"]:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        kty, alg = entry.get("kty"), entry.get("alg")
        if kty not in ("RSA", "EC", "OKP") or (alg is not None and alg not in ALGORITHMS):
            continue
        try:
            (parsed,) = PyJWKSet.from_dict({"keys": [entry]}).keys
        except (PyJWKError, PyJWKSetError, ValueError, TypeError):
            continue
        if kty == "RSA" and parsed.key.key_size < MIN_RSA_BITS:
            continue
        if kty == "OKP" and entry.get("crv") != "Ed25519" and entry.get("crv") != "Ed448":
            continue
        kid = entry.get("kid")
        keys.append(SigningKey(kid if isinstance(kid, str) else None, alg, kty,
                               entry.get("crv"), parsed))
    if not keys:
        raise ValueError("the key set holds no usable signing key (RS256, ES256 or EdDSA)")
    return keys


def is_url(source: str) -> bool:
    return source.startswith(("https://", "http://"))


class KeySet:
    """The keys tokens are checked with, from `source` (a path or a URL)."""

    def __init__(self, source: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self._clock = clock
        self._keys: list[SigningKey] = []
        self._fetched_at: float | None = None  # when the held set was read
        self._tried_at: float | None = None  # when a fetch was last started
        self._lock = asyncio.Lock()
        self._refresh: asyncio.Task[None] | None = None
        self._failing = ""
        self._file_stamp: tuple[int, int] | None = None
        if not is_url(source):
            self._read_file()  # a bad file fails the start, not the first token

    def _read_file(self) -> None:
        stat = os.stat(self.source)
        with open(self.source, "rb") as file:
            text = file.read(MAX_JWKS_BYTES + 1)
        if len(text) > MAX_JWKS_BYTES:
            raise ValueError(f"the key set is larger than {MAX_JWKS_BYTES} bytes")
        self._keys = parse_jwks(text)
        self._file_stamp = (stat.st_mtime_ns, stat.st_size)
        self._fetched_at = self._clock()

    async def _fetch_url(self) -> None:
        import aiohttp

        context = ssl.create_default_context(cafile=certifi.where())
        context.load_default_certs()
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
            async with session.get(self.source, ssl=context, allow_redirects=False,
                                   headers={"Accept": "application/json"}) as response:
                if response.status != 200:
                    raise ValueError(f"{self.source} answered {response.status}")
                text = await response.content.read(MAX_JWKS_BYTES + 1)
        if len(text) > MAX_JWKS_BYTES:
            raise ValueError(f"the key set is larger than {MAX_JWKS_BYTES} bytes")
        self._keys = parse_jwks(text)
        self._fetched_at = self._clock()

    async def _reload(self) -> None:
        """Read the set again; on failure keep the one held (logged once)."""
        self._tried_at = self._clock()
        try:
            if is_url(self.source):
                await self._fetch_url()
            else:
                stat = os.stat(self.source)
                if (stat.st_mtime_ns, stat.st_size) != self._file_stamp:
                    self._read_file()
                else:
                    self._fetched_at = self._clock()
        except Exception as exc:  # noqa: BLE001 - any failure keeps the held set
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if message != self._failing:
                _log.error("JWT signing keys: could not read %s (%s); keeping the %d keys "
                           "held", self.source, message, len(self._keys))
            self._failing = message
            return
        if self._failing:
            _log.info("JWT signing keys: read %s again (%d keys)", self.source, len(self._keys))
        self._failing = ""

    async def warm(self) -> None:
        """The first fetch of a URL, at start (a failure is logged; tokens then
        wait for the next permitted fetch)."""
        if is_url(self.source) and self._fetched_at is None:
            async with self._lock:
                await self._reload()

    @property
    def unreachable(self) -> str:
        """Why the last read failed ("" when it did not)."""
        return self._failing

    def _stale(self) -> bool:
        return self._fetched_at is None or self._clock() - self._fetched_at > MAX_AGE_S

    def _may_refetch(self) -> bool:
        return self._tried_at is None or self._clock() - self._tried_at >= REFETCH_S

    def _matching(self, kid: str | None, alg: str) -> list[SigningKey]:
        return [key for key in self._keys
                if (kid is None or key.kid == kid) and key.signs(alg)]

    async def keys_for(self, kid: str | None, alg: str) -> list[SigningKey]:
        """The keys a token with this header may have been signed with (empty:
        an unknown key id, after one permitted fetch)."""
        if self._stale() and self._fetched_at is not None and self._refresh is None:
            self._refresh = asyncio.create_task(self._refresh_in_background())
        found = self._matching(kid, alg)
        if found or not self._may_refetch():
            return found
        async with self._lock:
            found = self._matching(kid, alg)  # another request may have fetched
            if not found and self._may_refetch():
                await self._reload()
                found = self._matching(kid, alg)
        return found

    async def _refresh_in_background(self) -> None:
        try:
            async with self._lock:
                if self._stale() and self._may_refetch():
                    await self._reload()
        finally:
            self._refresh = None

    def held(self) -> list[dict[str, Any]]:
        """What is held, for logs and tests: kid, kty and alg of each key."""
        return [{"kid": k.kid, "kty": k.kty, "alg": k.alg} for k in self._keys]
