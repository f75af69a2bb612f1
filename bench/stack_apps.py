"""Minimal apps for bench/http_stack.py: the same JSON answer from each candidate stack."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

BODY = b'{"key":"k","fencing_token":1,"expires_at":"2026-11-29T06:43:26.123Z"}'


async def ping(request):  # type: ignore[no-untyped-def]
    return Response(BODY, media_type="application/json")


starlette_app = Starlette(routes=[Route("/ping", ping)])


async def raw_asgi_app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    await send({
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"application/json")],
    })
    await send({"type": "http.response.body", "body": BODY})
