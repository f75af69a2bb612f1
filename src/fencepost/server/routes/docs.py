"""`GET /docs`: the API reference as one HTML page, rendered on the server from
the OpenAPI document (no scripts, no assets from a CDN)."""

from __future__ import annotations

import functools
import json

from fencepost.server.apidoc import render_html
from fencepost.server.context import Call
from fencepost.server.messages import Response


@functools.lru_cache(maxsize=2)
def _page(document: bytes) -> bytes:
    # The document never changes while the server runs: render it once.
    return render_html(json.loads(document)).encode()


async def api_docs(call: Call[None]) -> Response:
    return Response(_page(call.services.openapi), media_type="text/html; charset=utf-8")
