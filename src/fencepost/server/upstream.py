"""The HTTP client proxy mode calls upstreams with (SPEC §4.7): one httpx
client per server process, so that connections to an upstream are reused
across calls (a new TLS handshake per call would cost more than the proxy
itself), with certificate checks always on.

Redirects are never followed (the caller gets them), the environment's proxy
settings are not read (an operator's HTTPS_PROXY meant for something else must
not see the managed credentials), and no timeout is set here: each call's
timeout is its pool's `timeout_ms`, bounded by its slot (routes/proxy.py).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import certifi

from fencepost.core.upstream_allow import UpstreamAllow

if TYPE_CHECKING:
    import httpx

# Connections kept open to upstreams between calls, all upstreams together.
MAX_KEEPALIVE = 100
KEEPALIVE_S = 30.0


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """Public roots (certifi's, as httpx uses by default), plus the operator's
    own certificate authority for upstreams inside their network."""
    context = ssl.create_default_context(cafile=certifi.where())
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


class Upstreams:
    """The shared client, made on first use (a server with no proxied pool
    makes none), and the server's `--upstream-allow`."""

    def __init__(self, ca_file: str | None = None, allow: UpstreamAllow | None = None) -> None:
        # Read now, so that a bad --upstream-ca-file fails the start, not a call.
        self._context = tls_context(ca_file)
        self._client: httpx.AsyncClient | None = None
        self.allow = allow or UpstreamAllow(())

    async def refusal(self, base_url: str) -> str | None:
        """Why the server may not call `base_url` (SPEC §4.7's --upstream-allow),
        or None. A host name the list names is allowed as is; any other is
        judged by every address it resolves to now."""
        host = urlsplit(base_url).hostname or ""
        if not self.allow.needs_addresses(host):
            return None
        return self.allow.problem(host, await _addresses(host))

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            # Imported on first use: a server that proxies nothing starts
            # without loading an HTTP client.
            import httpx

            self._client = httpx.AsyncClient(
                verify=self._context,
                follow_redirects=False,
                trust_env=False,
                timeout=None,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=MAX_KEEPALIVE,
                                    keepalive_expiry=KEEPALIVE_S),
                headers={},
            )
            # httpx adds its own User-Agent, Accept and Accept-Encoding to every
            # request; a proxy sends the caller's headers, not its own.
            self._client.headers.clear()
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


async def _addresses(host: str) -> list[str]:
    """The addresses `host` resolves to (itself for an address); none when it
    does not resolve."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host.strip("[]"), None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return sorted({str(info[4][0]) for info in found})
