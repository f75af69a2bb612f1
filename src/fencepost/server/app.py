"""The ASGI application: routes from the table, JSON errors everywhere, and the
background work (reaper) tied to the app's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import traceback
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, compile_path

from fencepost.errors import FencepostError, MethodNotAllowed, NotFound
from fencepost.server.access_log import AccessLog
from fencepost.server.auth import Authenticator
from fencepost.server.context import Services
from fencepost.server.http import error_response
from fencepost.server.openapi import build_openapi
from fencepost.server.request_id import RequestIdMiddleware
from fencepost.server.routes.table import ROUTES
from fencepost.server.waiting import WaitRoom
from fencepost.store.base import Store

# The reaper frees dead leases; running it 4x a second keeps "freed within 1 s
# of expires_at" (SPEC §7.4) with room to spare.
REAP_INTERVAL_S = 0.25


@dataclass(slots=True)
class AppConfig:
    access_log: str | None = None
    bootstrap_key: str | None = None
    # Called with a generated bootstrap secret, once, when the store was empty.
    on_bootstrap: Callable[[str, bool], None] | None = None


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(NotFound("No such route."))
    if exc.status_code == 405:
        # RFC 9110 §15.5.6: a 405 names the methods the route allows.
        return error_response(MethodNotAllowed(headers=dict(exc.headers or {})))
    return error_response(FencepostError(str(exc.detail)))


async def _fencepost_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, FencepostError)
    return error_response(exc)


async def _unexpected(request: Request, exc: Exception) -> Response:
    # The traceback goes to the server's stderr; the caller gets the envelope only.
    return error_response(FencepostError())


async def _reap_forever(store: Store) -> None:
    while True:
        try:
            await store.reap()
        except Exception as exc:  # noqa: BLE001 - keep reaping after a store hiccup
            print(f"fencepost: reaper: {exc}", file=sys.stderr)
        await asyncio.sleep(REAP_INTERVAL_S)


def _routes() -> list[Route]:
    """One Starlette route per path, dispatching on the method, so that a 405
    lists every method the path allows."""
    routes = []
    for path, handlers in _handlers_by_path().items():

        async def dispatch(request: Request, handlers: dict[str, Any] = handlers) -> Response:
            return await handlers[request.method](request)  # type: ignore[no-any-return]

        routes.append(Route(path, dispatch, methods=list(handlers)))
    return routes


class DirectRoutes:
    """The hot path: requests for a route in the table go straight to its
    handler, past Starlette's middleware stack, which cost about a fifth of the
    server's CPU per request in the benchmark's profile. Anything else
    (lifespan, unknown paths, wrong methods) goes to the Starlette app, which
    answers it as before. Errors become their JSON envelope here, as there."""

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self._routes: list[tuple[Any, dict[str, Any]]] = []
        for path, handlers in _handlers_by_path().items():
            regex, _, _ = compile_path(path)
            self._routes.append((regex, handlers))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            for regex, handlers in self._routes:
                match = regex.match(path)
                if match is not None:
                    handler = handlers.get(scope["method"])
                    if handler is None:
                        break  # a 405, answered by Starlette with its Allow header
                    scope["app"] = self.app
                    scope["path_params"] = match.groupdict()
                    try:
                        response = await handler(Request(scope, receive))
                    except FencepostError as error:
                        response = error_response(error)
                    except Exception:  # noqa: BLE001 - never a stack trace to the caller
                        traceback.print_exc(file=sys.stderr)
                        response = error_response(FencepostError())
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _handlers_by_path() -> dict[str, dict[str, Any]]:
    by_path: dict[str, dict[str, Any]] = {}
    for spec in ROUTES:
        by_path.setdefault(spec.path, {})[spec.method] = spec.handler
    for handlers in by_path.values():
        if "GET" in handlers:
            handlers["HEAD"] = handlers["GET"]
    return by_path


def create_app(store: Store, config: AppConfig) -> Any:
    waiters = WaitRoom()
    store.add_freed_listener(waiters.on_freed)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await store.open()
        secret = await store.bootstrap(config.bootstrap_key)
        if secret is not None and config.on_bootstrap is not None:
            config.on_bootstrap(secret, config.bootstrap_key is None)
        app.state.loop = asyncio.get_running_loop()
        reaper = asyncio.create_task(_reap_forever(store))
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await store.close()
            app.state.services.access_log.close()

    app = Starlette(
        routes=_routes(),
        exception_handlers={
            HTTPException: _http_error,
            FencepostError: _fencepost_error,
            Exception: _unexpected,
        },
        lifespan=lifespan,
    )
    # "/v1/locks/" is a lock with an empty name, not a typo to redirect.
    app.router.redirect_slashes = False
    app.state.services = Services(
        store=store,
        auth=Authenticator(store),
        waiters=waiters,
        access_log=AccessLog(config.access_log),
    )
    app.state.openapi = build_openapi()
    app.state.loop = None
    return RequestIdMiddleware(DirectRoutes(app))


def begin_shutdown(asgi_app: Any) -> None:
    """Called from a signal handler: answer parked waiters so a stop is prompt."""
    app = asgi_app.app.app
    loop = app.state.loop
    if loop is not None:
        loop.call_soon_threadsafe(app.state.services.waiters.shut)
