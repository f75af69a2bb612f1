"""What lock and slot acquires share: one access-log line per attempt however it
ends (SPEC §3.1, §4.2), and waiting in line with the grant handed straight back
when the caller has gone."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from fencepost.errors import FencepostError, LockHeld, QueueTimeout, ShuttingDown, TooManyRequests
from fencepost.events import AcquireAttempt
from fencepost.server.context import Services, request_id, services
from fencepost.server.messages import Request
from fencepost.server.waiting import Attempt, ClientGone, Line, wait_in_line, watching_disconnect

T = TypeVar("T")
REFUSALS = (LockHeld, TooManyRequests, QueueTimeout)


class AttemptLog:
    """Collects the fields of one acquire attempt and writes its line once."""

    def __init__(self, request: Request, event: str, field: str, path_param: str) -> None:
        self._svc: Services = services(request)
        self._event = event
        self._kind = "lock" if event.startswith("lock") else "slot"
        self._started = asyncio.get_running_loop().time()
        self.waited = False  # set once the caller asked to wait in line
        self.fields: dict[str, Any] = {
            field: str(request.path_params.get(path_param, ""))[:200],
            "request_id": request_id(request),
            "project": None,
            "key_id": None,
        }

    @property
    def elapsed_ms(self) -> int:
        return int((asyncio.get_running_loop().time() - self._started) * 1000)

    def write(self, outcome: str, status: int, **extra: Any) -> None:
        elapsed_s = asyncio.get_running_loop().time() - self._started
        self._svc.access_log.write(
            self._event, outcome=outcome, status=status, waited_ms=int(elapsed_s * 1000),
            **self.fields, **extra,
        )
        self._svc.events.emit(AcquireAttempt(self._kind, outcome, elapsed_s))

    def failed(self, error: BaseException) -> None:
        """The line for an attempt that ended in `error`."""
        if isinstance(error, ClientGone):
            self.write("disconnected", 499)
        elif isinstance(error, ShuttingDown):
            self.write("shutdown", error.http_status)
        elif isinstance(error, REFUSALS):
            refused = "held" if isinstance(error, LockHeld) else "rejected"
            self.write("timeout" if self.waited else refused, error.http_status)
        elif isinstance(error, FencepostError):
            self.write("invalid", error.http_status)


async def get_or_wait(
    request: Request,
    lines: Sequence[Line],
    first: Attempt[T],
    retry: Callable[[int], Awaitable[Attempt[T]]],
    leave: Callable[[int], Awaitable[None]],
    wait_s: float,
    on_timeout: Callable[[Attempt[T]], FencepostError],
    hand_back: Callable[[T], Awaitable[None]],
) -> T:
    """The grant of `first`, or wait in line for one. A grant that arrives after
    the caller disconnected is handed straight back: never leave a lease or a
    slot with someone who is gone."""
    if first.granted is not None:
        return first.granted
    if first.ticket is None:  # fail-fast, or no room in line
        assert first.refusal is not None
        raise first.refusal
    async with watching_disconnect(request.receive) as disconnected:
        granted = await wait_in_line(
            services(request).waiters, lines, first, retry, leave, wait_s, disconnected,
            on_timeout,
        )
        await asyncio.sleep(0)  # let a disconnect that already arrived be seen
        if disconnected.is_set():
            await hand_back(granted)
            raise ClientGone()
        return granted
