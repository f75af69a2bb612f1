"""Output for people: short durations, relative times, aligned tables."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from fencepost.client.models import format_at


def duration(seconds: float) -> str:
    """`850ms`, `12s`, `5m 3s`, `2h 5m`, `3d 4h`."""
    if seconds < 0:
        seconds = 0
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def relative(moment: datetime | None, now: datetime | None = None) -> str:
    """`in 4m 2s` or `3m 10s ago`."""
    if moment is None:
        return "-"
    now = now or datetime.now(UTC)
    delta = (moment - now).total_seconds()
    return f"in {duration(delta)}" if delta >= 0 else f"{duration(-delta)} ago"


def when(moment: datetime | None) -> str:
    """An absolute time with its relative form: `2026-11-29T06:43:26.123Z (in 5m 0s)`."""
    if moment is None:
        return "-"
    return f"{format_at(moment)} ({relative(moment)})"


def epoch_ms(value: int | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value / 1000, tz=UTC)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns aligned on the widest cell; `-` for empty cells."""
    cells = [[str(h) for h in headers]] + [
        ["-" if v is None or v == "" else str(v) for v in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    return "\n".join(lines)


def fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """`label:  value` lines, labels aligned."""
    width = max(len(label) for label, _ in pairs) + 1
    return "\n".join(f"  {(label + ':').ljust(width)} {'-' if value is None else value}"
                     for label, value in pairs)


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def key_label(key_id: str | None, key_name: str | None) -> str:
    """An API key as a holder or waiter: `deployer (key_1a2b...)`, the id alone
    for a key without a name, `-` when unknown."""
    if key_id is None:
        return "-"
    return f"{key_name} ({key_id})" if key_name else key_id
