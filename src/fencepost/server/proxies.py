"""Which address a request came from, when load balancers stand in front.

X-Forwarded-For is believed only from the configured proxies: otherwise any
client could claim an allowlisted address by sending the header itself.
"""

from __future__ import annotations

from functools import lru_cache

from fencepost.core.keys import Network, ip_allowed, parse_networks


class TrustedProxies:
    def __init__(self, entries: list[str]) -> None:
        """`entries`: addresses or networks (`10.0.0.0/8`), or `*` for any."""
        self._any = "*" in entries
        self._networks: list[Network] = parse_networks([e for e in entries if e != "*"])
        self._trusts = lru_cache(maxsize=1024)(self._check)

    def __bool__(self) -> bool:
        return self._any or bool(self._networks)

    def _check(self, host: str) -> bool:
        if self._any:
            return True
        # ip_allowed lets anyone through an empty allowlist; no proxies trusts none.
        return bool(self._networks) and ip_allowed(host, self._networks)

    def trusts(self, host: str) -> bool:
        """Whether `host` is one of the trusted proxies."""
        return self._trusts(host)

    def client(self, peer: str, forwarded_for: str | None) -> str:
        """The caller's address: the peer, or, when the peer is a trusted proxy,
        the right-most address in X-Forwarded-For that is not a trusted proxy
        (the ones to its left were written by the client and may be forged)."""
        if not forwarded_for or not self._trusts(peer):
            return peer
        hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
        for hop in reversed(hops):
            if not self._trusts(hop):
                return hop
        return hops[0] if hops else peer
