"""Unauthenticated routes: probes and the OpenAPI document."""

from __future__ import annotations

from fencepost import __version__
from fencepost.errors import FencepostError, ShuttingDown, StoreUnavailable
from fencepost.server import schemas
from fencepost.server.context import services
from fencepost.server.http import error_response, json_response
from fencepost.server.messages import Request, Response


async def livez(request: Request) -> Response:
    """The process serves: it never asks the store, so that a database outage
    does not get every replica restarted."""
    store = services(request).store
    return json_response(
        200, schemas.Health(status="ok", store=store.url_scheme, version=__version__)
    )


async def readyz(request: Request) -> Response:
    """Whether to send this server traffic: the store answers and takes writes,
    and the server is not shutting down."""
    if request.app.shutting_down:
        return error_response(ShuttingDown("The server is shutting down."))
    store = services(request).store
    try:
        await store.check_ready()
    except FencepostError as error:
        return error_response(error)
    except Exception as exc:  # noqa: BLE001 - any store failure means not ready
        return error_response(StoreUnavailable(f"The store is not answering: {exc}."))
    return json_response(
        200, schemas.Health(status="ok", store=store.url_scheme, version=__version__)
    )


async def healthz(request: Request) -> Response:
    """The old name of /readyz, kept for probes configured before it."""
    return await readyz(request)


async def openapi(request: Request) -> Response:
    return Response(request.app.openapi, media_type="application/json")
