"""`GET /docs`: the API reference as one HTML page, rendered on the server from
the OpenAPI document (no scripts, no assets from a CDN)."""

from __future__ import annotations

import functools
import json

from fencepost.server.apidoc import render_html
from fencepost.server.messages import Request, Response


@functools.lru_cache(maxsize=2)
def _page(document: bytes) -> bytes:
    # The document never changes while the server runs: render it once.
    return render_html(json.loads(document)).encode()


async def api_docs(request: Request) -> Response:
    return Response(_page(request.app.openapi), media_type="text/html; charset=utf-8")
