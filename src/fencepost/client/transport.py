"""The edge shared by both clients: configuration, timeouts, and turning
transport failures into the fencepost error tree. The sync `Client` and an
`AsyncClient` given an httpx transport talk through httpx; an `AsyncClient`
otherwise through its own connections (`wire.py`), for CPU."""

from __future__ import annotations

import os
import ssl
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import msgspec

from fencepost import __version__
from fencepost.client.bearer_token import BearerToken
from fencepost.client.calls import Call, Reply
from fencepost.client.retrying import Retries
from fencepost.client.wire import Pool
from fencepost.errors import TransportError

DEFAULT_URL = "http://127.0.0.1:7440"
DEFAULT_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0
USER_AGENT = f"fencepost-python/{__version__}"

# Requests sent at once by one client; more wait their turn in the client.
# Enough to keep a local server busy (one exchange takes well under a
# millisecond of its time), few enough that httpx's pool stays cheap: it scans
# its connections for every request it starts and ends.
MAX_IN_FLIGHT = 8
# Connections kept open: the turns plus room for waiting acquires, which hold a
# connection for their whole wait. All are kept alive between requests, since a
# new connection per request costs more than the request.
MAX_CONNECTIONS = 100

OnRenewed = Callable[[float], None]
"""Told the `time.monotonic()` instant each lease renewal that got through was sent."""

# Failures before any byte of the request could have reached the server.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


@dataclass(frozen=True, slots=True)
class Settings:
    """Where the server is and how to talk to it. Arguments win over the
    environment (`FENCEPOST_URL`, `FENCEPOST_API_KEY`, `FENCEPOST_CA_BUNDLE`);
    the URL defaults to `http://127.0.0.1:7440`. `ca_bundle`: a PEM file of the
    certificate authorities to trust for an https:// server (default: the
    system's)."""

    url: str = DEFAULT_URL
    api_key: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    retries: Retries = field(default_factory=Retries)
    ca_bundle: str | None = None
    # A JWT from an identity provider, read from a file or printed by a command
    # (`FENCEPOST_TOKEN_FILE`, `FENCEPOST_TOKEN_COMMAND`; SPEC §5.1): sent as
    # the bearer, with `api_key` (if any) in X-Api-Key: an app acting for its user.
    token_file: str | None = None
    token_command: str | None = None

    @classmethod
    def resolve(
        cls,
        url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        retries: Retries | None = None,
        env: Mapping[str, str] | None = None,
        ca_bundle: str | None = None,
        token_file: str | None = None,
        token_command: str | None = None,
    ) -> Settings:
        env = os.environ if env is None else env
        if not (token_file or token_command):
            token_file = env.get("FENCEPOST_TOKEN_FILE") or None
            token_command = env.get("FENCEPOST_TOKEN_COMMAND") or None
        if token_file and token_command:
            raise ValueError("Give a token file or a token command, not both.")
        chosen_url = (url or env.get("FENCEPOST_URL") or DEFAULT_URL).strip().rstrip("/")
        check_url(chosen_url)
        return cls(
            url=chosen_url,
            # api_key="" says "no key" (a token alone), where None reads the environment.
            api_key=(api_key if api_key is not None else env.get("FENCEPOST_API_KEY")) or None,
            timeout=DEFAULT_TIMEOUT_S if timeout is None else float(timeout),
            retries=retries or Retries(),
            ca_bundle=ca_bundle or env.get("FENCEPOST_CA_BUNDLE") or None,
            token_file=token_file or None, token_command=token_command or None,
        )

    def bearer_token(self) -> BearerToken | None:
        if not (self.token_file or self.token_command):
            return None
        return BearerToken(self.token_file, self.token_command)

    def default_headers(self) -> dict[str, str]:
        """The headers every request carries (a call's own headers win)."""
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for `httpx.Client` / `httpx.AsyncClient`."""
        options: dict[str, Any] = {
            "base_url": self.url, "headers": self.default_headers(), "timeout": self.timeout,
            "follow_redirects": False,
            "limits": httpx.Limits(max_connections=MAX_CONNECTIONS,
                                   max_keepalive_connections=MAX_CONNECTIONS),
        }
        if self.ca_bundle:
            options["verify"] = trust_context(self.ca_bundle)
        return options

    def timeout_for(self, call: Call[Any], now: float) -> httpx.Timeout:
        read = call.read_timeout(self.timeout, now)
        return httpx.Timeout(read, connect=min(CONNECT_TIMEOUT_S, read))


def trust_context(ca_bundle: str) -> ssl.SSLContext:
    """A TLS context that trusts the certificate authorities in `ca_bundle`."""
    try:
        return ssl.create_default_context(cafile=ca_bundle)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot read the CA bundle {ca_bundle!r}: {exc}") from None


def check_url(url: str) -> None:
    """Refuse a server URL that is not http(s)://host[:port][/path]."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise ValueError(f"{url!r} is not a valid server URL: {exc}") from None
    if parsed.scheme not in {"http", "https"} or not parsed.host:
        raise ValueError(f"{url!r} is not a valid server URL (want http://host:port).")


def transport_error(exc: httpx.HTTPError, url: str) -> TransportError:
    """An httpx failure as a fencepost `TransportError`."""
    maybe_sent = not isinstance(exc, _NOT_SENT)
    kind = type(exc).__name__
    detail = str(exc) or kind
    if isinstance(exc, httpx.TimeoutException):
        message = f"No answer from {url} in time ({kind})."
    else:
        message = f"Cannot reach {url}: {detail}."
    return TransportError(message, maybe_sent=maybe_sent)


def waited_too_long(url: str) -> TransportError:
    """The error of a request that never got its turn to be sent in time."""
    return TransportError(f"No answer from {url} in time (too many requests waiting to be "
                          "sent).", maybe_sent=False)


def reply_of(response: httpx.Response) -> Reply:
    return Reply(response.status_code, response.headers, response.content)


class AsyncEdge(Protocol):
    """How an `AsyncClient` sends one request and gets its `Reply`; failures to
    exchange it are raised as `TransportError`."""

    async def send(self, call: Call[Any], headers: dict[str, str], now: float) -> Reply: ...

    async def aclose(self) -> None: ...


class HttpxEdge:
    """Through httpx, with the transport the caller gave (custom proxies, tests),
    or httpx's own (which honours the environment's proxies)."""

    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None) -> None:
        self._settings = settings
        self._http = httpx.AsyncClient(transport=transport, **settings.client_options())

    async def send(self, call: Call[Any], headers: dict[str, str], now: float) -> Reply:
        try:
            response = await self._http.request(
                call.method, call.path, json=call.body_at(now), params=call.params,
                headers=headers, timeout=self._settings.timeout_for(call, now),
            )
        except httpx.HTTPError as exc:
            raise transport_error(exc, self._settings.url) from exc
        return reply_of(response)

    async def aclose(self) -> None:
        await self._http.aclose()


class WireEdge:
    """Through the client's own keep-alive connections (`wire.py`)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        tls = trust_context(settings.ca_bundle) if settings.ca_bundle else None
        self._pool = Pool(settings.url, headers=settings.default_headers(),
                          size=MAX_CONNECTIONS, tls=tls)

    async def send(self, call: Call[Any], headers: dict[str, str], now: float) -> Reply:
        body = call.body_at(now)
        read = call.read_timeout(self._settings.timeout, now)
        return await self._pool.send(
            call.method, call.path, params=call.params, headers=headers,
            body=None if body is None else msgspec.json.encode(body),
            connect_timeout=min(CONNECT_TIMEOUT_S, read), read_timeout=read,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


def async_edge(settings: Settings, transport: httpx.AsyncBaseTransport | None) -> AsyncEdge:
    """httpx when the caller gave a transport for it, or when the environment
    sends this URL through a proxy (`HTTP_PROXY`, ...; httpx honours those);
    else the client's own connections."""
    if transport is None and not proxied(settings.url):
        return WireEdge(settings)
    return HttpxEdge(settings, transport)


def proxied(url: str) -> bool:
    """Whether the environment's proxy settings apply to `url`."""
    proxies = urllib.request.getproxies_environment()
    parts = urllib.parse.urlsplit(url)
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(parts.netloc)  # NO_PROXY and the like
