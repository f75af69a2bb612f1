"""Unauthenticated routes: probes, metrics and the OpenAPI document."""

from __future__ import annotations

import hmac

from fencepost import __version__
from fencepost.core.timefmt import format_at
from fencepost.errors import FencepostError, ShuttingDown, StoreUnavailable, Unauthorized
from fencepost.server import schemas
from fencepost.server.context import Call
from fencepost.server.http import error_response, json_response
from fencepost.server.messages import Response
from fencepost.server.metrics import CONTENT_TYPE
from fencepost.store.base import Census


def _which_worker(call: Call[None]) -> dict[str, str] | None:
    """The answering worker's number (`serve --workers N`): behind one port,
    a probe otherwise cannot tell the workers apart."""
    worker = call.services.worker
    return None if worker is None else {"X-Fencepost-Worker": str(worker)}


async def livez(call: Call[None]) -> Response:
    """The process serves: it never asks the store, so that a database outage
    does not get every replica restarted."""
    store = call.services.store
    return json_response(
        200, schemas.Health(status="ok", store=store.url_scheme, version=__version__),
        _which_worker(call),
    )


async def readyz(call: Call[None]) -> Response:
    """Whether to send this server traffic: the store answers and takes writes,
    and the server is not shutting down."""
    if call.services.shutting_down:
        return error_response(ShuttingDown("The server is shutting down."))
    store = call.services.store
    try:
        await store.check_ready()
    except FencepostError as error:
        return error_response(error)
    except Exception as exc:  # noqa: BLE001 - any store failure means not ready
        return error_response(StoreUnavailable(f"The store is not answering: {exc}."))
    replication = store.replication()
    shown = None if replication is None else schemas.StoreReplication(
        mode=replication.mode.value, standbys=replication.standbys
    )
    # Still 200: the store serves, and its tokens were floored above every
    # one granted; taking every replica out of service would not help.
    went_back = store.went_back()
    back = None if went_back is None else schemas.StoreWentBack(
        before=went_back.before, after=went_back.after, at=format_at(went_back.at_ms) or "",
        tokens_from=went_back.tokens_from, count=went_back.count,
    )
    return json_response(
        200, schemas.Health(
            status="ok" if back is None else "degraded", store=store.url_scheme,
            version=__version__, replication=shown, went_back=back,
        ),
        _which_worker(call),
    )


async def healthz(call: Call[None]) -> Response:
    """The old name of /readyz, kept for probes configured before it."""
    return await readyz(call)


async def openapi(call: Call[None]) -> Response:
    return Response(call.services.openapi, media_type="application/json")


async def metrics(call: Call[None]) -> Response:
    """The Prometheus exposition: this process's counters, and the shared state
    read from the store now (`fencepost_store_up` 0 when it does not answer).
    Open unless the server was given a metrics key."""
    svc = call.services
    wanted = svc.metrics_key
    if wanted is not None:
        scheme, _, given = (call.request.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), wanted.encode()
        ):
            return error_response(Unauthorized("GET /metrics needs `Bearer <metrics key>`."))
    census: Census | None
    try:
        census = await svc.store.census()
    except Exception:  # noqa: BLE001 - a store outage is a metric, not a failed scrape
        census = None
    return Response(
        svc.metrics.exposition(census, svc.store.replication()), media_type=CONTENT_TYPE
    )
