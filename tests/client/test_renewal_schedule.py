"""When the lease keeper renews, with an injected clock and chance: no sleeps, no
I/O. Renewals are spread over the end of their interval, so leases taken
together are not renewed in one burst; none is ever later than its interval."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from fencepost.client.calls import Call, Sleep
from fencepost.client.keeper import (
    FIRST_RENEWAL_SPREAD,
    RENEWAL_SPREAD,
    LockTerms,
    keep_alive,
)
from fencepost.client.models import Lease, LeaseRenewal
from fencepost.client.operations import Op

T0 = datetime(2026, 12, 1, tzinfo=UTC)
TTL = 30  # renewed every 10 s


def lease() -> Lease:
    return Lease(key="k", fencing_token=1, acquired_at=T0, expires_at=T0 + timedelta(seconds=TTL),
                 deadline_at=T0 + timedelta(days=90), lock_token="t")


def renewal() -> LeaseRenewal:
    return LeaseRenewal(key="k", fencing_token=1, expires_at=T0, deadline_at=T0)


class Keeper:
    """One keeper driven by hand: `gaps()` are the pauses before each renewal."""

    def __init__(self, chance: float | None = None, seed: int = 0) -> None:
        self.now = 100.0
        pick = random.Random(seed).random if chance is None else (lambda: chance)
        terms = LockTerms(lease(), TTL, sent=self.now, answered=self.now)
        self.program: Op[object] = keep_alive(terms, timeout=5, clock=lambda: self.now,
                                              chance=pick)

    def gaps(self, renewals: int) -> list[float]:
        found: list[float] = []
        step = next(self.program)
        last = self.now
        for _ in range(renewals):
            while isinstance(step, Sleep):
                self.now += step.seconds
                step = self.program.send(None)
            assert isinstance(step, Call) and step.renews and step.method == "PATCH"
            found.append(round(self.now - last, 6))
            last = self.now
            step = self.program.send(renewal())
        return found


def test_the_first_renewal_comes_in_the_second_half_of_the_interval() -> None:
    interval = TTL / 3
    assert Keeper(chance=0.0).gaps(1) == [interval]
    assert Keeper(chance=0.999999).gaps(1)[0] >= interval * (1 - FIRST_RENEWAL_SPREAD)
    assert Keeper(chance=0.5).gaps(1) == [interval * (1 - FIRST_RENEWAL_SPREAD / 2)]


def test_later_renewals_come_in_the_last_tenth_and_never_past_the_interval() -> None:
    interval = TTL / 3
    for seed in range(20):
        later = Keeper(seed=seed).gaps(6)[1:]
        assert all(interval * (1 - RENEWAL_SPREAD) <= gap <= interval for gap in later), later


def test_leases_taken_together_are_renewed_apart() -> None:
    interval = TTL / 3
    firsts = sorted(Keeper(seed=seed).gaps(1)[0] for seed in range(200))
    # Spread over the second half of the interval rather than one instant:
    # every fifth of that half gets some of them.
    half = interval * FIRST_RENEWAL_SPREAD
    for fifth in range(5):
        low, high = interval - half + fifth * half / 5, interval - half + (fifth + 1) * half / 5
        assert any(low <= gap < high for gap in firsts), (fifth, firsts[:5], firsts[-5:])
