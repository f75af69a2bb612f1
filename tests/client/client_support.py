"""Helpers for the Python client's tests: an httpx transport that records every
request and injects faults (lost answers, refused connections, error answers)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from fencepost.client import Retries

FAST_RETRIES = Retries(attempts=4, budget_s=10, initial_s=0.05, max_backoff_s=0.2)


@dataclass
class Fault:
    """Inject `action` into the next `times` requests matching `method` and `path_part`:
    `lose_answer` forwards the request, then fails as if the answer never came;
    `refuse` fails before anything is sent; an `httpx.Response` is answered instead."""

    method: str
    path_part: str
    action: str | httpx.Response
    times: int = 1

    def matches(self, request: httpx.Request) -> bool:
        return (self.times > 0 and request.method == self.method
                and self.path_part in request.url.path)


@dataclass
class Recorder:
    """Every request seen: (monotonic time, method, path)."""

    seen: list[tuple[float, str, str]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, request: httpx.Request) -> Fault | None:
        with self.lock:
            self.seen.append((time.monotonic(), request.method, request.url.path))
            for fault in self.faults:
                if fault.matches(request):
                    fault.times -= 1
                    return fault
        return None

    def count(self, method: str, path_part: str = "", since: float = 0.0) -> int:
        with self.lock:
            return sum(1 for t, m, p in self.seen if m == method and path_part in p and t >= since)


class FaultyTransport(httpx.BaseTransport):
    def __init__(self, recorder: Recorder) -> None:
        self.inner = httpx.HTTPTransport()
        self.recorder = recorder

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        fault = self.recorder.note(request)
        if fault is not None and isinstance(fault.action, httpx.Response):
            return fault.action
        if fault is not None and fault.action == "refuse":
            raise httpx.ConnectError("injected: connection refused", request=request)
        response = self.inner.handle_request(request)
        if fault is not None and fault.action == "lose_answer":
            response.read()
            response.close()
            raise httpx.ReadError("injected: the answer was lost", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


class AsyncFaultyTransport(httpx.AsyncBaseTransport):
    def __init__(self, recorder: Recorder) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.recorder = recorder

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        fault = self.recorder.note(request)
        if fault is not None and isinstance(fault.action, httpx.Response):
            return fault.action
        if fault is not None and fault.action == "refuse":
            raise httpx.ConnectError("injected: connection refused", request=request)
        response = await self.inner.handle_async_request(request)
        if fault is not None and fault.action == "lose_answer":
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("injected: the answer was lost", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def error_response(status: int, code: str, **extra: Any) -> httpx.Response:
    body = {"error": {"code": code, "message": f"injected {code}", **extra}}
    return httpx.Response(status, content=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json"})
