"""Unauthenticated routes: health and the OpenAPI document."""

from __future__ import annotations

from fencepost import __version__
from fencepost.errors import FencepostError, StoreUnavailable
from fencepost.server import schemas
from fencepost.server.context import services
from fencepost.server.http import error_response, json_response
from fencepost.server.messages import Request, Response


async def healthz(request: Request) -> Response:
    store = services(request).store
    try:
        await store.ping()
    except FencepostError as error:
        return error_response(error)
    except Exception as exc:  # noqa: BLE001 - any store failure means unhealthy
        return error_response(StoreUnavailable(f"The store is not answering: {exc}."))
    return json_response(
        200, schemas.Health(status="ok", store=store.url_scheme, version=__version__)
    )


async def openapi(request: Request) -> Response:
    return Response(request.app.openapi, media_type="application/json")
