"""The application: routes from the table, JSON errors everywhere, request IDs,
metrics and events, and the background work (reaper) tied to the server's
start and stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

from fencepost.core.upstream_allow import UpstreamAllow
from fencepost.errors import (
    FencepostError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    TooManyConnections,
)
from fencepost.events import Events
from fencepost.server import collector
from fencepost.server.access_log import AccessLog, AcquireLog
from fencepost.server.auth import Authenticator
from fencepost.server.context import Call, Services
from fencepost.server.event_log import EventLog
from fencepost.server.http import error_response
from fencepost.server.jwt_auth import JwtSettings, JwtVerifier
from fencepost.server.messages import Request, Response, StreamingResponse
from fencepost.server.metrics import UNMATCHED_ROUTE, Metrics
from fencepost.server.openapi import build_openapi
from fencepost.server.params import check_of
from fencepost.server.request_id import request_id_for
from fencepost.server.routes.table import ROUTES, RouteSpec
from fencepost.server.upstream import Upstreams
from fencepost.server.validation import decode_body
from fencepost.server.waiting import ClientGone, WaitRoom, hook_period
from fencepost.store.base import Store

_log = logging.getLogger(__name__)

# The reaper frees dead leases; running it 4x a second keeps "freed within 1 s
# of expires_at" (SPEC §7.4) with room to spare. (A waiter does not wait for
# it: the first waiter of a line re-checks when the lease in its way expires.)
REAP_INTERVAL_S = hook_period("REAP_S", 0.25)


@dataclass(slots=True)
class AppConfig:
    access_log: str | None = None
    event_log: str | None = None  # a file; None, "" or "-": standard error
    metrics_key: str | None = None  # when set, GET /metrics needs `Bearer <it>`
    bootstrap_key: str | None = None
    # Called with a generated bootstrap secret, once, when the store was empty.
    on_bootstrap: Callable[[str, bool], None] | None = None
    # This process's number among the workers of `serve --workers N` (None:
    # the only one); the probes name it in X-Fencepost-Worker.
    worker: int | None = None
    # Proxy mode (SPEC §4.7): the hosts and networks upstreams may be ("": any),
    # and a private certificate authority to trust for them.
    upstream_allow: str = ""
    upstream_ca_file: str | None = None
    # Tokens from an identity provider (SPEC §5.1); None: API keys only.
    jwt: JwtSettings | None = None


async def _reap_forever(store: Store, metrics: Metrics) -> None:
    last_error = ""
    while True:
        started = time.perf_counter()
        try:
            freed = await store.reap()
            metrics.observe_reap(freed, time.perf_counter() - started)
            last_error = ""
        except Exception as exc:  # noqa: BLE001 - keep reaping after a store hiccup
            metrics.observe_reap(None, time.perf_counter() - started)
            # Once per spell of one failure, not four lines a second while
            # the store stays down.
            if str(exc) != last_error:
                _log.error("reaper: %s", exc)
            last_error = str(exc)
        await asyncio.sleep(REAP_INTERVAL_S)


# The method label of requests no route took: clients choose methods freely.
_OTHER_METHOD = "other"


class _Route:
    """One entry of the table, ready to serve: its checks built once."""

    __slots__ = ("spec", "checks", "body", "body_optional")

    def __init__(self, spec: RouteSpec) -> None:
        self.spec = spec
        self.checks = [
            (param.name.lower() if param.where == "header" else param.name, check)
            for param in (*spec.path_params, *spec.params)
            if (check := check_of(param)) is not None
        ]
        self.body = spec.body
        self.body_optional = spec.body_optional


class _Path:
    """One path of the table and its route per method."""

    def __init__(self, template: str) -> None:
        self.template = template  # the metrics' route label
        # A parameter is one non-empty path segment: "/v1/locks//lease" and
        # "/v1/locks/" are no route (404), not a lock with an empty name.
        pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(template))
        # Except proxy mode's {path}, the rest of the path whatever it holds.
        self.regex = re.compile(pattern.replace("(?P<path>[^/]+)", "(?P<path>.*)") + r"\Z")
        self.routes: dict[str, _Route] = {}

    @property
    def allow(self) -> str:
        return ", ".join(self.routes)


def _paths() -> list[_Path]:
    by_template: dict[str, _Path] = {}
    for spec in ROUTES:
        by_template.setdefault(spec.path, _Path(spec.path)).routes[spec.method] = _Route(spec)
    for path in by_template.values():
        if "GET" in path.routes:
            path.routes["HEAD"] = path.routes["GET"]
    return list(by_template.values())


class App:
    def __init__(self, store: Store, config: AppConfig) -> None:
        self.store = store
        self.config = config
        waiters = WaitRoom()
        store.add_freed_listener(waiters.on_freed)
        # Events, once: produced where they happen (the store's commits, the
        # authenticator, the acquire routes), fanned out here.
        events = Events()
        self.metrics = Metrics(parked=waiters.parked)
        self.event_log = EventLog(config.event_log)
        events.subscribe(self.metrics.on_event)
        events.subscribe(self.event_log.on_event)
        store.add_event_listener(events.from_store)
        store.watch_batches(self.metrics.observe_batch)
        self.services = Services(
            store=store,
            auth=Authenticator(store, events,
                               JwtVerifier(config.jwt) if config.jwt is not None else None),
            waiters=waiters,
            access_log=AccessLog(config.access_log),
            events=events,
            metrics=self.metrics,
            openapi=build_openapi(),
            metrics_key=config.metrics_key,
            worker=config.worker,
            upstreams=Upstreams(config.upstream_ca_file,
                                UpstreamAllow.parse(config.upstream_allow)),
        )
        self._paths = _paths()
        self._reaper: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None

    # --- lifecycle ----------------------------------------------------------
    async def startup(self) -> None:
        await self.store.open()
        secret = await self.store.bootstrap(self.config.bootstrap_key)
        if secret is not None and self.config.on_bootstrap is not None:
            self.config.on_bootstrap(secret, self.config.bootstrap_key is None)
        if self.services.auth.jwt is not None:
            await self.services.auth.jwt.keys.warm()
        collector.tune()  # everything made so far lives as long as the process
        self._reaper = asyncio.create_task(_reap_forever(self.store, self.metrics))
        self._sweeper = asyncio.create_task(
            self.services.waiters.sweep_forever(self.store.keep_waiting, self.store.writers)
        )

    def reopen_logs(self) -> None:
        """SIGHUP (SPEC §6): reopen every log file the server writes, so that
        logrotate can move them away; logged in one line. Never fatal: a file
        that cannot be opened again is logged, and its lines keep going to the
        file open before."""
        reopened, failed = [], []
        for name, log in (("access log", self.services.access_log),
                          ("event log", self.event_log)):
            try:
                if log.reopen():
                    reopened.append(f"{name} {log.target}")
            except OSError as exc:
                failed.append(f"{name} {log.target}: {exc.strerror or exc}")
        if failed:
            _log.error("SIGHUP: could not reopen %s; writing on to the file open before",
                       "; ".join(failed))
        _log.info("SIGHUP: reopened %s", ", ".join(reopened) if reopened else
                  "no log file (the logs go to standard error)")

    def stop_being_ready(self) -> None:
        """/readyz (and /healthz) answer 503 from now on; everything else still
        serves (the drain before the listener closes)."""
        self.services.shutting_down = True

    def begin_shutdown(self) -> None:
        """Not ready, and parked waiters are answered (503) so that a stop is prompt."""
        self.stop_being_ready()
        self.services.waiters.shut()

    async def shutdown(self) -> None:
        for task in (self._reaper, self._sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.services.upstreams.close()
        await self.store.close()
        self.services.access_log.close()
        self.event_log.close()

    # --- requests -----------------------------------------------------------
    async def handle(self, request: Request) -> Response | StreamingResponse:
        started = time.perf_counter()
        request.request_id = request_id_for(request.headers.get("x-request-id"))
        method, route = _OTHER_METHOD, UNMATCHED_ROUTE
        try:
            path, found = self._route(request)
            route = path.template
            if found is None:
                # RFC 9110 §15.5.6: a 405 names the methods the route allows.
                raise MethodNotAllowed(headers={"Allow": path.allow})
            method = request.method
            response = await self._dispatch(found, request)
        except FencepostError as error:
            response = error_response(error)
        except Exception:  # noqa: BLE001 - never a stack trace to the caller
            _log.exception("a request failed unexpectedly")
            response = error_response(FencepostError())
        self.metrics.observe_request(method, route, response.status_code,
                                     time.perf_counter() - started)
        return response

    def _route(self, request: Request) -> tuple[_Path, _Route | None]:
        for path in self._paths:
            match = path.regex.match(request.path)
            if match is None:
                continue
            request.path_params = match.groupdict()
            return path, path.routes.get(request.method)
        raise NotFound("No such route.")

    async def _dispatch(self, route: _Route, request: Request) -> Response | StreamingResponse:
        """The checks the table declares for `route`, in its order (key and
        role, path parameters, headers, body), then its handler."""
        spec = route.spec
        services = self.services
        log = None
        if spec.logged is not None:
            log = AcquireLog(
                services.access_log, services.events, spec.logged,
                request.path_params.get(spec.logged.path_param, ""), request.request_id,
            )
        try:
            caller = None
            if spec.role is not None:
                caller = await services.auth.authenticate(request, spec.role)
                if log is not None:
                    log.fields.update(project=caller.project, key_id=caller.key_id)
                    if caller.app_key_id is not None:
                        log.fields.update(app_key_id=caller.app_key_id)
            params: dict[str, str] = {}
            for name, check in route.checks:
                value = check(request)
                if value is not None:
                    params[name] = value
            body: Any = None
            # An optional body is omitted only when it is empty: anything else,
            # whitespace included, must be the JSON the route takes.
            if route.body is not None and (not route.body_optional or request.body):
                body = decode_body(request.body, route.body)
            return await spec.handler(Call(request, services, caller, params, body, log))
        except ClientGone as gone:
            if log is not None:
                log.failed(gone)
            return Response(status_code=499)
        except FencepostError as error:
            if log is not None:
                log.failed(error)
            raise

    def refuse(self, status: int, message: str, headers: dict[str, str]) -> tuple[Response, str]:
        """The answer to a request the connection could not pass on, and its
        request ID."""
        error: FencepostError
        if status == 413:
            error = PayloadTooLarge()
        elif status == 400:
            error = InvalidRequest(message)
        elif status == 503:
            error = TooManyConnections(message, retry_after_ms=1000)
        else:
            error = FencepostError()
        return error_response(error), request_id_for(headers.get("x-request-id"))


def create_app(store: Store, config: AppConfig) -> App:
    return App(store, config)
