"""Which headers cross the proxy (SPEC §4.7), as pure functions of header lists.

A proxied request carries the caller's end-to-end headers, less the hop-by-hop
ones (RFC 9110 §7.6.1: they describe one connection, not the message) and less
fencepost's own (the caller's key, the queue controls): the upstream must never
see the caller's fencepost credentials, and the pool's managed headers must be
the only credentials it gets. The answer carries the upstream's end-to-end
headers, less its framing (the proxy frames the answer itself) and less any
header fencepost sets on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from urllib.parse import unquote, urlsplit

Pair = tuple[str, str]

# RFC 9110 §7.6.1, plus the headers RFC 9112 uses to frame a message and the
# old proxy-connection that some clients still send.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
    "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
})
# Set by the proxy on the upstream request from the URL and the body.
_FRAMING = frozenset({"host", "content-length", "expect"})
# A pool may not manage these: the proxy sets them itself, per request.
UNMANAGEABLE = HOP_BY_HOP | _FRAMING

# What a caller sends to fencepost, not to the upstream: its key, the queue
# and cost controls of SPEC §4.2 and §4.7, its request ID (fencepost's own),
# and forwarding headers (the upstream is a third party: it has no use for the
# caller's network addresses, and a caller could forge them).
OWN_REQUEST = frozenset({
    "authorization", "x-api-key", "x-lock-token", "x-queue-timeout-ms", "x-no-queue",
    "x-cost", "x-request-id", "forwarded", "x-forwarded-for", "x-forwarded-host",
    "x-forwarded-proto", "x-real-ip",
})
# Set by fencepost on the answer; the upstream's would be confused with them.
OWN_RESPONSE = frozenset({
    "x-queued-ms", "x-effective-limit", "x-remaining-slots", "x-upstream-request-id",
})
# The answer's framing, which the proxy writes itself.
_RESPONSE_FRAMING = frozenset({"content-length"})


def _named_by_connection(headers: Iterable[Pair]) -> set[str]:
    """Headers a Connection line declares hop-by-hop (RFC 9110 §7.6.1)."""
    named: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            named.update(part.strip().lower() for part in value.split(",") if part.strip())
    return named


def upstream_request_headers(caller: Sequence[Pair], managed: Sequence[Pair]) -> list[Pair]:
    """The headers of the request the proxy sends: the caller's end-to-end
    headers less fencepost's own, then the pool's managed headers, which
    replace any the caller sent under the same name (a caller cannot choose
    the credentials)."""
    managed_names = {name.lower() for name, _ in managed}
    dropped = (HOP_BY_HOP | _FRAMING | OWN_REQUEST | managed_names
               | _named_by_connection(caller))
    kept = [(name, value) for name, value in caller if name.lower() not in dropped]
    return kept + list(managed)


def caller_response_headers(upstream: Sequence[Pair]) -> list[Pair]:
    """The upstream's answer headers as the caller gets them. Its X-Request-Id
    is kept as X-Upstream-Request-Id: the answer's X-Request-Id is fencepost's
    (SPEC §2), and a provider's request ID is what its support asks for."""
    dropped = HOP_BY_HOP | _RESPONSE_FRAMING | OWN_RESPONSE | _named_by_connection(upstream)
    kept: list[Pair] = []
    for name, value in upstream:
        lower = name.lower()
        if lower == "x-request-id":
            kept.append(("x-upstream-request-id", value))
        elif lower not in dropped:
            kept.append((lower, value))
    return kept


def has_dot_segment(raw_path: str) -> bool:
    """Whether a path has a "." or ".." segment, plain or percent-encoded: an
    upstream (or a proxy before it) that resolves one would serve a path
    outside the pool's base URL."""
    return any(unquote(segment) in (".", "..") for segment in raw_path.split("/"))


def base_url_problem(url: str) -> str | None:
    """Why `url` cannot be a pool's base URL, or None. Credentials belong in
    the managed headers (write-only), never in the URL (which GET shows)."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is no number or out of range
    except ValueError:
        return "is not a URL"
    del port
    if parts.scheme not in ("http", "https"):
        return "must be an http or https URL"
    if not parts.hostname:
        return "must name a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (put them in upstream.headers)"
    if parts.query or url.endswith("?"):
        return "must not have a query"
    if parts.fragment or "#" in url:
        return "must not have a fragment"
    if any(ch.isspace() or ord(ch) < 0x21 or ord(ch) > 0x7e for ch in url):
        return "must be printable ASCII without spaces (percent-encode the rest)"
    if has_dot_segment(parts.path):
        return 'must not have "." or ".." segments'
    return None
