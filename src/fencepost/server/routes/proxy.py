"""Proxy mode (SPEC §4.7): `/v1/pools/{pool}/proxy/{path}` takes a slot of the
pool exactly as an acquire does (routes/pools.py's line, shared with callers
of the lock API), calls the pool's upstream with the caller's request, streams
the answer back, and releases the slot when the answer ends, reporting the
upstream's status and rate headers, so an adaptive pool learns from proxied
calls with no report from anyone.

Life of a call: admitted (or refused, 429/504, as an acquire) -> checked
(the pool has an upstream; the declared body fits max_body_bytes) -> sent
(the request body streams from the caller's connection) -> answered (status
and headers within the upstream's timeout_ms, else 504; unreachable, 502) ->
relayed (the body streams to the caller, bounded by the slot's request
deadline) -> released. The slot is renewed meanwhile, and released at once
when the caller leaves at any point.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from fencepost.clock import wall_clock_ms
from fencepost.core.costs import MAX_COST
from fencepost.core.proxy_headers import (
    caller_response_headers,
    has_dot_segment,
    upstream_request_headers,
)
from fencepost.core.ratelimit_headers import parse_rate_limit_headers
from fencepost.core.slots import PoolConfig, Slot, Upstream
from fencepost.errors import (
    Capped,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from fencepost.server.context import Call
from fencepost.server.messages import BodyStalled, BodyStream, Request, StreamingResponse
from fencepost.server.routes.pools import SlotLine, wanted_wait
from fencepost.server.waiting import ClientGone, wait_for_grant
from fencepost.store.base import SlotAttempt, SlotReport, Store

if TYPE_CHECKING:
    import aiohttp

_log = logging.getLogger(__name__)

# A streamed request body may pause this long between chunks, like the head
# and body of any request (wire.REQUEST_READ_S).
BODY_IDLE_S = 30.0
# "/v1/pools/{pool}/proxy" then the path the upstream gets, as sent.
_TAIL = re.compile(r"^/v1/pools/[^/]+/proxy(?P<tail>/.*)?\Z", re.DOTALL)
_BODYLESS_STATUSES = frozenset({204, 304})


def streams_body(url: bytes) -> bool:
    """Whether a request target is a proxied call, whose body streams to the
    route (wire.Connections.streams_body): decided on the raw target, before
    the head is whole."""
    return _STREAMED.match(url) is not None


# The raw target: origin form, or absolute form ("http://host/v1/...").
_STREAMED = re.compile(rb"^(?:[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*)?/v1/pools/[^/?#]+/proxy(?:[/?]|\Z)")


def upstream_tail(raw_path: str) -> str:
    """The path after ".../proxy", as the caller sent it (percent-encoding kept)."""
    match = _TAIL.match(raw_path)
    return (match.group("tail") or "") if match else ""


async def forward(call: Call[None]) -> StreamingResponse:
    svc, caller, request = call.services, call.caller, call.request
    pool = call.params["pool"]
    tail = upstream_tail(request.raw_path)
    if has_dot_segment(tail):
        raise InvalidRequest('The proxied path may not have "." or ".." segments.')
    wanted_ms, no_queue = wanted_wait(call.params, None)
    line = SlotLine(svc.store, caller.project, pool, caller.key_id, wanted_ms, no_queue,
                    None, call.acquire_log, declared_cost(call.params))
    asked_s = 0 if no_queue else max(0, wanted_ms) / 1000  # at most this; the try clamps it
    admitted = await wait_for_grant(svc.waiters, line, asked_s, request.gone)
    queued_ms = call.acquire_log.elapsed_ms  # the wait for a slot, not the upstream's time
    assert admitted.slot is not None
    held = _Held(svc.store, caller.project, pool, admitted.slot, admitted.config)
    response = None
    try:
        upstream = _checked(admitted.config, request, pool)
        refusal = await svc.upstreams.refusal(upstream.base_url)
        if refusal is not None:
            raise UpstreamUnavailable(f"The pool's upstream may not be called: {refusal}.")
        outgoing = _outgoing(request, upstream, tail, admitted.config.max_body_bytes)
        held.start(await svc.store.now_ms())
        response = await _send(svc.upstreams.session, outgoing, upstream, held, request.gone)
        return _relay(call, response, held, admitted, queued_ms)
    except BaseException as error:
        if response is not None:
            _close_quietly(response)
        await held.end(_report_of_failure(error))
        raise


def declared_cost(params: dict[str, str]) -> int | None:
    """X-Cost: the units the call will spend of the pool's budget (SPEC §4.6, §4.7)."""
    value = params.get("x-cost")
    if value is None:
        return None
    if int(value) > MAX_COST:
        raise InvalidRequest(f"X-Cost must be at most {MAX_COST}.",
                             details=[{"field": "X-Cost", "message": "out of range"}])
    return int(value)


def _checked(config: PoolConfig, request: Request, pool: str) -> Upstream:
    upstream = config.upstream
    if upstream is None:
        raise NotFound(f"The pool {pool!r} has no upstream: set one (PUT or PATCH the pool's "
                       "upstream) to use proxy mode.")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > config.max_body_bytes:
        raise PayloadTooLarge(f"The request body is over this pool's max_body_bytes "
                              f"({config.max_body_bytes}).")
    return upstream


class _BodyTooLarge(Exception):
    """A chunked request body grew past the pool's max_body_bytes."""


class _Body:
    """A streamed request body on its way to the upstream, bounded by the
    pool's max_body_bytes. The HTTP client wraps what the body raises in an
    error of its own, so the body keeps why it stopped (`failure`)."""

    def __init__(self, stream: BodyStream, limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self.failure: Exception | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        try:
            async for chunk in self._stream.chunks(BODY_IDLE_S):
                total += len(chunk)
                if total > self._limit:
                    raise _BodyTooLarge()
                yield chunk
        except (_BodyTooLarge, BodyStalled) as error:
            self.failure = error
            raise


class _Outgoing(NamedTuple):
    """The request proxy mode sends: its target as the caller wrote it
    (percent-encoding kept), headers in order, and the body (streamed, whole,
    or none)."""

    method: str
    url: str
    headers: list[tuple[str, str]]
    body: _Body | bytes | None


def _outgoing(request: Request, upstream: Upstream, tail: str, limit: int) -> _Outgoing:
    url = upstream.base_url + tail
    if request.query_string:
        url += "?" + request.query_string
    headers = upstream_request_headers(request.header_list or request.headers.items(),
                                       upstream.headers)
    body: _Body | bytes | None = None
    declared = request.headers.get("content-length")
    stream = request.body_stream
    if stream is None:
        # A request the connection read whole (its target named the proxy
        # route only once decoded, such as ".../%70roxy/..."): the body is here.
        if request.body or declared is not None:
            headers.append(("Content-Length", str(len(request.body))))
            body = request.body
    elif declared is not None:
        headers.append(("Content-Length", declared))  # the body as the caller framed it
        body = _Body(stream, limit) if declared != "0" else b""
    elif request.headers.get("transfer-encoding") is not None:
        body = _Body(stream, limit)  # chunked on to the upstream
    return _Outgoing(request.method, url, headers, body)


async def _send(
    session: aiohttp.ClientSession, outgoing: _Outgoing, upstream: Upstream, held: _Held,
    gone: asyncio.Event,
) -> aiohttp.ClientResponse:
    """The upstream's answer (status and headers; the body follows), racing the
    caller's departure and the timeout (the pool's timeout_ms, within the
    slot's life)."""
    import aiohttp
    import yarl

    try:
        # encoded=True: the path and query go as the caller wrote them, not
        # re-quoted (an upstream may tell %2F from /).
        url = yarl.URL(outgoing.url, encoded=True)
    except (ValueError, TypeError) as error:
        raise InvalidRequest("The proxied path or query cannot be sent on as a URL.") from error
    timeout_s = min(upstream.timeout_ms / 1000, held.seconds_left())
    sending = asyncio.ensure_future(session.request(
        outgoing.method, url, headers=outgoing.headers, data=outgoing.body,
        allow_redirects=False, skip_auto_headers=_NOT_ADDED, compress=None))
    leaving = asyncio.ensure_future(gone.wait())
    try:
        done, _ = await asyncio.wait((sending, leaving), timeout=timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        leaving.cancel()
    if sending in done:
        try:
            return sending.result()
        except (aiohttp.ClientError, OSError, ValueError, _BodyTooLarge, BodyStalled) as error:
            failure = outgoing.body.failure if isinstance(outgoing.body, _Body) else None
            if isinstance(failure, _BodyTooLarge):
                raise PayloadTooLarge("The request body is over this pool's max_body_bytes.") \
                    from None
            if isinstance(failure, BodyStalled):
                raise InvalidRequest(f"The request body did not arrive: {failure}.") from None
            raise UpstreamUnavailable(_unavailable_message(error)) from None
    sending.cancel()
    with contextlib.suppress(BaseException):
        await sending
    if leaving in done or gone.is_set():
        raise ClientGone()
    raise UpstreamTimeout(f"The upstream did not answer within {int(timeout_s * 1000)} ms.")


# Headers the HTTP client would add by itself: a proxy sends the caller's own
# (when the caller sent one, it goes on as sent).
_NOT_ADDED = frozenset({"User-Agent", "Accept", "Accept-Encoding", "Content-Type"})


def _unavailable_message(error: Exception) -> str:
    """What went wrong, for the caller: the kind of failure, never a header."""
    import aiohttp

    if isinstance(error, aiohttp.ClientSSLError | aiohttp.ServerFingerprintMismatch):
        return "The upstream's TLS certificate could not be verified."
    if isinstance(error, aiohttp.ClientConnectorError):
        return "The upstream refused the connection or could not be reached."
    if isinstance(error, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError
                  | aiohttp.ClientResponseError):
        return "The upstream broke off or answered with invalid HTTP."
    return "The upstream could not be reached."


def _report_of_failure(error: BaseException) -> SlotReport | None:
    """A failed call's outcome for the pool: 502 and 504 count (SPEC §4.7),
    a call that never reached the upstream does not."""
    if isinstance(error, UpstreamTimeout):
        return SlotReport(status=504, report_json='{"status": 504, "source": "proxy"}')
    if isinstance(error, UpstreamUnavailable):
        return SlotReport(status=502, report_json='{"status": 502, "source": "proxy"}')
    return None


def _relay(
    call: Call[None], response: aiohttp.ClientResponse, held: _Held, admitted: SlotAttempt,
    queued_ms: int,
) -> StreamingResponse:
    request, log = call.request, call.acquire_log
    config = admitted.config
    pairs = [(name.decode("latin-1"), value.decode("latin-1"))
             for name, value in response.raw_headers]
    length = _declared_length(pairs)
    status = response.status
    bodyless = request.method == "HEAD" or status in _BODYLESS_STATUSES or status < 200
    if not bodyless and length is not None and length > config.max_body_bytes:
        raise UpstreamUnavailable(f"The upstream's answer ({length} bytes) is over this pool's "
                                  f"max_body_bytes ({config.max_body_bytes}).")
    headers = caller_response_headers(pairs)
    headers.append(("x-queued-ms", str(queued_ms)))
    headers.append(("x-effective-limit", str(admitted.effective_limit)))
    if admitted.remaining_cost is not None:
        headers.append(("x-remaining-cost", str(admitted.remaining_cost)))
    assert held.slot is not None
    log.write("granted", status, waited_ms=queued_ms,
              slot_id_prefix=held.slot.slot_id[:9], upstream_status=status)
    held.outcome = _report(status, pairs)
    body = _answer_body(response, held, config.max_body_bytes, bodyless, length)
    # The slot's hard cap bounds the whole answer, however slowly the caller reads.
    return StreamingResponse(status, headers, body, length, bodyless,
                             deadline=held.deadline_loop_s)


def _declared_length(pairs: list[tuple[str, str]]) -> int | None:
    """The answer's Content-Length, when it is framed by one."""
    length = None
    for name, value in pairs:
        lower = name.lower()
        if lower == "transfer-encoding":
            return None
        if lower == "content-length" and value.strip().isdigit():
            length = int(value.strip())
    return length


def _report(status: int, pairs: list[tuple[str, str]]) -> SlotReport:
    """The outcome as a holder would report it (SPEC §4.4), read off the answer."""
    folded: dict[str, str] = {}
    for name, value in pairs:
        key = name.lower()
        folded[key] = f"{folded[key]}, {value}" if key in folded else value
    # Absolute times in rate headers (an HTTP date, an RFC 3339 reset) are
    # read against the time the answer came.
    rate = parse_rate_limit_headers(folded, wall_clock_ms())
    throttled = 1 if status == 429 else 0
    return SlotReport(
        status=status, throttled=throttled, retry_after_ms=rate.retry_after_ms,
        rate=None if rate.is_empty() else rate,
        report_json=msgspec.json.encode(
            {"status": status, "throttled": throttled, "source": "proxy"}).decode(),
    )


async def _answer_body(
    response: aiohttp.ClientResponse, held: _Held, limit: int, bodyless: bool,
    length: int | None,
) -> AsyncIterator[bytes]:
    """The upstream's body as it comes, bytes as sent (compressed stays
    compressed); the slot is released when it ends, however it ends (the
    connection ends it at the slot's request deadline at the latest)."""
    sent = 0
    whole = False
    try:
        if bodyless:
            whole = True
            return
        async for chunk in response.content.iter_any():
            sent += len(chunk)
            if sent > limit:
                raise UpstreamUnavailable("The upstream's answer is over max_body_bytes.")
            if sent == length:
                # The whole answer is here: the slot goes back before its last
                # bytes go out, so a caller that has read it all finds it free.
                await held.end(held.outcome)
            yield chunk
        whole = True
    finally:
        if whole:
            response.release()  # the connection goes back to the pool, for the next call
        else:
            _close_quietly(response)
        await held.end(held.outcome)


def _close_quietly(response: aiohttp.ClientResponse) -> None:
    """Drop the answer and its connection (a body cut off cannot be reused)."""
    with contextlib.suppress(Exception):
        response.close()


class _Held:
    """The slot a proxied call holds: renewed while the call runs, released
    once (with the call's outcome) however the call ends."""

    def __init__(
        self, store: Store, project: str, pool: str, slot: Slot, config: PoolConfig,
    ) -> None:
        self._store = store
        self._project = project
        self._pool = pool
        self.slot: Slot | None = slot
        self._config = config
        self._renewing: asyncio.Task[None] | None = None
        self.outcome: SlotReport | None = None
        self.deadline_loop_s = asyncio.get_running_loop().time() + \
            config.request_timeout_ms / 1000

    def start(self, now_ms: int) -> None:
        """Renew from now on; the slot's hard cap in the loop's time."""
        assert self.slot is not None
        left_s = max(0.0, (self.slot.request_deadline_ms - now_ms) / 1000)
        self.deadline_loop_s = asyncio.get_running_loop().time() + left_s
        self._renewing = asyncio.ensure_future(self._renew_forever())

    def seconds_left(self) -> float:
        return max(0.001, self.deadline_loop_s - asyncio.get_running_loop().time())

    async def _renew_forever(self) -> None:
        interval_s = self._config.suggested_renew_interval_ms / 1000
        while self.slot is not None:
            await asyncio.sleep(interval_s)
            slot = self.slot
            if slot is None:
                return
            try:
                await self._store.renew_slot(self._project, self._pool, slot.slot_id)
            except (Capped, NotFound):
                return  # at its hard cap (the body's deadline ends the call), or gone
            except Exception as error:  # noqa: BLE001 - a store hiccup: try next time
                _log.warning("renewing a proxied call's slot failed: %s", error)

    async def end(self, report: SlotReport | None) -> None:
        """Release the slot (once). Shielded: a caller that leaves cancels the
        call, and the release must still happen."""
        slot, self.slot = self.slot, None
        if self._renewing is not None:
            self._renewing.cancel()
        if slot is None:
            return
        release = asyncio.ensure_future(
            self._store.release_slot(self._project, self._pool, slot.slot_id, report))
        try:
            await asyncio.shield(release)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the slot ends at its term anyway
            _log.warning("releasing a proxied call's slot failed: %s", error)
