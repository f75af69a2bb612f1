"""The HTTP client proxy mode calls upstreams with (SPEC §4.7): one aiohttp
session per server process, so that connections to an upstream are reused
across calls (a new TLS handshake per call would cost more than the proxy
itself), with certificate checks always on. aiohttp rather than httpx (which
the Python client uses): on this path it costs about an eighth of the CPU per
call (bench/proxy_overhead.py), and a proxy spends it on every call.

Redirects are never followed (the caller gets them), the environment's proxy
settings are not read (an operator's HTTPS_PROXY meant for something else must
not see the managed credentials), answers are passed on as sent (no
decompression), and no timeout is set here: each call's timeout is its pool's
`timeout_ms`, bounded by its slot (routes/proxy.py).
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
    import aiohttp

# How long a connection to an upstream is kept open between calls.
KEEPALIVE_S = 30.0
# How long an upstream's name resolves to the same addresses: the
# --upstream-allow check before each call resolves it again anyway.
DNS_CACHE_S = 10
# The longest status or header line an upstream may answer with (bytes).
MAX_HEADER_LINE = 16_384


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """Public roots (certifi's), plus the operator's
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
        self._session: aiohttp.ClientSession | None = None
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
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Imported on first use: a server that proxies nothing starts
            # without loading an HTTP client.
            import aiohttp

            connector = aiohttp.TCPConnector(
                ssl=self._context, limit=0, limit_per_host=0,
                keepalive_timeout=KEEPALIVE_S, ttl_dns_cache=DNS_CACHE_S,
            )
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False,
                timeout=aiohttp.ClientTimeout(total=None), cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent",), max_field_size=MAX_HEADER_LINE,
                max_line_size=MAX_HEADER_LINE,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _addresses(host: str) -> list[str]:
    """The addresses `host` resolves to (itself for an address); none when it
    does not resolve."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host.strip("[]"), None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return sorted({str(info[4][0]) for info in found})
