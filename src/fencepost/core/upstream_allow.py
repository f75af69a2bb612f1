"""Which hosts a pool's upstream may be (SPEC §4.7, `--upstream-allow`).

Without a list, a pool admin can point proxy mode at anything the server can
reach: a cloud metadata address, the database, an admin port on localhost.
With one, an upstream must be a listed host name (exactly, or under a
`*.example.com` entry) or resolve only to addresses inside a listed network
(`10.0.0.0/8`, `203.0.113.7`). A name is judged by its addresses when it
matches no name entry, so `localhost` is refused unless its addresses are
allowed; the check runs when the pool is set and again before each call (a
name that moves to a refused address stops being called).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class UpstreamAllow:
    """The parsed list; `None` entries mean no list (everything allowed)."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.names: set[str] = set()
        self.suffixes: set[str] = set()  # "*.example.com" -> ".example.com"
        self.networks: list[Network] = []
        for raw in entries:
            entry = raw.strip().lower().rstrip(".")
            if not entry:
                continue
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            if entry.startswith("*."):
                rest = entry[2:]
                _check_name(rest, raw)
                self.suffixes.add("." + rest)
            else:
                _check_name(entry, raw)
                self.names.add(entry)
        self.empty = not (self.names or self.suffixes or self.networks)

    @classmethod
    def parse(cls, text: str | None) -> UpstreamAllow:
        """From the option's comma-separated form; ValueError names a bad entry."""
        return cls((text or "").split(","))

    def by_name(self, host: str) -> bool:
        """Whether `host` is allowed by a name entry (no addresses needed)."""
        host = host.lower().rstrip(".")
        return host in self.names or any(host.endswith(s) for s in self.suffixes)

    def address_allowed(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    def problem(self, host: str, addresses: Sequence[str]) -> str | None:
        """Why `host` (with the addresses it resolves to) is not allowed, or None."""
        if self.empty or self.by_name(host):
            return None
        if not addresses:
            return f"{host} is not in the server's --upstream-allow"
        refused = [a for a in addresses if not self.address_allowed(a)]
        if refused:
            return (f"{host} ({refused[0]}) is not in the server's --upstream-allow")
        return None

    def needs_addresses(self, host: str) -> bool:
        """Whether judging `host` needs its addresses (a resolution)."""
        return not self.empty and not self.by_name(host)


def _check_name(name: str, raw: str) -> None:
    labels = name.split(".")
    if not name or any(not label or len(label) > 63 for label in labels) or not all(
            label.replace("-", "").isalnum() and label.isascii() for label in labels):
        raise ValueError(f"{raw.strip()!r} is not a host name, *.domain, address or network")
