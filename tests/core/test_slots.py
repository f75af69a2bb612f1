"""Pool and slot rules with an injected clock."""

from __future__ import annotations

import pytest

from fencepost.core import slots as rules
from fencepost.core.slots import PoolConfig
from fencepost.errors import Capped, NotFound

T0 = 1_800_000_000_000


def test_new_slot_deadlines():
    config = PoolConfig(limit=2, term_ms=30_000, request_timeout_ms=60_000)
    slot = rules.new_slot("s", "p", config, T0)
    assert slot.lease_deadline_ms == T0 + 30_000
    assert slot.request_deadline_ms == T0 + 60_000


def test_term_longer_than_request_timeout_is_capped_at_once():
    config = PoolConfig(limit=1, term_ms=60_000, request_timeout_ms=10_000)
    slot = rules.new_slot("s", "p", config, T0)
    assert slot.lease_deadline_ms == slot.request_deadline_ms == T0 + 10_000


def test_renew_extends_by_one_term_until_the_cap():
    config = PoolConfig(limit=1, term_ms=1_000, request_timeout_ms=2_500)
    slot = rules.new_slot("s", "p", config, T0)
    slot = rules.renew(slot, config, T0 + 500)
    assert slot.lease_deadline_ms == T0 + 1_500
    slot = rules.renew(slot, config, T0 + 1_400)
    assert slot.lease_deadline_ms == T0 + 2_400
    slot = rules.renew(slot, config, T0 + 2_000)
    assert slot.lease_deadline_ms == T0 + 2_500  # capped at the request deadline
    with pytest.raises(Capped):
        rules.renew(slot, config, T0 + 2_100)


def test_renew_of_a_dead_or_missing_slot_is_not_found():
    config = PoolConfig(limit=1, term_ms=1_000)
    slot = rules.new_slot("s", "p", config, T0)
    with pytest.raises(NotFound):
        rules.renew(slot, config, T0 + 1_000)
    with pytest.raises(NotFound):
        rules.renew(None, config, T0)


def test_liveness_is_judged_by_the_lease_deadline():
    slot = rules.new_slot("s", "p", PoolConfig(limit=1, term_ms=1_000), T0)
    assert rules.is_live(slot, T0 + 999)
    assert not rules.is_live(slot, T0 + 1_000)


@pytest.mark.parametrize(
    "in_use,ahead,admitted", [(0, 0, True), (2, 0, True), (3, 0, False), (0, 1, False)]
)
def test_admission_respects_limit_and_line(in_use, ahead, admitted):
    assert rules.may_admit(3, in_use, ahead) is admitted


@pytest.mark.parametrize(
    "wanted,no_queue,queue_size,expected",
    [(5_000, False, 100, 5_000), (99_999, False, 100, 30_000), (5_000, True, 100, 0),
     (5_000, False, 0, 0), (0, False, 100, 0)],
)
def test_wait_is_clamped(wanted, no_queue, queue_size, expected):
    config = PoolConfig(limit=1, queue_size=queue_size, queue_timeout_ms=30_000)
    assert rules.clamp_wait_ms(config, wanted, no_queue) == expected


def test_retry_after_is_the_earliest_hard_cap():
    assert rules.retry_after_ms([T0 + 9_000, T0 + 4_000], T0) == 4_000
    assert rules.retry_after_ms([], T0) is None
    assert rules.retry_after_ms([T0], T0) == 1


def test_renew_interval_defaults_to_a_third_of_the_term():
    assert PoolConfig(limit=1, term_ms=30_000).suggested_renew_interval_ms == 10_000
    assert PoolConfig(limit=1, term_ms=30_000, renew_interval_ms=5).suggested_renew_interval_ms == 5


def test_status_classes():
    assert [rules.status_class(s) for s in (100, 204, 301, 429, 599)] == [
        "1xx", "2xx", "3xx", "4xx", "5xx"]


def test_retry_after_uses_the_typical_hold_when_known():
    assert rules.retry_after_ms([T0 + 60_000], T0, typical_hold_ms=120.4) == 121
    assert rules.retry_after_ms([T0 + 50], T0, typical_hold_ms=120.4) == 50
    assert rules.retry_after_ms([], T0, typical_hold_ms=120.4) is None
