"""A fast upstream for the proxy benchmark: asyncio with httptools (the
parser fencepost's own server uses, so both ends parse alike), answering
`GET /size/N` with N bytes and any other request, after reading its body, with
a small JSON answer. Keep-alive, Content-Length framing, nothing else: the
point is to cost as little as possible, so that the difference between calling
it directly and through fencepost is fencepost's.

    python bench/fpbench/upstream.py PORT
"""

from __future__ import annotations

import asyncio
import sys

import httptools

_SMALL = b'{"ok":true}'
_CACHE: dict[int, bytes] = {}


def _answer(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
            b"content-length: %d\r\nx-ratelimit-remaining-requests: 999999\r\n\r\n"
            % len(body)) + body


class _Conn(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_message_complete(self) -> None:
        path = self.url.split(b"?", 1)[0]
        size = int(path.rsplit(b"/", 1)[1]) if path.startswith(b"/size/") else -1
        if size >= 0:
            if size not in _CACHE:
                _CACHE[size] = _answer(b"x" * size)
            out = _CACHE[size]
        else:
            out = _answer(_SMALL)
        self.transport.write(out)  # type: ignore[attr-defined]


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Conn, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(int(sys.argv[1])))
