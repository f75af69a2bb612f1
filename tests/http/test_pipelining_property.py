"""Property: however a stream of requests is cut into TCP writes, and however
many are pipelined, a real server answers each one exactly as it answers it
alone, in order, and stops after the first that ends the connection."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import ServerProcess

GUARD_S = 20.0


def request_id(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012d}"  # a UUID: some routes require one


@dataclass(frozen=True)
class Template:
    """A request, the status SPEC gives it, and whether it ends the connection."""

    name: str
    raw: str  # `{rid}` marks where the request ID goes, `{key}` the admin key
    status: int
    ends: bool = False
    head: bool = False


def _json(method: str, path: str, body: str, extra: str = "") -> str:
    return (f"{method} {path} HTTP/1.1\r\nHost: fp\r\nAuthorization: Bearer {{key}}\r\n"
            f"X-Request-Id: {{rid}}\r\n{extra}Content-Type: application/json\r\n"
            f"Content-Length: {len(body.encode())}\r\n\r\n{body}")


TOKEN = "2f1ab0d4-9f36-4c53-a7c4-0f5d2f0b8d11"
LOCK = f"X-Lock-Token: {TOKEN}\r\n"
TEMPLATES = [
    Template("health", "GET /healthz HTTP/1.1\r\nHost: fp\r\nX-Request-Id: {rid}\r\n\r\n", 200),
    Template("head", "HEAD /healthz HTTP/1.1\r\nHost: fp\r\nX-Request-Id: {rid}\r\n\r\n", 200,
             head=True),
    Template("whoami", "GET /v1/whoami HTTP/1.1\r\nHost: fp\r\nAuthorization: Bearer {key}\r\n"
             "X-Request-Id: {rid}\r\n\r\n", 200),
    Template("no-key", "GET /v1/whoami HTTP/1.1\r\nHost: fp\r\nX-Request-Id: {rid}\r\n\r\n",
             401),
    Template("unknown-route", "GET /v1/nothing-here HTTP/1.1\r\nHost: fp\r\n"
             "X-Request-Id: {rid}\r\n\r\n", 404),
    Template("wrong-method", "DELETE /healthz HTTP/1.1\r\nHost: fp\r\nX-Request-Id: {rid}\r\n\r\n",
             405),
    Template("bad-json", _json("POST", "/v1/keys", '{"role": '), 400),
    Template("unknown-field", _json("PUT", "/v1/locks/prop-never/lease", '{"ttl": 30}',
                                    LOCK), 422),
    Template("chunked-bad-json",
             "POST /v1/keys HTTP/1.1\r\nHost: fp\r\nAuthorization: Bearer {key}\r\n"
             "X-Request-Id: {rid}\r\nContent-Type: application/json\r\n"
             "Transfer-Encoding: chunked\r\n\r\n4\r\n{\"ro\r\n3\r\nle\"\r\n0\r\n\r\n", 400),
    Template("close", "GET /healthz HTTP/1.1\r\nHost: fp\r\nConnection: close\r\n"
             "X-Request-Id: {rid}\r\n\r\n", 200, ends=True),
    Template("not-http", "BLAH /healthz HTTP/9.9\r\n\r\n", 400, ends=True),
    Template("no-host", "GET /healthz HTTP/1.1\r\nX-Request-Id: {rid}\r\n\r\n", 400, ends=True),
    Template("twice-auth", "GET /v1/whoami HTTP/1.1\r\nHost: fp\r\nAuthorization: Bearer {key}\r\n"
             "Authorization: Bearer {key}\r\nX-Request-Id: {rid}\r\n\r\n", 400, ends=True),
]


def read_reply(buffer: bytearray, sock: socket.socket,
               head: bool) -> tuple[int, dict[str, str]] | None:
    """One response from `sock` (bytes already received are in `buffer`); None
    once the server closed the connection."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            assert not buffer, f"closed mid-response: {bytes(buffer)!r}"
            return None
        buffer += chunk
    end = buffer.index(b"\r\n\r\n")
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    del buffer[:end + 4]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if head else int(headers["content-length"])
    while len(buffer) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed mid-body"
        buffer += chunk
    del buffer[:length]
    return int(lines[0].split(" ")[1]), headers


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.sampled_from(TEMPLATES), min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=1, max_value=4000), max_size=20),
)
def test_any_split_of_a_pipelined_stream_gets_the_same_answers(
    server: ServerProcess, picks: list[Template], cuts: list[int],
) -> None:
    stream = b"".join(
        t.raw.replace("{rid}", request_id(i)).replace("{key}", server.admin_key).encode()
        for i, t in enumerate(picks))
    points = sorted({c for c in cuts if c < len(stream)})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    with socket.create_connection(("127.0.0.1", server.port), timeout=GUARD_S) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for chunk in chunks:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server closed after a request that ends the connection
        buffer = bytearray()
        for i, template in enumerate(picks):
            try:
                reply = read_reply(buffer, sock, template.head)
            except ConnectionResetError:
                reply = None
            assert reply is not None, f"no answer to #{i} {template.name}"
            status, headers = reply
            assert status == template.status, (i, template.name, status)
            if "{rid}" in template.raw and template.name != "no-host":
                assert headers.get("x-request-id") == request_id(i), (i, template.name, headers)
            if template.ends:
                assert headers.get("connection") == "close", (template.name, headers)
                try:
                    rest = read_reply(buffer, sock, False)
                except ConnectionResetError:
                    rest = None
                assert rest is None, f"answered after #{i} {template.name}: {rest}"
                return
