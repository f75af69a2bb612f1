"""API key rules: roles, secret generation and hashing, allowlists."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from enum import IntEnum

SECRET_PREFIX = "fp_"
MIN_BOOTSTRAP_SECRET_LENGTH = 32


class Role(IntEnum):
    # Ordered: each role may do everything the lower ones may.
    READER = 1
    MEMBER = 2
    ADMIN = 3

    @classmethod
    def parse(cls, name: str) -> Role:
        return cls[name.upper()]

    @property
    def label(self) -> str:
        return self.name.lower()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    return "key_" + secrets.token_hex(8)


def hash_secret(secret: str, pepper: bytes) -> str:
    """Keyed hash of a key secret. Secrets are long and random, so a fast HMAC
    suffices (no password hashing); the pepper keeps a leaked table of hashes
    useless without the store's meta row."""
    return hmac.new(pepper, secret.encode(), hashlib.sha256).hexdigest()


def same_hash(a: str, b: str) -> bool:
    return hmac.compare_digest(a, b)


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(entries: list[str]) -> list[Network]:
    """CIDRs or bare addresses; raises ValueError naming the bad entry."""
    networks: list[Network] = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP address or CIDR") from None
    return networks


def ip_allowed(client_ip: str | None, networks: list[Network]) -> bool:
    if not networks:
        return True
    if client_ip is None:
        return False
    try:
        address = ipaddress.ip_address(client_ip)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in net for net in networks)


def granted_lifetime_ms(
    recorded_ms: int | None, created_ms: int, expires_ms: int | None
) -> int | None:
    """The lifetime an admin granted a key's chain (None: no expiry). Keys
    created before grants were recorded count their own lifetime."""
    if recorded_ms is not None:
        return recorded_ms
    return None if expires_ms is None else expires_ms - created_ms


def successor_lifetime_ms(
    requested_ms: int | None, own_lifetime_ms: int | None, granted_ms: int | None
) -> int | None:
    """How long a refreshed key lives (None: no expiry): what was asked, else
    the caller's own lifetime. Raises ValueError when that is longer than an
    admin granted the chain's original key, so a key can never extend itself."""
    lifetime = requested_ms if requested_ms is not None else own_lifetime_ms
    if granted_ms is None:
        return lifetime
    if lifetime is None:
        return granted_ms
    if lifetime > granted_ms:
        raise ValueError(
            f"must be at most {granted_ms // 1000} seconds, the lifetime an admin "
            "granted the original key"
        )
    return lifetime
