"""Small HTTP helpers shared by the routes: bodies, headers, JSON responses."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from fencepost.errors import FencepostError, InvalidRequest, PayloadTooLarge

MAX_BODY_BYTES = 64 * 1024
_encoder = msgspec.json.Encoder()


def json_response(
    status: int, body: Any, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        _encoder.encode(body), status_code=status, headers=headers, media_type="application/json"
    )


def error_response(error: FencepostError) -> Response:
    return json_response(error.http_status, error.to_body(), error.response_headers())


async def read_body(request: Request) -> bytes:
    """The body, refusing anything over 64 KiB without reading the rest of it."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest("Content-Length is not a number.")
        if int(declared) > MAX_BODY_BYTES:
            raise PayloadTooLarge()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise PayloadTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def required_uuid_header(request: Request, name: str) -> str:
    """A required header that must be a UUID; missing or malformed is a 400."""
    value = request.headers.get(name)
    if value is None:
        raise InvalidRequest(f"The {name} header is required.", details=[
            {"field": name, "message": "required header is missing"}
        ])
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidRequest(f"The {name} header must be a UUID.", details=[
            {"field": name, "message": "not a UUID"}
        ]) from None
