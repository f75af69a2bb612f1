"""Small HTTP helpers shared by the routes: bodies, headers, JSON responses."""

from __future__ import annotations

import re
import uuid
from typing import Any

import msgspec

from fencepost.errors import FencepostError, InvalidRequest
from fencepost.server.messages import Request, Response

MAX_BODY_BYTES = 64 * 1024
CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_encoder = msgspec.json.Encoder()


def json_response(
    status: int, body: Any, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        _encoder.encode(body), status_code=status, headers=headers, media_type="application/json"
    )


def error_response(error: FencepostError) -> Response:
    return json_response(error.http_status, error.to_body(), error.response_headers())


def required_uuid_header(request: Request, name: str) -> str:
    """A required header that must be a UUID; missing or malformed is a 400."""
    value = request.headers.get(name)
    if value is None:
        raise InvalidRequest(f"The {name} header is required.", details=[
            {"field": name, "message": "required header is missing"}
        ])
    if CANONICAL_UUID.fullmatch(value):
        return value  # the usual form; the general parse below costs 5x more
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidRequest(f"The {name} header must be a UUID.", details=[
            {"field": name, "message": "not a UUID"}
        ]) from None
