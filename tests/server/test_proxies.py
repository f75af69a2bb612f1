"""TrustedProxies: which address a request came from when X-Forwarded-For is
present (believed only from configured proxies)."""

from __future__ import annotations

import pytest

from fencepost.core.keys import ip_allowed, parse_networks
from fencepost.server.proxies import TrustedProxies

CLIENT = "203.0.113.7"
FORGED = "198.51.100.99"


def test_no_proxies_configured_is_falsy_and_ignores_the_header() -> None:
    proxies = TrustedProxies([])
    assert not proxies
    assert proxies.client("127.0.0.1", CLIENT) == "127.0.0.1"


def test_configured_proxies_are_truthy() -> None:
    assert TrustedProxies(["10.0.0.1"])
    assert TrustedProxies(["*"])


@pytest.mark.parametrize("peer", ["192.0.2.1", "10.0.0.2", "::1", "127.0.0.1"])
def test_untrusted_peer_ignores_forwarded_for(peer: str) -> None:
    proxies = TrustedProxies(["10.0.0.1"])
    assert proxies.client(peer, CLIENT) == peer
    assert proxies.client(peer, f"{FORGED}, {CLIENT}") == peer


def test_trusted_peer_with_one_hop_is_that_hop() -> None:
    assert TrustedProxies(["10.0.0.1"]).client("10.0.0.1", CLIENT) == CLIENT


@pytest.mark.parametrize("header", [None, "", "   ", ",", " , ,"])
def test_trusted_peer_without_usable_header_is_the_peer(header: str | None) -> None:
    assert TrustedProxies(["10.0.0.1"]).client("10.0.0.1", header) == "10.0.0.1"


def test_trusted_peer_takes_the_right_most_untrusted_hop() -> None:
    proxies = TrustedProxies(["10.0.0.0/8"])
    # The client wrote FORGED itself; the first proxy appended CLIENT (the real
    # peer it saw), and an inner proxy appended itself.
    assert proxies.client("10.0.0.1", f"{FORGED}, {CLIENT}, 10.9.9.9") == CLIENT
    assert proxies.client("10.0.0.1", f"{FORGED}, {CLIENT}") == CLIENT
    assert proxies.client("10.0.0.1", f"{CLIENT},10.1.1.1,10.2.2.2") == CLIENT


def test_all_hops_trusted_is_the_left_most() -> None:
    proxies = TrustedProxies(["10.0.0.0/8"])
    assert proxies.client("10.0.0.1", "10.1.1.1, 10.2.2.2, 10.3.3.3") == "10.1.1.1"


def test_hops_are_stripped_and_empty_ones_skipped() -> None:
    proxies = TrustedProxies(["10.0.0.0/8"])
    assert proxies.client("10.0.0.1", f"  {CLIENT}  ,, 10.1.1.1 , ") == CLIENT


@pytest.mark.parametrize("peer,trusted", [
    ("10.0.0.1", True),
    ("10.255.255.255", True),
    ("11.0.0.1", False),
    ("9.255.255.255", False),
    ("172.16.5.4", True),
    ("172.32.0.1", False),
])
def test_cidr_entries(peer: str, trusted: bool) -> None:
    proxies = TrustedProxies(["10.0.0.0/8", "172.16.0.0/12"])
    assert (proxies.client(peer, CLIENT) == CLIENT) is trusted


def test_cidr_entry_with_host_bits_is_accepted() -> None:
    proxies = TrustedProxies(["10.1.2.3/16"])
    assert proxies.client("10.1.200.1", CLIENT) == CLIENT
    assert proxies.client("10.2.0.1", CLIENT) == "10.2.0.1"


def test_star_trusts_any_peer_and_every_hop() -> None:
    proxies = TrustedProxies(["*"])
    assert proxies.client("192.0.2.1", CLIENT) == CLIENT
    assert proxies.client("2001:db8::5", CLIENT) == CLIENT
    # Every hop is "trusted" too, so the left-most one is the caller.
    assert proxies.client("192.0.2.1", f"{FORGED}, {CLIENT}") == FORGED
    assert proxies.client("192.0.2.1", None) == "192.0.2.1"


def test_star_beside_networks_still_trusts_everything() -> None:
    assert TrustedProxies(["10.0.0.0/8", "*"]).client("192.0.2.1", CLIENT) == CLIENT


def test_ipv6_proxies_and_hops() -> None:
    proxies = TrustedProxies(["::1", "fd00::/8"])
    assert proxies.client("::1", "2001:db8::1") == "2001:db8::1"
    assert proxies.client("fd12:3456::1", f"2001:db8::1, {CLIENT}, fd00::2") == CLIENT
    assert proxies.client("2001:db8::2", CLIENT) == "2001:db8::2"  # not a proxy
    assert proxies.client("127.0.0.1", CLIENT) == "127.0.0.1"  # v4 peer, v6-only entries


def test_ipv4_entries_do_not_trust_ipv6_peers() -> None:
    proxies = TrustedProxies(["0.0.0.0/0"])
    assert proxies.client("2001:db8::1", CLIENT) == "2001:db8::1"
    assert proxies.client("192.0.2.1", CLIENT) == CLIENT


def test_ipv4_mapped_hop_is_trusted_like_its_ipv4_address() -> None:
    """A dual-stack proxy (e.g. nginx on `[::]` with ipv6only=off) writes an
    IPv4 peer as ::ffff:a.b.c.d. The key allowlists (core.keys.ip_allowed)
    already read that as a.b.c.d; the proxy list must too, or a trusted inner
    proxy's hop is taken for the caller (and admitted by an allowlist naming
    the proxies' network)."""
    proxies = TrustedProxies(["10.0.0.0/8"])
    assert proxies.client("10.0.0.1", f"{CLIENT}, ::ffff:10.0.0.2") == CLIENT
    assert proxies.client("::ffff:10.0.0.1", CLIENT) == CLIENT


@pytest.mark.parametrize("garbage", ["unknown", "not-an-ip", "203.0.113.7:4711", "_hidden",
                                     "300.1.1.1", "10.0.0.1/8"])
def test_garbage_hop_is_an_untrusted_caller_that_no_allowlist_admits(garbage: str) -> None:
    proxies = TrustedProxies(["10.0.0.0/8"])
    # A garbage right-most hop is not a proxy, so it is the caller: neither the
    # (trusted) peer nor a (forgeable) hop to its left is used instead.
    result = proxies.client("10.0.0.1", f"{FORGED}, {garbage}")
    assert result == garbage
    assert not ip_allowed(result, parse_networks(["0.0.0.0/0", "::/0"]))
    # Behind trusted hops, the same.
    assert proxies.client("10.0.0.1", f"{FORGED}, {garbage}, 10.2.2.2") == garbage


def test_garbage_peer_is_never_trusted() -> None:
    proxies = TrustedProxies(["10.0.0.0/8"])
    assert proxies.client("not-an-ip", CLIENT) == "not-an-ip"


@pytest.mark.parametrize("entry", ["not-an-ip", "10.0.0.1/33", "10.0.0.300", "", "::g"])
def test_bad_entries_raise_value_error(entry: str) -> None:
    with pytest.raises(ValueError):
        TrustedProxies([entry])


def test_answers_stay_right_after_many_distinct_addresses() -> None:
    # The trust check is cached; the cache must never answer for another address.
    proxies = TrustedProxies(["10.0.0.0/8"])
    for i in range(3000):
        peer = f"10.{i // 256 % 256}.{i % 256}.1" if i % 2 else f"192.0.{i // 256 % 256}.{i % 256}"
        expected = CLIENT if i % 2 else peer
        assert proxies.client(peer, CLIENT) == expected, peer
