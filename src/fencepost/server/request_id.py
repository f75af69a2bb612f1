"""Pure ASGI middleware: every response carries X-Request-Id (SPEC §2)."""

from __future__ import annotations

import uuid
from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_REQUEST_ID_LENGTH = 128


def _caller_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            # Echo only what is safe to put back in a header and in a log line.
            if 0 < len(value) <= MAX_REQUEST_ID_LENGTH and all(0x21 <= b <= 0x7E for b in value):
                return value.decode("ascii")
            return None
    return None


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _caller_request_id(scope) or str(uuid.uuid4())
        scope["fencepost.request_id"] = request_id
        header = (b"x-request-id", request_id.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    *(h for h in message.get("headers", ()) if h[0].lower() != b"x-request-id"),
                    header,
                ]
            await send(message)

        await self.app(scope, receive, send_with_id)
