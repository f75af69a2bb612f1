"""One serving process from its options: the store, the app, the listener.

`fencepost serve` runs one (`--workers 1`), or a supervisor that runs several
(server/workers.py), each of which is this with the supervisor's port, clock
and worker number. The options travel to a worker as JSON, so they are plain
values: paths, not open files; the TLS context is made in each process.
"""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from fencepost.server.app import AppConfig, create_app
from fencepost.server.jwt_auth import (
    DEFAULT_PROJECT_CLAIM,
    DEFAULT_ROLE_CLAIM,
    JwtSettings,
)
from fencepost.server.runner import serve, tls_context
from fencepost.server.wire import DEFAULT_MAX_PER_SOURCE, DEFAULT_OUTPUT_BUDGET
from fencepost.store import make_store


@dataclass(slots=True)
class ServeOptions:
    store: str
    store_readers: int
    host: str
    port: int
    access_log: str | None = None
    event_log: str | None = None
    metrics_key: str | None = None
    bootstrap_key: str | None = None
    trusted_proxies: list[str] = field(default_factory=list)
    max_connections: int | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    drain_seconds: float = 0.0
    store_timeout: float | None = None  # None: the store's default (SPEC §6)
    max_connections_per_source: int = DEFAULT_MAX_PER_SOURCE
    max_output_buffer_mib: int = DEFAULT_OUTPUT_BUDGET // 2**20
    require_sync_replication: bool = False
    ended_retention_ms: int | None = None  # None: the store's default (SPEC §6)
    upstream_allow: str = ""  # proxy mode's hosts and networks (SPEC §4.7); "": any
    upstream_ca_file: str | None = None  # a private CA for upstreams, besides the public roots
    # Tokens from an identity provider (SPEC §5.1): all three of issuer,
    # audience and key set, or none (API keys only).
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_jwks: str | None = None
    jwt_header: str | None = None
    jwt_project_claim: str = DEFAULT_PROJECT_CLAIM
    jwt_role_claim: str = DEFAULT_ROLE_CLAIM

    def jwt(self) -> JwtSettings | None:
        if not (self.jwt_issuer and self.jwt_audience and self.jwt_jwks):
            return None
        return JwtSettings(self.jwt_issuer, self.jwt_audience, self.jwt_jwks,
                           self.jwt_header or None, self.jwt_project_claim,
                           self.jwt_role_claim)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServeOptions:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class WorkerPlace:
    """What makes a process one worker of several: its number (1..N, kept
    across restarts), and its supervisor's clock anchor (see SteadyClock)."""

    number: int
    clock_anchor: tuple[int, int]


def launch(
    options: ServeOptions,
    on_ready: Callable[[int], None] | None = None,
    on_bootstrap: Callable[[str, bool], None] | None = None,
    worker: WorkerPlace | None = None, stop_fd: int | None = None,
) -> None:
    """Serve until stopped (see runner.serve); exit 1 after one line on stderr
    when the port is busy or the store cannot be opened."""
    tls = tls_context(options.tls_cert, options.tls_key) if (
        options.tls_cert and options.tls_key) else None
    store = make_store(options.store, readers=options.store_readers,
                       clock_anchor=worker.clock_anchor if worker else None,
                       timeout_s=options.store_timeout,
                       require_sync=options.require_sync_replication,
                       ended_retention_ms=options.ended_retention_ms)
    app = create_app(store, AppConfig(
        access_log=options.access_log, event_log=options.event_log,
        metrics_key=options.metrics_key or None, bootstrap_key=options.bootstrap_key,
        on_bootstrap=on_bootstrap, worker=worker.number if worker else None,
        upstream_allow=options.upstream_allow, upstream_ca_file=options.upstream_ca_file,
        jwt=options.jwt(),
    ))
    serve(app, options.host, options.port, options.trusted_proxies, options.max_connections,
          tls, on_ready=on_ready, drain_seconds=options.drain_seconds,
          reuse_port=worker is not None,
          stop_signals=() if worker else (signal.SIGTERM, signal.SIGINT), stop_fd=stop_fd,
          max_per_source=options.max_connections_per_source,
          output_budget=options.max_output_buffer_mib * 2**20)
