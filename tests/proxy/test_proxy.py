"""Proxy mode (SPEC §4.7) against real local upstreams, on both stores: what
crosses the proxy each way, the one gate shared with lock-API callers, the
slot's life, upstream failures, bodies and hostile input."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx
import pytest
from proxy_upstreams import Upstream

from pool_support import acquire, make_pool, pool_state, release
from support import ServerProcess, assert_error, unique_name, wait_until

SECRET = "sk-upstream-secret-0123456789"


def proxied_pool(c: httpx.Client, upstream: Upstream, prefix: str = "",
                 also: dict[str, Any] | None = None, **config: Any) -> str:
    """A pool calling `upstream` (its URL + `prefix`) with the test's managed
    headers, and `also` in its upstream object."""
    upstream_config = {"base_url": upstream.url + prefix,
                       "headers": {"Authorization": f"Bearer {SECRET}", "X-Org": "acme"}}
    upstream_config.update(also or {})
    return make_pool(c, upstream=upstream_config, **config)


def proxy(pool: str, path: str) -> str:
    return f"/v1/pools/{pool}/proxy/{path}"


def header_values(pairs: list[list[str]], name: str) -> list[str]:
    return [value for key, value in pairs if key.lower() == name.lower()]


def test_a_call_reaches_the_upstream_with_the_pools_credentials_not_the_callers(
        server: ServerProcess, upstream: Upstream) -> None:
    with server.client() as c:
        pool = proxied_pool(c, upstream, prefix="/v1")
        resp = c.post(proxy(pool, "echo/chat/completions?model=m&x=1"),
                      content=b'{"prompt": "hi"}',
                      headers={"Content-Type": "application/json", "X-Trace": "t-1",
                               "X-Api-Key": "fp_not_for_upstream", "Connection": "X-Private",
                               "X-Private": "hop", "X-Forwarded-For": "10.1.2.3",
                               "X-Queue-Timeout-Ms": "500"})
    assert resp.status_code == 200, resp.text
    seen = resp.json()
    assert seen["method"] == "POST"
    assert seen["path"] == "/v1/echo/chat/completions?model=m&x=1"
    assert seen["body"] == '{"prompt": "hi"}'
    sent = seen["headers"]
    # The pool's managed headers replace the caller's credentials; the caller's
    # end-to-end headers go on; fencepost's own and hop-by-hop ones do not.
    assert header_values(sent, "Authorization") == [f"Bearer {SECRET}"]
    assert header_values(sent, "X-Org") == ["acme"]
    assert header_values(sent, "X-Trace") == ["t-1"]
    assert header_values(sent, "Content-Type") == ["application/json"]
    for own in ("X-Api-Key", "X-Private", "X-Forwarded-For", "X-Queue-Timeout-Ms",
                "X-Request-Id"):
        assert header_values(sent, own) == [], own
    assert header_values(sent, "Host") == [f"127.0.0.1:{upstream.port}"]
    # The answer: the upstream's headers (both Set-Cookie lines), its request
    # ID kept under another name, fencepost's own beside them.
    assert resp.headers.get_list("set-cookie") == ["a=1", "b=2"]
    assert resp.headers["x-upstream-request-id"] == "upstream-req-1"
    assert resp.headers["x-request-id"] != "upstream-req-1"
    assert int(resp.headers["x-queued-ms"]) >= 0
    assert resp.headers["x-effective-limit"] == "2"


def test_the_credentials_are_write_only(server: ServerProcess, upstream: Upstream) -> None:
    with server.client() as c:
        pool = proxied_pool(c, upstream)
        shown = c.get(f"/v1/pools/{pool}").json()["upstream"]
        assert shown == {"base_url": upstream.url, "headers": ["Authorization", "X-Org"],
                         "timeout_ms": 60000}
        listed = c.get("/v1/pools", params={"prefix": pool}).text
        patched = c.patch(f"/v1/pools/{pool}", json={"upstream": {"timeout_ms": 5000}})
        assert patched.status_code == 200, patched.text
        assert patched.json()["upstream"]["headers"] == ["Authorization", "X-Org"]
        assert c.get(proxy(pool, "echo")).status_code == 200  # still sent after the PATCH
        bad = c.put(f"/v1/pools/{pool}", json={"limit": 1, "upstream": {
            "base_url": upstream.url, "headers": {"Authorization": SECRET + "\r\nX-Evil: 1"}}})
        assert bad.status_code == 422
    for text in (json.dumps(shown), listed, patched.text, bad.text,
                 server.access_log.read_text(), server.stderr_path.read_text()):
        assert SECRET not in text
    assert header_values(upstream.seen[-1]["headers"], "Authorization") == [f"Bearer {SECRET}"]


def test_a_proxied_call_and_a_held_slot_share_one_limit(
        server: ServerProcess, upstream: Upstream) -> None:
    with server.client() as c:
        pool = proxied_pool(c, upstream, limit=1, queue_timeout_ms=10_000)
        held = acquire(c, pool).json()["slot_id"]  # a lock-API caller holds the only slot
        busy = c.get(proxy(pool, "echo"), headers={"X-No-Queue": "1"})
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "too_many_requests"
        waited = c.get(proxy(pool, "echo"), headers={"X-Queue-Timeout-Ms": "300"})
        assert waited.status_code == 504 and waited.json()["error"]["code"] == "queue_timeout"
        # A proxied call waiting in line gets the slot when the holder lets go.
        answer: dict[str, httpx.Response] = {}
        waiter = threading.Thread(target=lambda: answer.setdefault(
            "r", c.get(proxy(pool, "echo"), headers={"X-Queue-Timeout-Ms": "8000"})))
        waiter.start()
        wait_until(lambda: pool_state(c, pool)["queued"] == 1, "the proxied call to queue")
        assert release(c, pool, held).status_code == 200
        waiter.join(10)
        assert answer["r"].status_code == 200
        # And a slow proxied call holds the slot while it runs.
        slow: dict[str, httpx.Response] = {}
        caller = threading.Thread(target=lambda: slow.setdefault(
            "r", c.get(proxy(pool, "slow?ms=1500"))))
        caller.start()
        wait_until(lambda: pool_state(c, pool)["in_use"] == 1, "the proxied call to hold")
        refused = acquire(c, pool, headers={"X-No-Queue": "1"})
        assert refused.status_code == 429
        caller.join(10)
        assert slow["r"].status_code == 200 and slow["r"].text == "slow answer"
        assert pool_state(c, pool)["in_use"] == 0  # released when the answer ended


def test_a_caller_that_leaves_mid_stream_frees_its_slot_at_once(
        server: ServerProcess) -> None:
    upstream = Upstream()
    try:
        with server.client() as c:
            pool = proxied_pool(c, upstream, limit=1, term_ms=60_000)
            with c.stream("GET", proxy(pool, "stream?chunks=200&delay_ms=50")) as resp:
                assert resp.status_code == 200
                assert resp.headers["content-type"] == "text/event-stream"
                chunks = resp.iter_raw()  # kept: a dropped iterator closes the answer
                assert next(chunks).startswith(b"data: 0")
                assert pool_state(c, pool)["in_use"] == 1
            # The connection is gone (httpx closes it on leaving the block):
            # the slot is free long before its 60 s term, and the upstream is
            # no longer read.
            left = time.monotonic()
            wait_until(lambda: pool_state(c, pool)["in_use"] == 0, "the slot to be freed",
                       timeout=5)
            assert time.monotonic() - left < 5
            assert upstream.stream_ended.wait(10), "the upstream kept streaming to nobody"
            assert upstream.streamed_chunks < 200
    finally:
        upstream.close()


def test_a_whole_stream_arrives_chunk_by_chunk(server: ServerProcess, upstream: Upstream) -> None:
    with server.client() as c:
        pool = proxied_pool(c, upstream)
        arrived: list[float] = []
        with c.stream("GET", proxy(pool, "stream?chunks=5&delay_ms=200")) as resp:
            body = b""
            for chunk in resp.iter_raw():
                arrived.append(time.monotonic())
                body += chunk
        assert body == b"".join(f"data: {n}\n\n".encode() for n in range(5))
        # Passed on as they came, not gathered: the first chunk came long before the last.
        assert arrived[-1] - arrived[0] >= 0.5


def test_upstream_failures_are_502_and_504_and_count_as_outcomes(
        server: ServerProcess, upstream: Upstream) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    with server.client() as c:
        pool = proxied_pool(c, upstream, also={"timeout_ms": 300})
        dropped = c.get(proxy(pool, "drop"))
        assert dropped.status_code == 502, dropped.text
        assert dropped.json()["error"]["code"] == "upstream_unavailable"
        slow = c.get(proxy(pool, "slow?ms=3000"))
        assert slow.status_code == 504, slow.text
        assert slow.json()["error"]["code"] == "upstream_timeout"
        nowhere = make_pool(c, upstream={"base_url": f"http://127.0.0.1:{port}"})
        refused = c.get(proxy(nowhere, "x"))
        assert refused.status_code == 502
        assert "refused" in refused.json()["error"]["message"]
        stats = pool_state(c, pool)["stats"]
        assert stats["statuses"]["5xx"] == 2 and pool_state(c, pool)["in_use"] == 0
        for resp in (dropped, slow, refused):
            assert SECRET not in resp.text


def test_redirects_and_statuses_are_passed_back(server: ServerProcess, upstream: Upstream) -> None:
    with server.client() as c:
        pool = proxied_pool(c, upstream)
        moved = c.get(proxy(pool, "redirect"))
        assert moved.status_code == 302 and moved.headers["location"] == "/elsewhere"
        assert [r for r in upstream.seen if r["path"].startswith("/elsewhere")] == []
        gone = c.delete(proxy(pool, "status?code=404"))
        assert gone.status_code == 404 and gone.text == "status"
        head = c.head(proxy(pool, "big?bytes=5000"))
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-length"] == "5000"
        no_content = c.put(proxy(pool, "status?code=204"), content=b"x")
        assert no_content.status_code == 204
        stats = pool_state(c, pool)["stats"]["statuses"]
        assert stats["3xx"] == 1 and stats["4xx"] == 1 and stats["2xx"] >= 2


def test_bodies_stream_both_ways_within_max_body_bytes(
        server: ServerProcess, upstream: Upstream) -> None:
    with server.client() as c:
        pool = proxied_pool(c, upstream, max_body_bytes=3 * 2**20)
        big = b"abcdefgh" * (2 * 2**20 // 8)  # 2 MiB: past the §2 64 KiB body cap
        sent = c.post(proxy(pool, "echo"), content=big)
        assert sent.status_code == 200, sent.text
        assert len(sent.json()["body"]) == len(big)

        def chunked() -> Any:
            for _ in range(8):
                yield b"y" * 100_000

        streamed = c.post(proxy(pool, "echo"), content=chunked())
        assert streamed.status_code == 200 and streamed.json()["body"] == "y" * 800_000
        answer = c.get(proxy(pool, "big?bytes=2500000"))
        assert answer.status_code == 200 and len(answer.content) == 2_500_000

        over = c.post(proxy(pool, "echo"), content=b"z" * (3 * 2**20 + 1))
        assert over.status_code == 413 and over.json()["error"]["code"] == "payload_too_large"

        def too_much() -> Any:
            for _ in range(40):
                yield b"w" * 100_000

        over_chunked = c.post(proxy(pool, "echo"), content=too_much())
        assert over_chunked.status_code == 413
        too_big_answer = c.get(proxy(pool, "big?bytes=4000000"))
        assert too_big_answer.status_code == 502
        assert pool_state(c, pool)["in_use"] == 0


def test_an_adaptive_pool_learns_from_proxied_answers_alone(server: ServerProcess) -> None:
    upstream = Upstream(capacity=3, window_s=2.0)
    try:
        with server.client() as c:
            pool = proxied_pool(c, upstream, limit=20, adaptive=True)
            answers = [c.post(proxy(pool, "limited")) for _ in range(6)]
            # The upstream's rate headers on the first answers (3 a window, none
            # left) reached the pool's governor with no report from anyone: it
            # paces the rest itself, so the upstream never has to say 429.
            assert [a.status_code for a in answers[:3]] == [200, 200, 200]
            paced = answers[3:]
            assert all(a.status_code == 429 for a in paced), [a.text for a in paced]
            assert all(a.json()["error"]["code"] == "too_many_requests" for a in paced)
            assert all("retry-after" in a.headers for a in paced)
            state = pool_state(c, pool)
            assert state["learned"]["effective_rpm"] is not None, state["learned"]
            assert state["stats"]["statuses"]["2xx"] == 3 and state["stats"]["status_429"] == 0
            assert len([r for r in upstream.seen if "limited" in r["path"]]) == 3
    finally:
        upstream.close()


def test_the_upstreams_429_counts_as_a_throttle(server: ServerProcess,
                                                upstream: Upstream) -> None:
    with server.client() as c:
        pool = proxied_pool(c, upstream, limit=5, adaptive=True)
        refused = c.get(proxy(pool, "status?code=429&header=retry-after:1"))
        assert refused.status_code == 429 and refused.text == "status"  # the upstream's own
        state = pool_state(c, pool)
        assert state["stats"]["status_429"] == 1 and state["stats"]["throttled"] == 1
        assert state["learned"]["last_hint"] is not None


@pytest.mark.parametrize(("raw", "status"), [
    (b"/v1/pools/{pool}/proxy/../../keys", 400),
    (b"/v1/pools/{pool}/proxy/echo/%2e%2e/%2E%2E/keys", 400),
    (b"/v1/pools/{pool}/proxy/echo/./x", 400),
])
def test_dot_segments_never_reach_the_upstream(
        server: ServerProcess, upstream: Upstream, raw: bytes, status: int) -> None:
    with server.client() as c:
        pool = proxied_pool(c, upstream)
    before = len(upstream.seen)
    answer = _raw_request(server, b"GET " + raw.replace(b"{pool}", pool.encode()) +
                          b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                          server.admin_key.encode() + b"\r\nConnection: close\r\n\r\n")
    assert answer.startswith(f"HTTP/1.1 {status}".encode()), answer[:200]
    assert len(upstream.seen) == before


def test_smuggling_attempts_are_refused(server: ServerProcess, upstream: Upstream) -> None:
    with server.client() as c:
        pool = proxied_pool(c, upstream)
    before = len(upstream.seen)
    auth = b"Authorization: Bearer " + server.admin_key.encode() + b"\r\n"
    both = _raw_request(server, b"POST /v1/pools/" + pool.encode() + b"/proxy/echo HTTP/1.1\r\n"
                        b"Host: x\r\n" + auth + b"Content-Length: 4\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n")
    assert both.startswith(b"HTTP/1.1 400"), both[:200]
    bad_header = _raw_request(server, b"GET /v1/pools/" + pool.encode() + b"/proxy/echo "
                              b"HTTP/1.1\r\nHost: x\r\n" + auth + b"X-A: b\rX-B: c\r\n\r\n")
    assert bad_header.startswith(b"HTTP/1.1 400"), bad_header[:200]
    assert len(upstream.seen) == before


def _raw_request(server: ServerProcess, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(data)
        out = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            out += chunk
            if b"\r\n\r\n" in out and b"connection: close" in out.lower():
                break
        return out


@pytest.mark.parametrize(("upstream_config", "field"), [
    ({"base_url": "ftp://127.0.0.1/x"}, "upstream.base_url"),
    ({"base_url": "http://user:pw@127.0.0.1/x"}, "upstream.base_url"),
    ({"base_url": "http://127.0.0.1/x?key=1"}, "upstream.base_url"),
    ({"base_url": "http://127.0.0.1/a/../b"}, "upstream.base_url"),
    ({"base_url": "not a url"}, "upstream.base_url"),
    ({"base_url": "http://127.0.0.1", "headers": {"Host": "evil"}}, "upstream.headers"),
    ({"base_url": "http://127.0.0.1", "headers": {"Transfer-Encoding": "chunked"}},
     "upstream.headers"),
    ({"base_url": "http://127.0.0.1", "headers": {"X-A": "1", "x-a": "2"}}, "upstream.headers"),
    ({"base_url": "http://127.0.0.1", "headers": {"Bad Name": "1"}}, "upstream.headers"),
    ({"base_url": "http://127.0.0.1", "timeout_ms": 0}, "upstream.timeout_ms"),
    ({"headers": {}}, "upstream.base_url"),
])
def test_bad_upstreams_are_422_and_change_nothing(
        server: ServerProcess, upstream_config: dict[str, Any], field: str) -> None:
    with server.client() as c:
        name = unique_name("badup")
        resp = c.put(f"/v1/pools/{name}", json={"limit": 1, "upstream": upstream_config})
        assert resp.status_code == 422, resp.text
        fields = [d.get("field", "") for d in resp.json()["error"].get("details", [])]
        assert any(f.startswith(field) for f in fields), (fields, resp.text)
        assert c.get(f"/v1/pools/{name}").status_code == 404


def test_who_may_call_and_what_is_not_found(server: ServerProcess, upstream: Upstream) -> None:
    reader = server.create_key("reader")["key"]
    with server.client() as c:
        pool = proxied_pool(c, upstream)
        plain = make_pool(c)
        assert c.get(proxy("no-such-pool", "echo")).status_code == 404
        no_upstream = c.get(proxy(plain, "echo"))
        assert no_upstream.status_code == 404 and "no upstream" in no_upstream.text
        assert pool_state(c, plain)["in_use"] == 0  # the slot it took went back
        assert c.request("TRACE", proxy(pool, "echo")).status_code == 405
    with server.client(reader) as r:
        assert r.get(proxy(pool, "echo")).status_code == 403
    with httpx.Client(base_url=server.base_url) as anonymous:
        assert anonymous.get(proxy(pool, "echo")).status_code == 401


def test_a_caller_that_never_reads_holds_its_slot_no_longer_than_the_pools_cap(
        server: ServerProcess, upstream: Upstream) -> None:
    with server.client() as c:
        pool = proxied_pool(c, upstream, limit=1, term_ms=1000, request_timeout_ms=2000,
                            renew_interval_ms=300)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(f"GET /v1/pools/{pool}/proxy/big?bytes=8000000 HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: Bearer {server.admin_key}\r\n\r\n".encode())
        with server.client() as c:
            wait_until(lambda: pool_state(c, pool)["in_use"] == 1, "the call to be admitted")
            started = time.monotonic()
            # Never read: the server cannot send, and the slot's cap ends the call.
            wait_until(lambda: pool_state(c, pool)["in_use"] == 0, "the slot to be freed",
                       timeout=10)
            assert time.monotonic() - started < 5
            assert c.get(proxy(pool, "echo")).status_code == 200  # the pool serves on
        # (What the kernel had already taken of the answer still trickles out
        # at the reader's pace after the server lets go: not drained here.)


def test_x_cost_spends_the_pool_s_unit_budget(server: ServerProcess, upstream: Upstream) -> None:
    """SPEC §4.6/§4.7: X-Cost is the call's cost; the answer says what is left,
    the budget paces proxied calls as it paces slots, and the header never
    reaches the upstream."""
    with server.client() as c:
        pool = proxied_pool(c, upstream, limit=50, cost_per_minute=60_000)
        first = c.post(proxy(pool, "echo"), headers={"X-Cost": "1000"}, content=b"{}")
        assert first.status_code == 200, first.text
        assert int(first.headers["x-remaining-cost"]) <= 59_000
        assert not header_values(first.json()["headers"], "X-Cost")
        assert c.post(proxy(pool, "echo"), headers={"X-Cost": "1000"}).status_code == 200
        refused = c.post(proxy(pool, "echo"), headers={"X-Cost": "1000"})
        assert_error(refused, 429)
        for bad in ("-1", "1.5", "lots", "1000000001"):
            assert_error(c.post(proxy(pool, "echo"), headers={"X-Cost": bad}), 400)
