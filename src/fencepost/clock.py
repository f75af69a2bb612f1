"""The one place outside the stores that reads wall-clock time, and the steady
clock that measures elapsed time while the server runs."""

from __future__ import annotations

import time

# Linux's CLOCK_BOOTTIME is monotonic (no steps) and, unlike CLOCK_MONOTONIC,
# keeps counting while the machine is suspended: leases held across a suspend
# end when the holders, whose clocks ran on, expect them to.
_STEADY = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def steady_ns() -> int:
    """Nanoseconds on a clock that a step of the wall clock does not move."""
    return time.clock_gettime_ns(_STEADY)


class SteadyClock:
    """Epoch milliseconds that a step of the wall clock cannot move.

    The wall clock is read once, when the clock is made; after that, time
    advances by the steady clock alone. An NTP step or a hand-set date while
    the server runs therefore neither frees nor lengthens a live lease (SPEC §2,
    "Time authority"), while the instants it stamps stay wall-clock instants, so
    a restarted server (which takes a fresh reading) still understands them."""

    __slots__ = ("_anchor_ms", "_anchor_ns")

    def __init__(self, anchor: tuple[int, int] | None = None) -> None:
        # `anchor` (epoch ms, steady ns) makes this clock another's twin: the
        # worker processes of one server share their supervisor's, so that
        # they agree on every instant even if the wall clock stepped between
        # their starts (the steady clock is one per machine).
        self._anchor_ms, self._anchor_ns = anchor or (wall_clock_ms(), steady_ns())

    @property
    def anchor(self) -> tuple[int, int]:
        """What makes a twin of this clock (see __init__)."""
        return (self._anchor_ms, self._anchor_ns)

    def __call__(self) -> int:
        return self._anchor_ms + (steady_ns() - self._anchor_ns) // 1_000_000

    def drift_ms(self) -> int:
        """How far the wall clock has moved from this clock since it was made
        (positive: the wall clock is ahead)."""
        return wall_clock_ms() - self()
