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
