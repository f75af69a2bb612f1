"""The HTTP/1.1 connection (server/wire.py) over real sockets, against an
in-process server: keep-alive, pipelining, HEAD, 100-continue, size caps,
malformed input, request IDs, disconnects, idle timeout and graceful shut.

Timeouts here (GUARD_S) only stop a broken test from hanging; no assertion
depends on how fast anything happens."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import fencepost.server.wire as wire
from fencepost.server.app import App, AppConfig, create_app
from fencepost.server.messages import Address, Request, Response
from fencepost.server.proxies import TrustedProxies
from fencepost.server.wire import Connections
from fencepost.store.sqlite import SqliteStore

KEY = "fp_test_bootstrap_admin_key_0123456789abcdef"
GUARD_S = 10.0
LIMIT = 64 * 1024


# --- a tiny HTTP client over asyncio streams ------------------------------------------------


@dataclass
class Reply:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)

    def error_code(self) -> str:
        body = self.json()
        assert set(body) == {"error"}, body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
        return str(body["error"]["code"])


def request_bytes(
    method: str, path: str, *, headers: dict[str, str] | None = None, body: bytes = b"",
    version: str = "HTTP/1.1", auth: bool = True, length: bool = True,
) -> bytes:
    lines = [f"{method} {path} {version}", "Host: 127.0.0.1"]
    if auth:
        lines.append(f"Authorization: Bearer {KEY}")
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if length and (body or method in ("PUT", "POST", "PATCH")):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def lock_headers(token: str | None = None, request_id: str | None = None) -> dict[str, str]:
    return {"X-Lock-Token": token or str(uuid.uuid4()),
            "X-Request-Id": request_id or str(uuid.uuid4())}


def acquire_bytes(key: str, token: str, ttl: int = 60, **fields: Any) -> bytes:
    body = json.dumps({"ttl_seconds": ttl, **fields}).encode()
    return request_bytes("PUT", f"/v1/locks/{key}/lease", body=body,
                         headers={**lock_headers(token), "Content-Type": "application/json"})


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1024 * 1024)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def reply(self, head: bool = False) -> Reply:
        raw = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), GUARD_S)
        status_line, *header_lines = raw[:-4].decode("latin-1").split("\r\n")
        version, code, reason = status_line.split(" ", 2)
        assert version == "HTTP/1.1", status_line
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            assert name.lower() not in headers, f"repeated header {name}: {raw!r}"
            headers[name.lower()] = value.strip()
        reply = Reply(int(code), reason, headers)
        if reply.status >= 200 and not head:
            length = int(headers["content-length"])
            reply.body = await asyncio.wait_for(self.reader.readexactly(length), GUARD_S)
        return reply

    async def request(self, data: bytes, head: bool = False) -> Reply:
        await self.send(data)
        return await self.reply(head=head)

    async def closed_by_server(self) -> bool:
        """True once the server closes the connection without sending anything more."""
        try:
            rest = await asyncio.wait_for(self.reader.read(), GUARD_S)
        except ConnectionResetError:
            return True
        assert rest == b"", f"unexpected bytes before the close: {rest[:200]!r}"
        return True

    def close(self) -> None:
        self.writer.close()


# --- the in-process server --------------------------------------------------------------------


@dataclass
class Served:
    app: App
    connections: Connections
    server: asyncio.Server
    port: int
    clients: list[Client] = field(default_factory=list)

    async def client(self) -> Client:
        c = await Client.connect(self.port)
        self.clients.append(c)
        return c


async def start(
    app: App, proxies: TrustedProxies | None = None,
    handle: Callable[[Request], Awaitable[Response]] | None = None,
) -> Served:
    connections = Connections(handle or app.handle, app.refuse, proxies or TrustedProxies([]))
    server = await asyncio.get_running_loop().create_server(
        connections.protocol, "127.0.0.1", 0)
    return Served(app, connections, server, server.sockets[0].getsockname()[1])


async def stop(served: Served) -> None:
    for c in served.clients:
        c.close()
    served.server.close()
    served.app.begin_shutdown()
    served.connections.abort()
    await served.server.wait_closed()
    await asyncio.sleep(0.05)  # let parked requests see the shutdown and finish


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[App]:
    application = create_app(SqliteStore(str(tmp_path / "s.db")),
                             AppConfig(bootstrap_key=KEY, access_log=str(tmp_path / "a.log")))
    await application.startup()
    yield application
    await application.shutdown()


@pytest.fixture
async def served(app: App) -> AsyncIterator[Served]:
    s = await start(app)
    yield s
    await stop(s)


async def call(app: App, method: str, path: str, headers: dict[str, str] | None = None,
               body: bytes = b"") -> Response:
    """A request straight to the app, on no connection (used to act while the
    connections under test are busy or being shut)."""
    all_headers = {"authorization": f"Bearer {KEY}"}
    all_headers.update({k.lower(): v for k, v in (headers or {}).items()})
    request = Request(method, path, "", all_headers, Address("127.0.0.1", 1), body, "",
                      asyncio.Event())
    return await app.handle(request)


async def lock_state(app: App, key: str) -> dict[str, Any]:
    response = await call(app, "GET", f"/v1/locks/{key}")
    assert response.status_code == 200, response.body
    return dict(json.loads(response.body))


async def eventually(predicate: Callable[[], Awaitable[bool]], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GUARD_S
    while not await predicate():
        assert loop.time() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.01)


def unique(prefix: str = "wire") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# --- keep-alive and pipelining ----------------------------------------------------------------


async def test_keep_alive_serves_several_requests_on_one_connection(served: Served) -> None:
    c = await served.client()
    for path in ("/healthz", "/v1/whoami", "/healthz", "/v1/locks"):
        reply = await c.request(request_bytes("GET", path))
        assert reply.status == 200, (path, reply)
        assert "connection" not in reply.headers, reply.headers
    assert len(served.connections.open) == 1


async def test_pipelined_requests_are_answered_in_order_with_their_own_ids(
    served: Served,
) -> None:
    key, token = unique(), str(uuid.uuid4())
    ids = [str(uuid.uuid4()) for _ in range(5)]
    acquire_body = json.dumps({"ttl_seconds": 60}).encode()
    batch = [
        request_bytes("GET", "/healthz", headers={"X-Request-Id": ids[0]}),
        request_bytes("PUT", f"/v1/locks/{key}/lease", body=acquire_body,
                      headers=lock_headers(token, ids[1])),
        request_bytes("GET", f"/v1/locks/{key}", headers={"X-Request-Id": ids[2]}),
        request_bytes("GET", "/no/such/route", headers={"X-Request-Id": ids[3]}),
        request_bytes("DELETE", f"/v1/locks/{key}/lease",
                      headers={"X-Lock-Token": token, "X-Request-Id": ids[4]}),
    ]
    c = await served.client()
    await c.send(b"".join(batch))
    replies = [await c.reply() for _ in batch]
    assert [r.status for r in replies] == [200, 201, 200, 404, 200], replies
    assert [r.headers["x-request-id"] for r in replies] == ids
    assert replies[2].json()["held"] is True  # served after the acquire, not beside it
    assert replies[4].json() == {"released": True}


async def test_many_pipelined_requests_past_the_queue_cap_are_all_answered(
    served: Served,
) -> None:
    count = 4 * wire.MAX_PIPELINED + 3
    ids = [str(uuid.uuid4()) for _ in range(count)]
    c = await served.client()
    await c.send(b"".join(request_bytes("GET", "/healthz", headers={"X-Request-Id": i})
                          for i in ids))
    replies = [await c.reply() for _ in ids]
    assert [r.headers["x-request-id"] for r in replies] == ids
    assert {r.status for r in replies} == {200}
    # And the connection still works afterwards.
    assert (await c.request(request_bytes("GET", "/healthz"))).status == 200


@pytest.mark.parametrize("raw", [
    request_bytes("GET", "/healthz", headers={"Connection": "close"}),
    request_bytes("GET", "/healthz", version="HTTP/1.0"),
], ids=["connection-close", "http-1.0"])
async def test_close_requests_get_connection_close_and_the_socket_closes(
    served: Served, raw: bytes,
) -> None:
    c = await served.client()
    reply = await c.request(raw)
    assert reply.status == 200
    assert reply.headers.get("connection") == "close", reply.headers
    assert await c.closed_by_server()


async def test_requests_pipelined_after_connection_close_are_not_served(served: Served) -> None:
    key = unique()
    c = await served.client()
    await c.send(request_bytes("GET", "/healthz", headers={"Connection": "close"})
                 + acquire_bytes(key, str(uuid.uuid4())))
    reply = await c.reply()
    assert reply.headers.get("connection") == "close"
    assert await c.closed_by_server()
    assert (await lock_state(served.app, key))["held"] is False


async def test_http_1_0_keep_alive_is_either_announced_or_refused(served: Served) -> None:
    """An HTTP/1.0 client keeps the connection only when the response says
    `Connection: keep-alive` (RFC 9112 §9.3, RFC 2068 §19.7.1); otherwise it
    reads until the server closes. The server must say which one it does."""
    c = await served.client()
    reply = await c.request(request_bytes("GET", "/healthz", version="HTTP/1.0",
                                          headers={"Connection": "keep-alive"}))
    assert reply.status == 200
    said = reply.headers.get("connection", "").lower()
    assert said in ("keep-alive", "close"), (
        f"HTTP/1.0 keep-alive request answered with neither keep-alive nor close: "
        f"{reply.headers}")
    if said == "close":
        assert await c.closed_by_server()
    else:
        assert (await c.request(request_bytes("GET", "/healthz", version="HTTP/1.0",
                                              headers={"Connection": "keep-alive"}))).status == 200


async def test_upgrade_request_is_answered_as_plain_http_and_closed(served: Served) -> None:
    c = await served.client()
    reply = await c.request(request_bytes("GET", "/healthz", headers={
        "Connection": "Upgrade", "Upgrade": "websocket"}))
    assert reply.status == 200
    assert reply.headers.get("connection") == "close"
    assert await c.closed_by_server()


# --- HEAD, 100-continue ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/healthz", "/v1/whoami", "/openapi.json"])
async def test_head_has_the_get_headers_and_no_body(served: Served, path: str) -> None:
    c = await served.client()
    get = await c.request(request_bytes("GET", path))
    assert get.status == 200 and get.body
    head = await c.request(request_bytes("HEAD", path), head=True)
    assert head.status == 200
    assert int(head.headers["content-length"]) == len(get.body)
    assert head.headers.get("content-type") == get.headers.get("content-type")
    # No body bytes followed the head: the next thing on the wire is the next response.
    after = await c.request(request_bytes("GET", "/healthz"))
    assert after.status == 200 and after.json()


async def test_expect_100_continue_gets_continue_before_the_answer(served: Served) -> None:
    key, token = unique(), str(uuid.uuid4())
    body = json.dumps({"ttl_seconds": 60}).encode()
    head = request_bytes("PUT", f"/v1/locks/{key}/lease", body=body,
                         headers={**lock_headers(token), "Expect": "100-continue"})
    head = head[: -len(body)]
    c = await served.client()
    await c.send(head)
    interim = await c.reply()
    assert (interim.status, interim.reason) == (100, "Continue")
    assert interim.headers == {}
    await c.send(body)
    final = await c.reply()
    assert final.status == 201, final
    assert final.json()["fencing_token"] >= 1


async def test_expect_100_continue_behind_a_busy_request_still_gets_continue(
    served: Served,
) -> None:
    """A pipelined `Expect: 100-continue` request that arrives while another is
    being served must get its 100 (or a final answer) once its turn comes
    (RFC 9110 §10.1.1); without one, a client that waits for it never sends
    its body."""
    key, holder = unique(), str(uuid.uuid4())
    assert (await call(served.app, "PUT", f"/v1/locks/{key}/lease", lock_headers(holder),
                       b'{"ttl_seconds": 60}')).status_code == 201
    c = await served.client()
    await c.send(acquire_bytes(key, str(uuid.uuid4()), wait_seconds=30))
    await eventually(lambda: _waiters_are(served.app, key, 1), "the waiter is in line")
    body = b'{"ttl_seconds": 60}'
    second = request_bytes("PUT", f"/v1/locks/{unique()}/lease", body=body,
                           headers={**lock_headers(), "Expect": "100-continue"})
    await c.send(second[: -len(body)])
    await asyncio.sleep(0.05)  # let the server read the second head while it is busy
    released = await call(served.app, "DELETE", f"/v1/locks/{key}/lease",
                          {"X-Lock-Token": holder})
    assert released.status_code == 200
    assert (await c.reply()).status == 201  # the waiter
    interim = await c.reply()
    assert interim.status == 100, interim
    await c.send(body)
    assert (await c.reply()).status == 201


async def _waiters_are(app: App, key: str, count: int) -> bool:
    return int((await lock_state(app, key))["waiters"]) == count


# --- size caps -----------------------------------------------------------------------------------


def padded_acquire_body(size: int) -> bytes:
    """A valid acquire body of exactly `size` bytes (JSON allows trailing spaces)."""
    body = b'{"ttl_seconds": 60}'
    return body + b" " * (size - len(body))


async def test_body_of_exactly_64k_is_served(served: Served) -> None:
    body = padded_acquire_body(LIMIT)
    c = await served.client()
    reply = await c.request(request_bytes("PUT", f"/v1/locks/{unique()}/lease", body=body,
                                          headers=lock_headers()))
    assert reply.status == 201, reply


async def test_declared_oversize_body_with_expect_is_413_at_once(served: Served) -> None:
    key = unique()
    c = await served.client()
    head = request_bytes("PUT", f"/v1/locks/{key}/lease", body=b"",
                         headers={**lock_headers(), "Expect": "100-continue",
                                  "Content-Length": str(LIMIT + 1)}, length=False)
    reply = await c.request(head)  # the body is never sent
    assert reply.status == 413, reply
    assert reply.error_code() == "payload_too_large"
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.headers.get("connection") == "close"
    assert await c.closed_by_server()
    assert (await lock_state(served.app, key))["held"] is False


async def send_while_reading(c: Client, raw: bytes) -> Reply:
    """Send `raw` and read the answer at the same time (an early answer is
    fine); a reset before the answer arrives fails the test."""

    async def send_all() -> None:
        with contextlib.suppress(ConnectionError):
            await c.send(raw)

    sender = asyncio.create_task(send_all())
    try:
        return await c.reply()
    except ConnectionResetError:
        pytest.fail(f"a {len(raw)}-byte request got a reset connection, not an answer")
    finally:
        await sender


@pytest.mark.parametrize("size", [LIMIT + 1, 4 * LIMIT, 16 * LIMIT])
async def test_declared_oversize_body_without_expect_is_413_not_a_reset(
    served: Served, size: int,
) -> None:
    """A client that sends its whole (too large) body without asking first
    gets the 413, not a reset connection: it reads while it writes, as curl
    does, so an early answer is fine too, but the answer must reach it."""
    key = unique()
    c = await served.client()
    raw = request_bytes("PUT", f"/v1/locks/{key}/lease", body=padded_acquire_body(size),
                        headers=lock_headers())

    reply = await send_while_reading(c, raw)
    assert reply.status == 413, reply
    assert reply.error_code() == "payload_too_large"
    assert reply.headers.get("connection") == "close"
    assert (await lock_state(served.app, key))["held"] is False


def chunked(body: bytes, size: int = 8192) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
             for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


async def test_chunked_body_under_the_cap_is_served(served: Served) -> None:
    key = unique()
    head = request_bytes("PUT", f"/v1/locks/{key}/lease", length=False,
                         headers={**lock_headers(), "Transfer-Encoding": "chunked"})
    c = await served.client()
    reply = await c.request(head + chunked(b'{"ttl_seconds": 60}', size=5))
    assert reply.status == 201, reply
    assert (await lock_state(served.app, key))["held"] is True


@pytest.mark.parametrize("size", [LIMIT + 100, 16 * LIMIT])
async def test_chunked_body_over_64k_is_413(served: Served, size: int) -> None:
    key = unique()
    head = request_bytes("PUT", f"/v1/locks/{key}/lease", length=False,
                         headers={**lock_headers(), "Transfer-Encoding": "chunked"})
    c = await served.client()
    reply = await send_while_reading(c, head + chunked(padded_acquire_body(size)))
    assert reply.status == 413, reply
    assert reply.error_code() == "payload_too_large"
    assert reply.headers.get("connection") == "close"
    assert await c.closed_by_server()
    assert (await lock_state(served.app, key))["held"] is False


@pytest.mark.parametrize("expect", [False, True], ids=["after-body", "expect-100"])
async def test_413_echoes_the_callers_request_id(served: Served, expect: bool) -> None:
    rid = str(uuid.uuid4())
    headers = {"X-Lock-Token": str(uuid.uuid4()), "X-Request-Id": rid,
               "Content-Length": str(LIMIT + 1)}
    if expect:
        headers["Expect"] = "100-continue"
    raw = request_bytes("PUT", f"/v1/locks/{unique()}/lease", headers=headers, length=False)
    if not expect:
        raw += padded_acquire_body(LIMIT + 1)
    c = await served.client()
    reply = await c.request(raw)
    assert reply.status == 413
    assert reply.headers.get("x-request-id") == rid, reply.headers


class FakeTransport(asyncio.Transport):
    """Collects what the connection writes; reports what it asked of the socket."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.protocol: asyncio.BaseProtocol | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "write after close"
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0  # everything written goes out at once

    def can_write_eof(self) -> bool:
        return False  # no half-close: the connection closes at once after a 413

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.protocol is not None:
                asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.aborted = True
        self.close()

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
async def test_body_far_over_the_cap_is_not_called_invalid_http(
    app: App, framing: str,
) -> None:
    """A body of over a megabyte is well-formed HTTP that is too large: if it is
    answered at all (the connection may give up reading it), the answer is
    413 payload_too_large, not 400 "not valid HTTP/1.1"."""
    connections = Connections(app.handle, app.refuse, TrustedProxies([]))
    protocol = connections.protocol()
    transport = FakeTransport()
    transport.protocol = protocol
    protocol.connection_made(transport)
    size = 1024 * 1024 + LIMIT
    body = padded_acquire_body(size)
    if framing == "chunked":
        head = request_bytes("PUT", f"/v1/locks/{unique()}/lease", length=False,
                             headers={**lock_headers(), "Transfer-Encoding": "chunked"})
        wire_bytes = head + chunked(body, size=LIMIT)
    else:
        wire_bytes = request_bytes("PUT", f"/v1/locks/{unique()}/lease", body=body,
                                   headers=lock_headers())
    for i in range(0, len(wire_bytes), LIMIT):
        if transport.closed:
            break
        protocol.data_received(wire_bytes[i:i + LIMIT])
    await asyncio.sleep(0.05)
    assert transport.closed, "the connection was neither answered nor cut"
    if transport.written:
        status_line = bytes(transport.written).split(b"\r\n", 1)[0]
        assert status_line == b"HTTP/1.1 413 Request Entity Too Large", bytes(
            transport.written[:300])


# --- malformed requests --------------------------------------------------------------------------


@pytest.mark.parametrize("garbage", [
    b"\x00\x01\x02 this is not http\r\n\r\n",
    b"GET /healthz HTTP/9.9\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nBad Header Name: x\r\n\r\n",
    b"PUT /v1/locks/x/lease HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
], ids=["binary", "version", "header-name", "length-and-chunked"])
async def test_malformed_http_is_400_and_the_connection_closes(
    served: Served, garbage: bytes,
) -> None:
    c = await served.client()
    reply = await c.request(garbage)
    assert reply.status == 400, reply
    assert reply.error_code() == "invalid_request"
    assert reply.headers.get("connection") == "close"
    assert reply.headers.get("x-request-id")
    assert await c.closed_by_server()


async def test_garbage_after_a_good_request_answers_the_good_one_first(served: Served) -> None:
    c = await served.client()
    await c.send(request_bytes("GET", "/healthz") + b"\x00garbage\r\n\r\n")
    first, second = await c.reply(), await c.reply()
    assert first.status == 200 and "connection" not in first.headers
    assert second.status == 400 and second.error_code() == "invalid_request"
    assert await c.closed_by_server()


@pytest.mark.parametrize("size", [LIMIT + 1024, 3 * LIMIT], ids=["over", "far-over"])
async def test_headers_over_64k_are_400(served: Served, size: int) -> None:
    c = await served.client()
    reply = await c.request(request_bytes("GET", "/healthz", headers={"X-Big": "a" * size}))
    assert reply.status == 400, reply
    assert reply.error_code() == "invalid_request"
    assert reply.headers.get("x-request-id")


async def test_url_over_64k_is_400(served: Served) -> None:
    c = await served.client()
    reply = await c.request(request_bytes("GET", "/v1/locks/" + "a" * (LIMIT + 10)))
    assert reply.status == 400, reply
    assert reply.error_code() == "invalid_request"


@pytest.mark.parametrize("target", [
    "http://127.0.0.1",  # absolute form with no path
    "*",
], ids=["absolute-no-path", "asterisk"])
async def test_odd_request_targets_get_an_answer(served: Served, target: str) -> None:
    """Whatever the request target, the connection answers (an error is fine):
    it must not leave the caller waiting forever."""
    c = await served.client()
    reply = await c.request(request_bytes("OPTIONS" if target == "*" else "GET", target))
    assert 400 <= reply.status < 500, reply
    assert reply.headers.get("x-request-id")
    assert served.connections.busy() == 0


async def test_absolute_form_target_is_routed_by_its_path(served: Served) -> None:
    c = await served.client()
    reply = await c.request(request_bytes("GET", "http://127.0.0.1/healthz"))
    assert reply.status == 200, reply


async def test_connect_request_gets_an_answer(served: Served) -> None:
    c = await served.client()
    reply = await c.request(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    assert 400 <= reply.status < 500, reply
    assert await c.closed_by_server()


# --- routing errors, request IDs, Date ------------------------------------------------------------


async def test_unknown_route_is_404_envelope(served: Served) -> None:
    c = await served.client()
    for path in ("/nope", "/v1/locks/", "/v1/locks//lease", "/v1/locks/a/b/c"):
        reply = await c.request(request_bytes("GET", path))
        assert reply.status == 404, (path, reply)
        assert reply.error_code() == "not_found"
        assert reply.headers["content-type"].startswith("application/json")
    assert "connection" not in reply.headers  # an error does not end the connection


@pytest.mark.parametrize("method,path,allowed", [
    ("POST", "/v1/locks/x", {"GET", "HEAD", "DELETE"}),
    ("PUT", "/healthz", {"GET", "HEAD"}),
    ("GET", "/v1/locks/x/lease", {"PUT", "PATCH", "DELETE"}),
])
async def test_wrong_method_is_405_with_allow(
    served: Served, method: str, path: str, allowed: set[str],
) -> None:
    c = await served.client()
    reply = await c.request(request_bytes(method, path, body=b"{}" if method != "GET" else b""))
    assert reply.status == 405, reply
    assert reply.error_code() == "method_not_allowed"
    assert {m.strip() for m in reply.headers["allow"].split(",")} == allowed


def _date_ok(value: str | None) -> bool:
    if not value:
        return False
    parsed = email.utils.parsedate_to_datetime(value)
    return parsed.tzinfo is not None and value.endswith(" GMT")


EVERY_KIND = {
    "ok": request_bytes("GET", "/healthz"),
    "created": request_bytes("PUT", "/v1/locks/rid-created/lease", body=b'{"ttl_seconds": 5}',
                             headers=lock_headers()),
    "unauthorized": request_bytes("GET", "/v1/whoami", auth=False),
    "not-found": request_bytes("GET", "/nope"),
    "method": request_bytes("PATCH", "/healthz", body=b"{}"),
    "validation": request_bytes("PUT", "/v1/locks/x/lease", body=b"{", headers=lock_headers()),
    "too-large": request_bytes("PUT", "/v1/locks/x/lease", body=b" " * (LIMIT + 1)),
    "headers-too-large": request_bytes("GET", "/healthz", headers={"X-Big": "b" * (LIMIT + 1)}),
    "malformed": b"\xff\xfe\r\n\r\n",
    "head": request_bytes("HEAD", "/healthz"),
}


@pytest.mark.parametrize("kind", list(EVERY_KIND))
async def test_every_response_has_request_id_and_date(served: Served, kind: str) -> None:
    c = await served.client()
    reply = await c.request(EVERY_KIND[kind], head=kind == "head")
    assert reply.status != 500, reply
    rid = reply.headers.get("x-request-id")
    assert rid and uuid.UUID(rid).version == 4, reply.headers
    assert _date_ok(reply.headers.get("date")), reply.headers


async def test_request_id_is_echoed_when_safe_and_replaced_when_not(served: Served) -> None:
    c = await served.client()
    mine = "trace-abc.123"
    assert (await c.request(request_bytes(
        "GET", "/healthz", headers={"X-Request-Id": mine}))).headers["x-request-id"] == mine
    unsafe = "has space"
    replaced = (await c.request(request_bytes(
        "GET", "/healthz", headers={"X-Request-Id": unsafe}))).headers["x-request-id"]
    assert replaced != unsafe and uuid.UUID(replaced).version == 4
    a = (await c.request(request_bytes("GET", "/healthz"))).headers["x-request-id"]
    b = (await c.request(request_bytes("GET", "/healthz"))).headers["x-request-id"]
    assert a != b


# --- the app behind the connection ----------------------------------------------------------------


async def test_a_failing_handler_is_a_500_envelope_and_the_connection_lives_on(app: App) -> None:
    calls: list[str] = []

    async def handle(request: Request) -> Response:
        calls.append(request.path)
        if request.path == "/boom":
            raise RuntimeError("bug")
        return await app.handle(request)

    s = await start(app, handle=handle)
    try:
        c = await s.client()
        reply = await c.request(request_bytes("GET", "/boom"))
        assert reply.status == 500, reply
        assert reply.error_code() == "internal_error"
        assert (await c.request(request_bytes("GET", "/healthz"))).status == 200
        assert calls == ["/boom", "/healthz"]
    finally:
        await stop(s)


async def test_request_fields_reach_the_app(app: App) -> None:
    seen: list[Request] = []

    async def handle(request: Request) -> Response:
        seen.append(request)
        return Response(b"ok", headers={"X-Extra": "1"}, media_type="text/plain")

    s = await start(app, handle=handle)
    try:
        c = await s.client()
        reply = await c.request(request_bytes(
            "POST", "/a%20b/c?x=1&y=two", body=b"payload", headers={"X-Thing": "v"}))
        assert reply.status == 200 and reply.body == b"ok"
        assert reply.headers["x-extra"] == "1"
        assert reply.headers["content-type"] == "text/plain"
        (request,) = seen
        assert request.method == "POST"
        assert request.path == "/a b/c"
        assert request.query_params.get("x") == "1" and request.query_params.get("y") == "two"
        assert request.headers.get("X-THING") == "v"
        assert request.body == b"payload"
        assert request.client is not None and request.client.host == "127.0.0.1"
    finally:
        await stop(s)


@pytest.mark.parametrize("trusted,forwarded,expected", [
    ([], "203.0.113.7", "127.0.0.1"),
    (["127.0.0.1"], "203.0.113.7", "203.0.113.7"),
    (["127.0.0.1"], "198.51.100.1, 203.0.113.7", "203.0.113.7"),
    (["10.0.0.0/8"], "203.0.113.7", "127.0.0.1"),
    (["127.0.0.1"], None, "127.0.0.1"),
])
async def test_forwarded_for_sets_the_client_only_from_trusted_peers(
    app: App, trusted: list[str], forwarded: str | None, expected: str,
) -> None:
    seen: list[Request] = []

    async def handle(request: Request) -> Response:
        seen.append(request)
        return Response(b"")

    s = await start(app, proxies=TrustedProxies(trusted), handle=handle)
    try:
        c = await s.client()
        headers = {"X-Forwarded-For": forwarded} if forwarded else {}
        assert (await c.request(request_bytes("GET", "/x", headers=headers))).status == 200
        assert seen[0].client is not None and seen[0].client.host == expected
    finally:
        await stop(s)


# --- disconnects, idle timeout, shutdown ----------------------------------------------------------


async def hold(app: App, key: str) -> str:
    holder = str(uuid.uuid4())
    response = await call(app, "PUT", f"/v1/locks/{key}/lease", lock_headers(holder),
                          b'{"ttl_seconds": 60}')
    assert response.status_code == 201, response.body
    return holder


async def release(app: App, key: str, holder: str) -> None:
    response = await call(app, "DELETE", f"/v1/locks/{key}/lease", {"X-Lock-Token": holder})
    assert json.loads(response.body) == {"released": True}


async def test_a_waiter_that_disconnects_leaves_the_line(served: Served) -> None:
    key = unique("gone")
    holder = await hold(served.app, key)
    ghost = str(uuid.uuid4())
    c = await served.client()
    await c.send(acquire_bytes(key, ghost, wait_seconds=30))
    await eventually(lambda: _waiters_are(served.app, key, 1), "the waiter is in line")
    c.writer.close()
    await eventually(lambda: _waiters_are(served.app, key, 0), "the waiter left the line")
    await release(served.app, key, holder)
    state = await lock_state(served.app, key)
    assert state["held"] is False, state
    other = await Client.connect(served.port)
    served.clients.append(other)
    reply = await other.request(acquire_bytes(key, str(uuid.uuid4())))  # fail-fast
    assert reply.status == 201, reply
    renew = await call(served.app, "PATCH", f"/v1/locks/{key}/lease", lock_headers(ghost),
                       b'{"ttl_seconds": 30}')
    assert renew.status_code == 409  # the ghost never got the lock


async def test_idle_connection_is_closed_after_the_keep_alive_timeout(
    app: App, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wire, "KEEP_ALIVE_S", 0.2)
    s = await start(app)
    try:
        never_spoke = await s.client()
        spoke = await s.client()
        assert (await spoke.request(request_bytes("GET", "/healthz"))).status == 200
        assert await spoke.closed_by_server()
        assert await never_spoke.closed_by_server()
        await eventually(_async(lambda: not s.connections.open), "connections forgotten")
    finally:
        await stop(s)


async def test_each_answer_moves_the_keep_alive_timeout_on(
    app: App, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection busy with requests a little more often than the timeout
    outlives several timeouts, and is closed no sooner than a whole timeout
    after its last answer (the one armed timer is moved on, not obeyed)."""
    monkeypatch.setattr(wire, "KEEP_ALIVE_S", 0.3)
    s = await start(app)
    try:
        c = await s.client()
        loop = asyncio.get_running_loop()
        started = last_answer = loop.time()
        while last_answer - started < 4 * wire.KEEP_ALIVE_S:
            await asyncio.sleep(wire.KEEP_ALIVE_S / 3)
            assert (await c.request(request_bytes("GET", "/healthz"))).status == 200
            last_answer = loop.time()
        assert await c.closed_by_server()
        assert loop.time() - last_answer >= wire.KEEP_ALIVE_S
    finally:
        await stop(s)


async def test_half_sent_request_is_dropped_at_the_keep_alive_timeout(
    app: App, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wire, "KEEP_ALIVE_S", 0.2)
    s = await start(app)
    try:
        c = await s.client()
        await c.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
        assert await c.closed_by_server()
    finally:
        await stop(s)


async def test_a_request_trickling_in_is_cut_at_the_read_deadline(
    app: App, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each byte resets the idle timer; the read deadline still ends it."""
    monkeypatch.setattr(wire, "REQUEST_READ_S", 0.3)
    s = await start(app)
    try:
        c = await s.client()
        await c.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        for _ in range(40):  # 2 s of one header byte every 50 ms
            try:
                await c.send(b"X")
            except (ConnectionError, OSError):
                break
            await asyncio.sleep(0.05)
        with contextlib.suppress(ConnectionError):  # a write hit the closed socket
            assert await c.closed_by_server()
        assert c.writer.is_closing() or c.reader.at_eof() or c.reader.exception() is not None
    finally:
        await stop(s)


async def test_keep_alive_timeout_does_not_cut_a_parked_waiter(
    app: App, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wire, "KEEP_ALIVE_S", 0.2)
    s = await start(app)
    try:
        key = unique()
        holder = await hold(app, key)
        c = await s.client()
        await c.send(acquire_bytes(key, str(uuid.uuid4()), wait_seconds=30))
        await eventually(lambda: _waiters_are(app, key, 1), "the waiter is in line")
        await asyncio.sleep(5 * wire.KEEP_ALIVE_S)  # several idle timeouts' worth
        await release(app, key, holder)
        reply = await c.reply()
        assert reply.status == 201, reply
        assert "connection" not in reply.headers
    finally:
        await stop(s)


def _async(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()
    return check


async def test_shut_closes_idle_connections_and_lets_a_busy_one_finish(served: Served) -> None:
    key = unique()
    holder = await hold(served.app, key)
    idle = await served.client()
    assert (await idle.request(request_bytes("GET", "/healthz"))).status == 200
    busy = await served.client()
    await busy.send(acquire_bytes(key, str(uuid.uuid4()), wait_seconds=30))
    await eventually(lambda: _waiters_are(served.app, key, 1), "the waiter is in line")
    assert served.connections.busy() == 1

    served.connections.shut()
    assert await idle.closed_by_server()
    await eventually(_async(lambda: len(served.connections.open) == 1),
                     "the idle connection is gone")
    assert served.connections.busy() == 1  # the busy one is still there

    await release(served.app, key, holder)
    reply = await busy.reply()
    assert reply.status == 201, reply
    assert reply.headers.get("connection") == "close"
    assert await busy.closed_by_server()
    await eventually(_async(lambda: not served.connections.open), "all connections closed")


async def test_shut_with_begin_shutdown_answers_the_waiter_503(served: Served) -> None:
    key = unique()
    await hold(served.app, key)
    busy = await served.client()
    await busy.send(acquire_bytes(key, str(uuid.uuid4()), wait_seconds=30))
    await eventually(lambda: _waiters_are(served.app, key, 1), "the waiter is in line")
    served.app.begin_shutdown()
    served.connections.shut()
    reply = await busy.reply()
    assert reply.status == 503, reply
    assert reply.error_code() == "shutting_down"
    assert reply.headers.get("connection") == "close"
    assert await busy.closed_by_server()


async def test_connections_made_after_shut_are_closed(served: Served) -> None:
    served.connections.shut()
    c = await served.client()
    with contextlib.suppress(ConnectionError):
        await c.send(request_bytes("GET", "/healthz"))
    assert await c.closed_by_server()


# --- hostile connections: repeated headers, framing, floods, stalls ---------------------------


@pytest.mark.parametrize("name,values", [
    ("Authorization", [f"Bearer {KEY}", "Bearer fp_wrong"]),
    ("Authorization", ["Bearer fp_wrong", f"Bearer {KEY}"]),
    ("X-Api-Key", [KEY, KEY]),
    ("X-Lock-Token", [str(uuid.uuid4()), str(uuid.uuid4())]),
    ("X-Request-Id", [str(uuid.uuid4()), str(uuid.uuid4())]),
    ("Host", ["a.example", "b.example"]),
], ids=["auth-good-first", "auth-good-last", "api-key", "lock-token", "request-id", "host"])
async def test_a_repeated_single_header_is_400_changes_nothing_and_closes(
    served: Served, name: str, values: list[str],
) -> None:
    key = unique("twice")
    body = b'{"ttl_seconds": 60}'
    lines = [f"PUT /v1/locks/{key}/lease HTTP/1.1"]
    singles = {"Authorization": f"Bearer {KEY}", "Host": "127.0.0.1",
               "X-Lock-Token": str(uuid.uuid4()), "X-Request-Id": str(uuid.uuid4())}
    singles.pop(name, None)
    lines += [f"{n}: {v}" for n, v in singles.items()]
    lines += [f"{name}: {v}" for v in values]
    lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    c = await served.client()
    reply = await c.request(raw + request_bytes("GET", "/healthz"))  # pipelined: never served
    assert reply.status == 400, reply
    assert reply.error_code() == "invalid_request"
    assert name.lower() in reply.json()["error"]["message"].lower()
    assert reply.headers.get("connection") == "close"
    assert await c.closed_by_server()
    assert (await lock_state(served.app, key))["held"] is False


@pytest.mark.parametrize("raw", [
    b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
    b"POST /v1/pools/p/lock/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nX-Api-Key: x\r\n\r\n",
], ids=["content-length-twice", "length-and-chunked", "no-host", "no-host-other-headers"])
async def test_ambiguous_or_hostless_http_1_1_is_400_and_closes(served: Served, raw: bytes) -> None:
    c = await served.client()
    reply = await c.request(raw + request_bytes("GET", "/healthz"))
    assert reply.status == 400, reply
    assert reply.error_code() == "invalid_request"
    assert await c.closed_by_server()


async def test_http_1_0_without_host_is_served(served: Served) -> None:
    c = await served.client()
    reply = await c.request(b"GET /healthz HTTP/1.0\r\n\r\n")
    assert reply.status == 200, reply


async def test_repeated_list_headers_reach_the_app_combined_in_order(app: App) -> None:
    seen: list[Request] = []

    async def handle(request: Request) -> Response:
        seen.append(request)
        return Response(b"")

    s = await start(app, proxies=TrustedProxies(["127.0.0.1"]), handle=handle)
    try:
        c = await s.client()
        raw = (b"GET /x HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 10.1.2.3\r\n"
               b"Accept: a/b\r\nX-Forwarded-For: 198.51.100.7\r\nAccept: c/d\r\n\r\n")
        assert (await c.request(raw)).status == 200
        assert seen[0].headers.get("x-forwarded-for") == "10.1.2.3, 198.51.100.7"
        assert seen[0].headers.get("accept") == "a/b, c/d"
        # The proxy's own (last) line names the caller, not the forged first one.
        assert seen[0].client is not None and seen[0].client.host == "198.51.100.7"
    finally:
        await stop(s)


async def test_line_breaks_alone_do_not_keep_a_connection_open(
    app: App, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wire, "KEEP_ALIVE_S", 0.3)
    s = await start(app)
    try:
        c = await s.client()
        assert (await c.request(request_bytes("GET", "/healthz"))).status == 200
        closed = False
        for _ in range(200):  # 10 s of a line break every 50 ms, far past the timeout
            try:
                await c.send(b"\r\n")
            except (ConnectionError, OSError):
                closed = True
                break
            if c.reader.at_eof():
                closed = True
                break
            await asyncio.sleep(0.05)
        assert closed, "line breaks kept the connection open past the idle timeout"
        await eventually(_async(lambda: not s.connections.open), "connection forgotten")
    finally:
        await stop(s)


async def test_thousands_of_tiny_pipelined_requests_in_one_write_are_answered_in_order(
    served: Served,
) -> None:
    count = 1500
    c = await served.client()
    await c.send(b"".join(
        request_bytes("GET", "/healthz", auth=False, headers={"X-Request-Id": f"r{i}"})
        for i in range(count)))
    for i in range(count):
        reply = await c.reply()
        assert (reply.status, reply.headers["x-request-id"]) == (200, f"r{i}")
        # However much arrived at once, only a few requests wait parsed.
        for connection in served.connections.open:
            assert len(connection._queue) <= wire.MAX_QUEUED < count // 10


async def test_a_client_that_never_reads_holds_bounded_memory_and_is_cut_off(
    app: App, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wire, "SEND_STALL_S", 1.0)
    s = await start(app)
    try:
        document_size = len((await call(app, "GET", "/openapi.json")).body)
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        flood = request_bytes("GET", "/openapi.json", auth=False) * 2000
        writer.write(flood)  # never read an answer
        (connection,) = s.connections.open
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GUARD_S
        worst = 0
        while s.connections.open and loop.time() < deadline:
            transport = connection._transport
            if transport is not None:
                worst = max(worst, transport.get_write_buffer_size())
            assert len(connection._queue) <= wire.MAX_QUEUED
            await asyncio.sleep(0.01)
        assert not s.connections.open, "a client that reads nothing was never cut off"
        high_water = 64 * 1024  # asyncio's default high-water mark for the write buffer
        assert worst <= high_water + 2 * document_size, worst
        writer.close()
    finally:
        await stop(s)


async def test_a_slow_reader_still_gets_every_answer(served: Served) -> None:
    count = 300
    c = await served.client()
    await c.send(request_bytes("GET", "/openapi.json", auth=False) * count)
    await asyncio.sleep(0.2)  # let the server fill the socket and pause
    for _ in range(count):
        assert (await c.reply()).status == 200


@contextlib.asynccontextmanager
async def listening(connections: Connections) -> AsyncIterator[tuple[int, list[Client]]]:
    """A listener for `connections` on a free port, and a list for the test's
    clients; all closed at the end."""
    server = await asyncio.get_running_loop().create_server(
        connections.protocol, "127.0.0.1", 0)
    clients: list[Client] = []
    try:
        yield server.sockets[0].getsockname()[1], clients
    finally:
        for c in clients:
            c.close()
        server.close()
        connections.abort()
        await server.wait_closed()


async def test_connections_over_the_cap_get_503_and_close(app: App) -> None:
    """At the cap with every connection busy (two callers waiting in a lock's
    line), a newcomer is answered 503 and closed: a waiter is never closed to
    make room."""
    connections = Connections(app.handle, app.refuse, TrustedProxies([]), max_connections=2)
    async with listening(connections) as (port, clients):
        clients += [await Client.connect(port) for _ in range(2)]
        await eventually(_async(lambda: len(connections.open) == 2), "two connections held")
        holder = str(uuid.uuid4())
        assert (await clients[0].request(acquire_bytes("capped", holder))).status == 201
        for c in clients:
            await c.send(acquire_bytes("capped", str(uuid.uuid4()), wait_seconds=30))
        await eventually(_async(lambda: all(c.busy for c in connections.open)), "both waiting")
        extra = await Client.connect(port)
        clients.append(extra)
        reply = await extra.reply()
        assert reply.status == 503, reply
        assert reply.error_code() == "too_many_connections"
        assert reply.headers.get("retry-after") == "1"
        assert reply.headers.get("x-request-id")
        assert await extra.closed_by_server()
        # Once one closes, a newcomer is served.
        clients[0].close()
        await eventually(_async(lambda: len(connections.open) == 1), "one connection left")
        newcomer = await Client.connect(port)
        clients.append(newcomer)
        assert (await newcomer.request(request_bytes("GET", "/healthz"))).status == 200


async def test_at_the_cap_the_idlest_connection_makes_room(app: App) -> None:
    connections = Connections(app.handle, app.refuse, TrustedProxies([]), max_connections=2)
    async with listening(connections) as (port, clients):
        idlest = await Client.connect(port)
        clients.append(idlest)
        await eventually(_async(lambda: len(connections.open) == 1), "the first held")
        await asyncio.sleep(0.05)
        recent = await Client.connect(port)
        clients.append(recent)
        assert (await recent.request(request_bytes("GET", "/healthz"))).status == 200
        newcomer = await Client.connect(port)
        clients.append(newcomer)
        assert (await newcomer.request(request_bytes("GET", "/healthz"))).status == 200
        assert await idlest.closed_by_server()
        assert (await recent.request(request_bytes("GET", "/healthz"))).status == 200
        assert len(connections.open) == 2


async def test_one_source_holds_at_most_its_share(app: App) -> None:
    connections = Connections(app.handle, app.refuse, TrustedProxies([]), max_per_source=2)
    async with listening(connections) as (port, clients):
        clients += [await Client.connect(port) for _ in range(2)]
        await eventually(_async(lambda: len(connections.open) == 2), "two connections held")
        extra = await Client.connect(port)
        clients.append(extra)
        reply = await extra.reply()
        assert reply.status == 503 and reply.error_code() == "too_many_connections"
        assert "address" in reply.json()["error"]["message"]
    # A trusted proxy speaks for many clients: no share applies to it.
    trusting = Connections(app.handle, app.refuse, TrustedProxies(["127.0.0.1"]),
                           max_per_source=2)
    async with listening(trusting) as (port, clients):
        clients += [await Client.connect(port) for _ in range(3)]
        for c in clients:
            assert (await c.request(request_bytes("GET", "/healthz"))).status == 200
