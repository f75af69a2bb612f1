"""Time representations used on the wire (SPEC §2 "Times").

Internally every instant is an integer count of Unix epoch milliseconds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

MS_PER_SECOND = 1000
MS_PER_DAY = 86_400_000


def format_at(epoch_ms: int | None) -> str | None:
    """RFC 3339 UTC with millisecond precision and a `Z`: `2026-11-29T06:43:26.123Z`."""
    if epoch_ms is None:
        return None
    seconds, millis = divmod(epoch_ms, MS_PER_SECOND)
    return f"{_second_stamp(seconds)}.{millis:03d}Z"


@lru_cache(maxsize=4096)
def _second_stamp(seconds: int) -> str:
    # Cached: on the hot path most stamps fall in the same few seconds.
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
