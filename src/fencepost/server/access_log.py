"""The access log: JSON lines for acquire attempts and force releases (SPEC §3, §4).

Secrets never reach it: callers pass key IDs, never keys.
"""

from __future__ import annotations

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
            open(target, "ab", buffering=0) if self._owned and target else sys.stderr.buffer
        )

    def write(self, event: str, **fields: Any) -> None:
        record = {"ts": format_at(wall_clock_ms()), "event": event, **fields}
        self._stream.write(_encoder.encode(record) + b"\n")
        if not self._owned:
            self._stream.flush()

    def close(self) -> None:
        if self._owned:
            self._stream.close()
