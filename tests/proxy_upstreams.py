"""Real HTTP upstreams for the proxy-mode tests, each in a thread of the test
process, on a port of its own, speaking HTTP/1.1 with keep-alive (Python's
http.server: not fencepost's code, not httpx's). One server, many kinds, by
path:

- `/echo/...`     the request as it arrived (method, path, headers, body) as JSON
- `/limited`      a rate-limited API: `capacity` calls per `window_s`, OpenAI-style
                  `x-ratelimit-*-requests` headers on every answer, 429 past it
- `/slow?ms=N`    answers after N ms
- `/drop`         reads the request and closes the connection without a word
- `/stream?chunks=N&delay_ms=M`  a chunked answer, one chunk every M ms
- `/big?bytes=N`  N bytes with a Content-Length
- `/redirect`     302 to /elsewhere
- `/status?code=N&header=Name:Value`  that status (and header), a short body

`seen` records every request (method, path, headers), `open_streams` the
streamed answers still being written, so that a test can tell whether the
proxy went on reading after its caller left.
"""

from __future__ import annotations

import http.server
import json
import ssl
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit


class Upstream:
    def __init__(self, capacity: int = 3, window_s: float = 1.0,
                 tls: ssl.SSLContext | None = None) -> None:
        self.capacity = capacity
        self.window_s = window_s
        self.seen: list[dict[str, Any]] = []
        self.stream_ended = threading.Event()  # a streamed answer stopped (done or cut off)
        self.streamed_chunks = 0
        self._window: list[float] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(_Handler):
            upstream = owner

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = "localhost" if self.scheme == "https" else "127.0.0.1"
        return f"{self.scheme}://{host}:{self.port}"

    def admit(self) -> tuple[bool, int, float]:
        """One call against the window: (admitted, remaining, seconds to reset)."""
        with self._lock:
            now = time.monotonic()
            self._window = [t for t in self._window if now - t < self.window_s]
            reset = self.window_s - (now - self._window[0]) if self._window else self.window_s
            if len(self._window) >= self.capacity:
                return False, 0, reset
            self._window.append(now)
            return True, self.capacity - len(self._window), reset

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


_KINDS = {"echo", "limited", "slow", "drop", "stream", "big", "redirect", "status"}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: Upstream

    def log_message(self, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        # As a real server does (RFC 9110 §6.4.1, §8.6): a 1xx, 204 or 304 has
        # no content (and a 1xx or 204 no Content-Length). Bytes sent after
        # one would be read as the next answer on the kept-alive connection.
        bodiless = status < 200 or status in (204, 304)
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if not (status < 200 or status == 204):
            self.send_header("content-length", "0" if bodiless else str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and not bodiless:
            self.wfile.write(body)

    def _any(self) -> None:
        body = self._body()
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        self.upstream.seen.append({"method": self.command, "path": self.path,
                                   "headers": list(self.headers.items()), "body": body})
        # The first segment that names a kind: a pool's base URL may put a
        # prefix before it ("/v1/echo/chat").
        kind = next((part for part in parts.path.split("/") if part in _KINDS), "")
        if kind == "echo":
            out = json.dumps({"method": self.command, "path": self.path,
                              "headers": list(self.headers.items()),
                              "body": body.decode("latin-1")}).encode()
            self._send(200, out, {"content-type": "application/json",
                                  "x-request-id": "upstream-req-1",
                                  "set-cookie": "a=1", "Set-Cookie": "b=2"})
        elif kind == "limited":
            ok, remaining, reset = self.upstream.admit()
            headers = {"x-ratelimit-limit-requests": str(self.upstream.capacity),
                       "x-ratelimit-remaining-requests": str(remaining),
                       "x-ratelimit-reset-requests": f"{max(reset, 0.001):.3f}s"}
            if ok:
                self._send(200, b'{"ok": true}', headers)
            else:
                headers["retry-after"] = str(max(1, round(reset)))
                self._send(429, b'{"error": "rate limited"}', headers)
        elif kind == "slow":
            time.sleep(int(query.get("ms", "1000")) / 1000)
            self._send(200, b"slow answer")
        elif kind == "drop":
            self.close_connection = True
            self.connection.close()
        elif kind == "stream":
            self._stream(int(query.get("chunks", "10")), int(query.get("delay_ms", "100")))
        elif kind == "big":
            self._send(200, b"x" * int(query.get("bytes", "1000")))
        elif kind == "redirect":
            self._send(302, b"", {"location": "/elsewhere"})
        elif kind == "status":
            extra = {}
            if "header" in query:
                name, _, value = query["header"].partition(":")
                extra[name] = value
            self._send(int(query.get("code", "200")), b"status", extra)
        else:
            self._send(404, b"no such upstream kind")

    def _stream(self, chunks: int, delay_ms: int) -> None:
        self.send_response(200)
        self.send_header("transfer-encoding", "chunked")
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        try:
            for number in range(chunks):
                data = f"data: {number}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                self.upstream.streamed_chunks += 1
                time.sleep(delay_ms / 1000)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        finally:
            self.upstream.stream_ended.set()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _any
