"""Just enough of the Redis protocol (RESP2) for setup and the Python latency probe."""

from __future__ import annotations

import socket


class RespError(Exception):
    pass


def encode(*args: str | int) -> bytes:
    """One command as RESP2 sends it: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def scalar(kind: bytes, rest: bytes) -> str | int:
    """A simple string or an integer reply (an error reply raises)."""
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RespError(rest.decode())
    if kind == b":":
        return int(rest)
    raise RespError(f"unexpected reply {kind + rest!r}")


class Resp:
    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self) -> Resp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, *args: str | int) -> object:
        self.sock.sendall(encode(*args))
        return self._read()

    def _read(self) -> object:
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            return self.file.read(size + 2)[:-2].decode()
        if kind == b"*":
            return [self._read() for _ in range(int(rest))]
        return scalar(kind, rest)
