"""The ASGI application: routes from the table, JSON errors everywhere, and the
background work (reaper) tied to the app's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

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
    by_path: dict[str, dict[str, Any]] = {}
    for spec in ROUTES:
        by_path.setdefault(spec.path, {})[spec.method] = spec.handler
    routes = []
    for path, handlers in by_path.items():
        if "GET" in handlers:
            handlers["HEAD"] = handlers["GET"]

        async def dispatch(request: Request, handlers: dict[str, Any] = handlers) -> Response:
            return await handlers[request.method](request)  # type: ignore[no-any-return]

        routes.append(Route(path, dispatch, methods=list(handlers)))
    return routes


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
    return RequestIdMiddleware(app)


def begin_shutdown(asgi_app: Any) -> None:
    """Called from a signal handler: answer parked waiters so a stop is prompt."""
    app = asgi_app.app
    loop = app.state.loop
    if loop is not None:
        loop.call_soon_threadsafe(app.state.services.waiters.shut)
