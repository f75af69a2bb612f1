"""Per-key requests-per-minute quota as a GCRA (generic cell rate algorithm).

GCRA keeps one number per key (the theoretical arrival time), allows bursts of
up to the whole minute's quota, and yields an exact retry-after, which a fixed
window cannot. See "Generic cell rate algorithm" (ITU-T I.371).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WINDOW_MS = 60_000


@dataclass(slots=True)
class RateGate:
    per_minute: int
    theoretical_arrival_ms: float = 0.0

    def admit(self, now_ms: int) -> int | None:
        """None when admitted (and counted); otherwise milliseconds until a retry may pass."""
        interval = WINDOW_MS / self.per_minute
        tat = max(self.theoretical_arrival_ms, float(now_ms))
        new_tat = tat + interval
        allowed_from = new_tat - WINDOW_MS
        if now_ms < allowed_from:
            return max(1, math.ceil(allowed_from - now_ms))
        self.theoretical_arrival_ms = new_tat
        return None
