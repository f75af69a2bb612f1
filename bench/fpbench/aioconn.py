"""One keep-alive connection over asyncio streams: HTTP/1.1 (fencepost, the etcd
gateway) or RESP2 (Redis), for the hand-off workload (g).

No client library: the hand-off times are taken in the client, so the client
should add as little as it can. A request is one buffer written, its answer
read to the last byte (Content-Length or chunked); nothing is pooled, retried
or decoded beyond that.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any, Self

from fpbench import resp
from fpbench.procs import LOOPBACK


class ConnError(RuntimeError):
    pass


class _Stream:
    """A TCP connection to 127.0.0.1:port, small writes sent at once."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Self:
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    def close(self) -> None:
        self.writer.close()


class HttpConn(_Stream):
    """One HTTP/1.1 connection; one request at a time."""

    async def call(self, method: str, path: str, body: object = None,
                   headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """Send one request; the status and the decoded JSON body (None if empty)."""
        data = b"" if body is None else json.dumps(body).encode()
        head = [f"{method} {path} HTTP/1.1", "Host: bench", f"Content-Length: {len(data)}"]
        if body is not None:
            head.append("Content-Type: application/json")
        head += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        status, raw = await self._answer()
        return status, json.loads(raw) if raw else None

    async def _answer(self) -> tuple[int, bytes]:
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise ConnError("connection closed before an answer") from exc
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        if fields.get("transfer-encoding", "").lower() == "chunked":
            return status, await self._chunks()
        return status, await self.reader.readexactly(int(fields.get("content-length", "0")))

    async def _chunks(self) -> bytes:
        out = bytearray()
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")
                return bytes(out)
            out += await self.reader.readexactly(size + 2)
            del out[-2:]


class RedisConn(_Stream):
    """One RESP2 connection; one command at a time."""

    async def call(self, *args: str | int) -> object:
        self.writer.write(resp.encode(*args))
        return await self._reply()

    async def _reply(self) -> object:
        line = await self.reader.readuntil(b"\r\n")
        kind, rest = line[:1], line[1:-2]
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else (await self.reader.readexactly(size + 2))[:-2].decode()
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [await self._reply() for _ in range(size)]
        try:
            return resp.scalar(kind, rest)
        except resp.RespError as exc:
            raise ConnError(str(exc)) from exc
