"""The access log: JSON lines for acquires and force releases (SPEC §3, §4).

Secrets never reach it: callers pass key IDs, never keys.

Lines are gathered and written once per turn of the event loop: a write
system call per line cost ~25 µs per acquire in the benchmark, and under load
one turn answers many requests. A line therefore reaches the file at most one
loop turn after its response was sent, and everything is written at shutdown.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import IO, Any

import msgspec

from fencepost.clock import wall_clock_ms
from fencepost.core.timefmt import format_at
from fencepost.errors import (
    FencepostError,
    LockHeld,
    QueueTimeout,
    ShuttingDown,
    TooManyRequests,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from fencepost.events import AcquireAttempt, Events
from fencepost.server.waiting import ClientGone

_encoder = msgspec.json.Encoder()


class AccessLog:
    def __init__(self, target: str | None) -> None:
        self._owned = target not in (None, "", "-", "stderr")
        self.target = target if self._owned else None  # the file's path, if a file
        self._stream: IO[bytes] = (
            open(target, "ab") if self._owned and target else sys.stderr.buffer
        )
        self._pending: list[bytes] = []

    def write(self, event: str, **fields: Any) -> None:
        record = {"ts": format_at(wall_clock_ms()), "event": event, **fields}
        if not self._pending:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (a tool, a test): write at once
                self._pending.append(_encoder.encode(record) + b"\n")
                self.flush()
                return
        self._pending.append(_encoder.encode(record) + b"\n")

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            self._stream.write(data)
            self._stream.flush()

    def reopen(self) -> bool:
        """Write what is pending to the file open now, then open the path again
        (SIGHUP, after logrotate moved the file away): later lines go to a new
        file at the path. Standard error is left as it is. Whether a file was
        reopened; a path that cannot be opened keeps the old file (logged by
        the caller) rather than losing lines."""
        if self.target is None:
            return False
        self.flush()
        fresh = open(self.target, "ab")
        old, self._stream = self._stream, fresh
        old.close()
        return True

    def close(self) -> None:
        self.flush()
        if self._owned:
            self._stream.close()


REFUSALS = (LockHeld, TooManyRequests, QueueTimeout)


@dataclass(frozen=True, slots=True)
class AcquireLogged:
    """A route whose every request writes one access-log line however it ends
    (SPEC §3.1, §4.2): its event, and the field naming the lock or pool with
    the path parameter it comes from."""

    event: str
    field: str
    path_param: str

    @property
    def kind(self) -> str:
        return "lock" if self.event.startswith("lock") else "slot"


class AcquireLog:
    """Collects the fields of one acquire and writes its line (and its
    AcquireAttempt event) once."""

    __slots__ = ("_log", "_events", "_route", "_started", "waited", "fields")

    def __init__(
        self, log: AccessLog, events: Events, route: AcquireLogged, name: str, request_id: str
    ) -> None:
        self._log = log
        self._events = events
        self._route = route
        self._started = asyncio.get_running_loop().time()
        self.waited = False  # set once the caller asked to wait in line
        self.fields: dict[str, Any] = {
            route.field: name[:200],
            "request_id": request_id,
            "project": None,
            "key_id": None,
        }

    @property
    def elapsed_ms(self) -> int:
        return int((asyncio.get_running_loop().time() - self._started) * 1000)

    def write(self, outcome: str, status: int, waited_ms: int | None = None,
              **extra: Any) -> None:
        """The line, with how long the caller waited: until now, or `waited_ms`
        when what followed the admission is not waiting (a proxied call)."""
        elapsed_s = asyncio.get_running_loop().time() - self._started
        if waited_ms is not None:
            elapsed_s = waited_ms / 1000
        self._log.write(
            self._route.event, outcome=outcome, status=status, waited_ms=int(elapsed_s * 1000),
            **self.fields, **extra,
        )
        self._events.emit(AcquireAttempt(self._route.kind, outcome, elapsed_s))

    def failed(self, error: BaseException) -> None:
        """The line for an acquire that ended in `error`."""
        if isinstance(error, ClientGone):
            self.write("disconnected", 499)
        elif isinstance(error, ShuttingDown):
            self.write("shutdown", error.http_status)
        elif isinstance(error, REFUSALS):
            refused = "held" if isinstance(error, LockHeld) else "rejected"
            self.write("timeout" if self.waited else refused, error.http_status)
        elif isinstance(error, UpstreamUnavailable | UpstreamTimeout):
            # Admitted, then the upstream failed (proxy mode): its own outcome.
            self.write("upstream_failed", error.http_status)
        elif isinstance(error, FencepostError):
            self.write("invalid", error.http_status)
