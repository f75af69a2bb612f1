"""`fencepost serve`: the command that runs the server."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path

import click

from fencepost.cli.key_files import admin_key_file, save_secret
from fencepost.cli.params import Duration, Seconds
from fencepost.cli.stores import DEFAULT_STORE
from fencepost.core.keys import MIN_BOOTSTRAP_SECRET_LENGTH
from fencepost.core.upstream_allow import UpstreamAllow
from fencepost.logs import configure as configure_logging
from fencepost.server.cores import usable_cores
from fencepost.server.jwt_auth import DEFAULT_PROJECT_CLAIM, DEFAULT_ROLE_CLAIM
from fencepost.store import make_store, redacted

_log = logging.getLogger("fencepost.serve")


def _check_log_target(option: str, target: str | None) -> None:
    """A log file's folder must exist: refused before anything is created."""
    if target in (None, "", "-", "stderr"):
        return
    folder = Path(str(target)).parent
    if not folder.is_dir():
        raise click.UsageError(f"{option}: the folder {str(folder)!r} does not exist.")


# Headers that carry something else: a token there would be read twice or not at all.
_NOT_A_TOKEN_HEADER = {"authorization", "x-api-key", "x-lock-token", "x-request-id", "host",
                       "content-length", "transfer-encoding", "connection", "cookie"}


def _check_jwt(issuer: str | None, audience: str | None, jwks: str | None,
               header: str | None) -> None:
    """JWTs need all of issuer, audience and keys (a token checked without an
    audience would be accepted from any application of the provider); a key
    set file is read now, so that a bad one fails the start."""
    given = {"--jwt-issuer": issuer, "--jwt-audience": audience, "--jwt-jwks": jwks}
    if not any(given.values()):
        if header:
            raise click.UsageError("--jwt-header needs --jwt-issuer, --jwt-audience and "
                                   "--jwt-jwks.")
        return
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise click.UsageError(f"JWTs need {', '.join(missing)} too (issuer, audience and "
                               "the provider's keys go together).")
    if header is not None and (not header.strip() or header.strip().lower()
                               in _NOT_A_TOKEN_HEADER or not header.replace("-", "").isalnum()):
        raise click.UsageError(f"--jwt-header: {header!r} cannot carry a token.")
    from fencepost.server.jwks import KeySet, is_url

    assert jwks is not None
    if not is_url(jwks):
        try:
            KeySet(jwks)
        except (OSError, ValueError) as exc:
            raise click.UsageError(f"--jwt-jwks: {exc}") from None


class WorkerCount(click.ParamType[int]):
    """1..256, or `cores`: as many as the cores this process may use (its CPU
    affinity, fewer under a CPU quota)."""

    name = "N|cores"
    _MAX = 256

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == "cores":
            return min(self._MAX, usable_cores())
        if text.isdigit() and 1 <= int(text) <= self._MAX:
            return int(text)
        self.fail(f"{value!r} is not a number of workers (1..{self._MAX}) or 'cores'.",
                  param, ctx)


@click.command()
@click.option("--store", envvar="FENCEPOST_STORE", default=DEFAULT_STORE, show_default=True,
              help="sqlite:///relative.db, sqlite:////absolute.db or "
                   "postgresql://user:pass@host:port/db")
@click.option("--store-readers", envvar="FENCEPOST_STORE_READERS", default=2, show_default=True,
              type=click.IntRange(0, 64),
              help="Read-only store connections besides the writers.")
@click.option("--store-timeout", envvar="FENCEPOST_STORE_TIMEOUT", default=2.0,
              show_default=True, type=Seconds(0.2, 300),
              help="Seconds a request waits for a PostgreSQL database that stopped answering "
                   "before it is answered 503 store_unavailable (its outcome then unknown; "
                   "retrying with the same lock token is safe).")
@click.option("--require-sync-replication", envvar="FENCEPOST_REQUIRE_SYNC_REPLICATION",
              is_flag=True, default=False,
              help="PostgreSQL: answer 503 store_not_replicated to every change while no "
                   "synchronous standby confirms commits, so that no acknowledged change "
                   "can be lost in a failover.")
@click.option("--ended-retention", envvar="FENCEPOST_ENDED_RETENTION", default="24h",
              show_default=True, type=Duration(1, 366 * 86_400),
              help="How long an ended lease (and session) is remembered: a late renewal is "
                   "told why its lease ended (lease_lost's reason), a fence check why a "
                   "token is stale, for this long; after it the reason may be absent. "
                   "Such as 90s, 15m, 24h or 7d.")
@click.option("--upstream-allow", envvar="FENCEPOST_UPSTREAM_ALLOW", default="",
              help="Comma-separated hosts (api.example.com, *.example.com), addresses or "
                   "networks (10.0.0.0/8) that a pool's upstream may be in proxy mode; "
                   "others are refused (422). Default: any, so a pool admin can make the "
                   "server call anything it can reach.")
@click.option("--upstream-ca-file", envvar="FENCEPOST_UPSTREAM_CA_FILE", default=None,
              metavar="PEM", type=click.Path(exists=True, dir_okay=False),
              help="A private certificate authority to trust for https upstreams, besides "
                   "the public roots.")
@click.option("--jwt-issuer", envvar="FENCEPOST_JWT_ISSUER", default=None, metavar="ISS",
              help="Accept JWTs from the identity provider whose `iss` is this (with "
                   "--jwt-audience and --jwt-jwks). Default: API keys only.")
@click.option("--jwt-audience", envvar="FENCEPOST_JWT_AUDIENCE", default=None, metavar="AUD",
              help="The `aud` a token must be meant for (the client id, or Cloudflare "
                   "Access's application AUD tag).")
@click.option("--jwt-jwks", envvar="FENCEPOST_JWT_JWKS", default=None, metavar="FILE|URL",
              help="The identity provider's signing keys: a JWKS file, or its URL (fetched "
                   "at start, again for an unknown key id at most every 30 s, and every "
                   "10 minutes).")
@click.option("--jwt-header", envvar="FENCEPOST_JWT_HEADER", default=None, metavar="NAME",
              help="A header that carries the bare token besides `Authorization: Bearer`, "
                   "such as Cf-Access-Jwt-Assertion.")
@click.option("--jwt-project-claim", envvar="FENCEPOST_JWT_PROJECT_CLAIM",
              default=DEFAULT_PROJECT_CLAIM, show_default=True, metavar="CLAIM",
              help="The claim naming the caller's project (a dotted path reaches into "
                   "objects).")
@click.option("--jwt-role-claim", envvar="FENCEPOST_JWT_ROLE_CLAIM",
              default=DEFAULT_ROLE_CLAIM, show_default=True, metavar="CLAIM",
              help="The claim naming the caller's role: admin, member or reader, or a list "
                   "of which the highest counts.")
@click.option("--host", envvar="FENCEPOST_HOST", default="127.0.0.1", show_default=True)
@click.option("--port", envvar="FENCEPOST_PORT", default=7440, show_default=True,
              type=click.IntRange(0, 65535))
@click.option("--access-log", envvar="FENCEPOST_ACCESS_LOG", default=None,
              help="File for JSON-lines access log (default: stderr).")
@click.option("--event-log", envvar="FENCEPOST_EVENT_LOG", default=None,
              help="File for the JSON-lines event log: leases granted and ended, keys and "
                   "pools changed, callers refused (default: stderr).")
@click.option("--metrics-key", envvar="FENCEPOST_METRICS_KEY", default=None,
              help="Require `Authorization: Bearer <this>` on GET /metrics (default: open).")
@click.option("--trusted-proxies", envvar="FENCEPOST_TRUSTED_PROXIES", default="",
              help="Comma-separated addresses of load balancers whose X-Forwarded-For "
                   "is believed (for IP allowlists). Default: none.")
@click.option("--max-connections", envvar="FENCEPOST_MAX_CONNECTIONS", default=None,
              type=click.IntRange(1, 1_000_000),
              help="Open connections held at once; more are answered 503 and closed. "
                   "Default: 4096, or fewer when the open-file limit is lower.")
@click.option("--max-connections-per-source", envvar="FENCEPOST_MAX_CONNECTIONS_PER_SOURCE",
              default=256, show_default=True, type=click.IntRange(0, 1_000_000),
              help="Open connections one client address may hold at once; 0 for no cap. "
                   "Addresses in --trusted-proxies are not capped (they speak for many "
                   "clients: cap per client in the proxy).")
@click.option("--max-output-buffer", envvar="FENCEPOST_MAX_OUTPUT_BUFFER", default=128,
              show_default=True, type=click.IntRange(0, 1_000_000), metavar="MIB",
              help="MiB of answers waiting for clients that do not read them, all "
                   "connections together; past it the connections holding the most are "
                   "cut off. 0 for no budget.")
@click.option("--tls-cert", envvar="FENCEPOST_TLS_CERT", default=None, metavar="PEM",
              help="Serve HTTPS with this certificate (chain) file; needs --tls-key.")
@click.option("--tls-key", envvar="FENCEPOST_TLS_KEY", default=None, metavar="PEM",
              help="The private key of --tls-cert.")
@click.option("--drain-seconds", envvar="FENCEPOST_DRAIN_SECONDS", default=0.0,
              show_default=True, type=Seconds(0, 3600),
              help="On SIGTERM, keep serving this long with /readyz at 503 before the "
                   "listener closes, so that load balancers stop sending work first.")
@click.option("--workers", envvar="FENCEPOST_WORKERS", default="1", show_default=True,
              type=WorkerCount(),
              help="Serving processes sharing the port, each using one core; 'cores' for "
                   "one per core this process may use (its CPU affinity, or its cgroup's "
                   "CPU quota if lower). See the operations guide.")
def serve(
    store: str, store_readers: int, host: str, port: int, access_log: str | None,
    trusted_proxies: str, max_connections: int | None, tls_cert: str | None,
    tls_key: str | None, drain_seconds: float, event_log: str | None,
    metrics_key: str | None, workers: int, store_timeout: float,
    require_sync_replication: bool, max_connections_per_source: int,
    max_output_buffer: int, ended_retention: int, upstream_allow: str,
    upstream_ca_file: str | None, jwt_issuer: str | None, jwt_audience: str | None,
    jwt_jwks: str | None, jwt_header: str | None, jwt_project_claim: str, jwt_role_claim: str,
) -> None:
    """Run the lock service."""
    configure_logging()
    from fencepost.server.launch import ServeOptions, launch
    from fencepost.server.proxies import TrustedProxies
    from fencepost.server.runner import tls_context
    from fencepost.server.workers import supervise

    bootstrap_key = os.environ.get("FENCEPOST_BOOTSTRAP_KEY") or None
    if bootstrap_key is not None and len(bootstrap_key) < MIN_BOOTSTRAP_SECRET_LENGTH:
        raise click.UsageError(
            f"FENCEPOST_BOOTSTRAP_KEY must be at least {MIN_BOOTSTRAP_SECRET_LENGTH} characters."
        )
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together: give both or neither.")
    try:
        tls = tls_context(tls_cert, tls_key) if tls_cert and tls_key else None
    except ValueError as exc:
        raise click.UsageError(f"TLS: {exc}") from None
    if workers > 1 and not hasattr(socket, "SO_REUSEPORT"):
        raise click.UsageError("--workers above 1 needs SO_REUSEPORT, which this system lacks.")
    for option, target in (("--access-log", access_log), ("--event-log", event_log)):
        _check_log_target(option, target)
    proxies = [p.strip() for p in trusted_proxies.split(",") if p.strip()]
    try:
        TrustedProxies(proxies)
    except ValueError as exc:
        raise click.UsageError(f"--trusted-proxies: {exc}") from None
    try:
        UpstreamAllow.parse(upstream_allow)
    except ValueError as exc:
        raise click.UsageError(f"--upstream-allow: {exc}") from None
    if upstream_ca_file:
        from fencepost.server.upstream import tls_context as upstream_tls

        try:
            upstream_tls(upstream_ca_file)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise click.UsageError(f"--upstream-ca-file: {exc}") from None
    _check_jwt(jwt_issuer, jwt_audience, jwt_jwks, jwt_header)
    try:
        # The URL's form, checked before anything starts.
        make_store(store, require_sync=require_sync_replication)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    key_file = admin_key_file(store)

    def announce(secret: str, generated: bool) -> None:
        if not generated:
            _log.info("created project 'default' with the key from FENCEPOST_BOOTSTRAP_KEY")
            return
        save_secret(key_file, secret)
        # A secret goes to a person's terminal only, never into a log a
        # supervisor or container runtime keeps: there, say where it is.
        if not sys.stdout.isatty():
            _log.info("created project 'default'; its admin key is in %s (readable by this "
                      "user only)", key_file.resolve())
            return
        click.echo(f"fencepost: created project 'default'; its admin key (shown once, "
                   f"also saved to {key_file}):")
        click.echo(secret)
        sys.stdout.flush()

    scheme = "https" if tls is not None else "http"

    processes = f" ({workers} workers)" if workers > 1 else ""

    def ready(bound_port: int) -> None:
        _log.info("serving on %s://%s:%s with %s%s", scheme, host, bound_port, redacted(store),
                  processes)

    options = ServeOptions(
        store=store, store_readers=store_readers, host=host, port=port, access_log=access_log,
        event_log=event_log, metrics_key=metrics_key or None, bootstrap_key=bootstrap_key,
        trusted_proxies=proxies, max_connections=max_connections, tls_cert=tls_cert,
        tls_key=tls_key, drain_seconds=drain_seconds, store_timeout=store_timeout,
        require_sync_replication=require_sync_replication,
        max_connections_per_source=max_connections_per_source,
        max_output_buffer_mib=max_output_buffer, ended_retention_ms=ended_retention,
        upstream_allow=upstream_allow, upstream_ca_file=upstream_ca_file,
        jwt_issuer=jwt_issuer or None, jwt_audience=jwt_audience or None,
        jwt_jwks=jwt_jwks or None, jwt_header=jwt_header or None,
        jwt_project_claim=jwt_project_claim, jwt_role_claim=jwt_role_claim,
    )
    if workers == 1:
        launch(options, on_ready=ready, on_bootstrap=announce)
    else:
        supervise(options, workers, on_ready=ready, on_bootstrap=announce)
