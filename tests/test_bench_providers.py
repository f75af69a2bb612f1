"""The benchmark's family of upstreams (bench/adaptive/providers.py) must send
the hints it claims, and fencepost's parser must read them as the kind means:
otherwise the family would measure a misunderstanding. Pure: no server."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "adaptive"))

from providers import KINDS, Limits, Upstream  # noqa: E402

from fencepost.core.ratelimit_headers import parse_rate_limit_headers  # noqa: E402


def upstream(kind: str) -> Upstream:
    limits = Limits(**{**KINDS[kind].__dict__})  # a copy: tests must not change the kinds
    return Upstream(limits, random.Random(1))


def spend_all(u: Upstream) -> None:
    for _ in range(100_000):  # bounded
        admitted = u.admit()
        if isinstance(admitted, str):
            return
        u.finish()
    raise AssertionError("the budget never ran out")


def now_ms() -> int:
    return int(time.time() * 1000)


def test_continuous_budget_sends_openai_headers_and_a_whole_second_hint() -> None:
    u = upstream("continuous")
    spend_all(u)
    h = u.headers("budget")
    info = parse_rate_limit_headers(h, now_ms())
    assert info.request_limit == 1500 and info.request_window_ms == 60_000
    assert info.request_remaining == 0 and info.retry_after_ms == 1000
    assert info.retry_after_from == "retry-after"
    assert 0 < (info.request_reset_ms or 0) <= 1000  # until full: one second of refill


def test_fixed_window_states_its_scaled_window() -> None:
    u = upstream("fixed-window")
    spend_all(u)
    info = parse_rate_limit_headers(u.headers("budget"), now_ms())
    assert info.request_limit == 150 and info.request_window_ms == 6_000
    assert info.request_remaining == 0 and (info.request_reset_ms or 0) <= 6_000


def test_concurrency_cap_names_no_budget() -> None:
    u = upstream("concurrency-cap")
    for _ in range(8):
        assert not isinstance(u.admit(), str)
    assert u.admit() == "concurrency"
    info = parse_rate_limit_headers(u.headers("concurrency"), now_ms())
    assert info.retry_after_ms == 1000 and info.request_limit is None
    assert info.request_remaining is None


def test_hourly_github_window_follows_the_policy_and_the_epoch_reset() -> None:
    u = upstream("hourly-github")
    spend_all(u)
    h = u.headers("budget")
    assert "retry-after" not in h  # GitHub's primary limit sends none
    info = parse_rate_limit_headers(h, now_ms())
    assert info.request_limit == 300 and info.request_window_ms == 12_000
    assert info.request_remaining == 0 and (info.request_reset_ms or 0) <= 13_000


def test_halving_sends_anthropic_headers() -> None:
    u = upstream("halving")
    assert not isinstance(u.admit(), str)
    info = parse_rate_limit_headers(u.headers(None), now_ms())
    assert info.request_limit == 6000 and info.request_window_ms == 60_000
    assert (info.request_remaining or 0) > 0


def test_slowdown_never_throttles_and_gets_slower() -> None:
    u = upstream("slowdown")
    services = [u.admit() for _ in range(32)]
    assert not any(isinstance(s, str) for s in services)
    assert services[-1] > 4 * services[0]  # type: ignore[operator]
