"""The access log: JSON lines for acquire attempts and force releases (SPEC §3, §4).

Secrets never reach it: callers pass key IDs, never keys.

Lines are gathered and written once per turn of the event loop: a write
system call per line cost ~25 µs per acquire in the benchmark, and under load
one turn answers many requests. A line therefore reaches the file at most one
loop turn after its response was sent, and everything is written at shutdown.
"""

from __future__ import annotations

import asyncio
import sys
from typing import IO, Any

import msgspec

from fencepost.clock import wall_clock_ms
from fencepost.core.timefmt import format_at

_encoder = msgspec.json.Encoder()


class AccessLog:
    def __init__(self, target: str | None) -> None:
        self._owned = target not in (None, "", "-", "stderr")
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

    def close(self) -> None:
        self.flush()
        if self._owned:
            self._stream.close()
