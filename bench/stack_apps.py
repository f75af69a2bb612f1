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


def serve_fencepost_wire(port: int) -> None:
    """The same answer from fencepost's own protocol (server/wire.py) on uvloop."""
    import asyncio

    import uvloop

    from fencepost.server.messages import Request, Response
    from fencepost.server.proxies import TrustedProxies
    from fencepost.server.wire import Connections

    async def handle(request: Request) -> Response:
        return Response(BODY, media_type="application/json")

    def refuse(status: int, message: str, headers: dict[str, str]) -> tuple[Response, str]:
        return Response(b"", status_code=status), ""

    async def main() -> None:
        connections = Connections(handle, refuse, TrustedProxies([]))
        server = await asyncio.get_running_loop().create_server(
            connections.protocol, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


if __name__ == "__main__":
    import sys

    serve_fencepost_wire(int(sys.argv[1]))
