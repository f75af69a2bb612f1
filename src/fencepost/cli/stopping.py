"""When `fencepost run` must stop CMD so that it never overlaps the next holder.

The server ends a lease `ttl` seconds (a slot: one term) after it handled the
last grant or renewal, and may hand it to someone else at once. It cannot have
handled a request before the request was sent, so the lease lives at least
until `sent + ttl` on our monotonic clock, where `sent` is when the last
successful grant or renewal was sent: the only bound that holds whatever the
network did. CMD must be dead before then. While renewals keep failing:

    SIGKILL at  sent + ttl - margin
    SIGTERM at  SIGKILL - grace

`margin` covers what stands between deciding to kill and the lease's end: our
own timer firing late on a busy machine, the kill taking effect, and the two
clocks running at slightly different rates. Renewals must come often enough
that one failure can be retried before the SIGTERM; `window` (the time from a
grant to the SIGTERM) is what renewals have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_GRACE_S = 10.0
BASE_MARGIN_S = 1.0
# Clock-rate allowance: 1000 ppm, twice what NTP ever slews a clock.
DRIFT = 0.001
# A lock's renewals come every third of the window; below this, too fast to be sane.
MIN_LOCK_WINDOW_S = 1.5
# A slot is renewed at its pool's interval: the window must hold one renewal
# and half an interval more for a retry.
SLOT_WINDOW_INTERVALS = 1.5


def margin_for(lease_s: float) -> float:
    """The time kept between SIGKILL and the earliest possible end of a lease of
    `lease_s` seconds (a quarter of a lease shorter than about 4 s)."""
    return min(BASE_MARGIN_S + lease_s * DRIFT, lease_s / 4)


def room_for_grace(lease_s: float, window_s: float) -> float:
    """The longest grace that leaves `window_s` for renewals in a lease of `lease_s`."""
    return lease_s - margin_for(lease_s) - window_s


def choose_grace(asked: float | None, lease_s: float, window_s: float) -> float:
    """The grace to use: the one asked for, or by default 10 s or less to fit.
    Raises ValueError, saying what fits, when the asked grace does not fit, or
    when the lease leaves no room even without a grace."""
    room = room_for_grace(lease_s, window_s)
    if room >= 0 and asked is None:
        return min(DEFAULT_GRACE_S, room)
    if room >= 0 and asked is not None and asked <= room:
        return asked
    needs = (f"CMD must be dead {margin_for(lease_s):.2f} s before the lease can expire, "
             f"and renewals need {window_s:.2f} s before the stop begins")
    if room < 0:
        raise ValueError(f"a {lease_s:g} s lease leaves no time to stop CMD safely: {needs}")
    # Rounded down, so that the grace it suggests does fit.
    raise ValueError(f"--grace {asked:g} does not fit in a {lease_s:g} s lease "
                     f"(at most {math.floor(room * 100) / 100:g} s fits): {needs}")


@dataclass(slots=True)
class StopSchedule:
    """The stop times of one held lease, on the monotonic clock. `cap` is an
    instant the lease cannot outlive however it is renewed (a lock's 90-day
    deadline, a slot's request deadline)."""

    lease_s: float
    grace_s: float
    last_sent: float
    cap: float

    def granted(self, sent: float) -> None:
        """A grant or renewal sent at `sent` succeeded."""
        self.last_sent = max(self.last_sent, sent)

    def at_cap(self) -> bool:
        """Whether the cap, not the last renewal, ends the lease."""
        return self.last_sent + self.lease_s >= self.cap

    def earliest_end(self) -> float:
        return min(self.last_sent + self.lease_s, self.cap)

    def kill_at(self) -> float:
        return self.earliest_end() - margin_for(self.lease_s)

    def term_at(self) -> float:
        return self.kill_at() - self.grace_s
