"""Names, times, quotas and key rules."""

from __future__ import annotations

import pytest

from fencepost.core.keys import Role, hash_secret, ip_allowed, parse_networks
from fencepost.core.names import is_valid_name
from fencepost.core.quota import RateGate
from fencepost.core.timefmt import format_at


@pytest.mark.parametrize(
    "name", ["a", "deploy-prod", "A.b_c:d-e", "0", "x" * 128, "a" + "-" * 127]
)
def test_valid_names(name):
    assert is_valid_name(name)


@pytest.mark.parametrize(
    "name",
    ["", "-a", ".a", "_a", ":a", "x" * 129, "a b", "a/b", "é", "a\n", "a\x00", "a%2F", "a*"],
)
def test_invalid_names(name):
    assert not is_valid_name(name)


def test_times_are_rfc3339_utc_with_milliseconds():
    assert format_at(0) == "1970-01-01T00:00:00.000Z"
    assert format_at(1_795_934_606_123) == "2026-11-29T06:43:26.123Z"
    assert format_at(None) is None


class TestQuota:
    def test_allows_the_quota_then_refuses_with_retry_after(self):
        gate = RateGate(per_minute=3)
        now = 1_000_000
        assert [gate.admit(now) for _ in range(3)] == [None, None, None]
        assert gate.admit(now) == 20_000  # one slot frees every 60 s / 3

    def test_refused_requests_are_not_counted(self):
        gate = RateGate(per_minute=1)
        assert gate.admit(0) is None
        assert gate.admit(1) == 59_999
        assert gate.admit(2) == 59_998
        assert gate.admit(60_000) is None

    def test_recovers_gradually(self):
        gate = RateGate(per_minute=60)
        for _ in range(60):
            assert gate.admit(0) is None
        assert gate.admit(0) == 1_000
        assert gate.admit(1_000) is None
        assert gate.admit(1_000) == 1_000


class TestKeys:
    def test_roles_are_ordered(self):
        assert Role.READER < Role.MEMBER < Role.ADMIN
        assert Role.parse("member") is Role.MEMBER
        assert Role.ADMIN.label == "admin"

    def test_hash_is_keyed(self):
        assert hash_secret("s", b"p1") != hash_secret("s", b"p2")
        assert hash_secret("s", b"p1") == hash_secret("s", b"p1")

    def test_allowlists(self):
        nets = parse_networks(["10.0.0.0/8", "::1", "192.168.1.7"])
        assert ip_allowed("10.2.3.4", nets)
        assert ip_allowed("::1", nets)
        assert ip_allowed("::ffff:10.0.0.1", nets)  # IPv4-mapped IPv6
        assert ip_allowed("192.168.1.7", nets)
        assert not ip_allowed("127.0.0.1", nets)
        assert not ip_allowed(None, nets)
        assert not ip_allowed("not-an-ip", nets)
        assert ip_allowed("127.0.0.1", [])  # no list: any address

    def test_bad_cidr_is_named(self):
        with pytest.raises(ValueError, match="nope"):
            parse_networks(["10.0.0.0/8", "nope"])
