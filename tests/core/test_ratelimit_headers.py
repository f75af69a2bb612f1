"""The rate-limit header parser (SPEC §4.5): one table per dialect, malformed values
(ignored, never a crash), case-insensitivity, precedence between dialects, `merge`."""

from __future__ import annotations

import random
from dataclasses import fields
from datetime import UTC
from email.utils import format_datetime
from typing import Any

import pytest

from fencepost.core import ratelimit_headers as rl
from fencepost.core.ratelimit_headers import RateLimitInfo, merge, parse_rate_limit_headers

T0 = 1_800_000_000_000  # now, in epoch ms: 2027-01-15T08:00:00Z
T0_S = T0 // 1000
TEN_KB = "9" * 10_240


def parse(headers: dict[str, Any]) -> RateLimitInfo:
    return parse_rate_limit_headers(headers, T0)


def row(name: str, headers: dict[str, Any], **expected: int | None) -> Any:
    return pytest.param(headers, RateLimitInfo(**expected), id=name)


def bad(name: str, headers: dict[str, Any]) -> Any:
    return pytest.param(headers, RateLimitInfo(), id=name)


# What the tables state; the window a limit counts over and which header a
# retry hint came from are checked by their own tests (WINDOWS, SOURCES).
_TABLE_FIELDS = [f.name for f in fields(RateLimitInfo)
                 if f.name not in ("request_window_ms", "retry_after_from")]


def counts(info: RateLimitInfo) -> dict[str, Any]:
    return {name: getattr(info, name) for name in _TABLE_FIELDS}


def check(headers: dict[str, Any], expected: RateLimitInfo) -> None:
    assert counts(parse(headers)) == counts(expected), headers


# --- retry-after (RFC 9110 §10.2.3) and retry-after-ms (OpenAI, Azure) ------------------------

RETRY = [
    row("seconds", {"retry-after": "30"}, retry_after_ms=30_000),
    row("zero", {"retry-after": "0"}, retry_after_ms=0),
    row("fraction", {"retry-after": "1.5"}, retry_after_ms=1_500),
    row("fraction-rounds-up", {"retry-after": "0.0001"}, retry_after_ms=1),
    row("leading-dot", {"retry-after": ".25"}, retry_after_ms=250),
    row("surrounding-space", {"retry-after": "  7 "}, retry_after_ms=7_000),
    row("imf-fixdate", {"retry-after": "Fri, 15 Jan 2027 08:00:30 GMT"}, retry_after_ms=30_000),
    row("rfc850-date", {"retry-after": "Friday, 15-Jan-27 08:01:00 GMT"}, retry_after_ms=60_000),
    row("asctime-date", {"retry-after": "Fri Jan 15 08:00:10 2027"}, retry_after_ms=10_000),
    row("date-with-offset", {"retry-after": "Fri, 15 Jan 2027 09:00:05 +0100"},
        retry_after_ms=5_000),
    row("date-in-the-past", {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, retry_after_ms=0),
    row("ms", {"retry-after-ms": "250"}, retry_after_ms=250),
    row("ms-fraction", {"retry-after-ms": "12.3"}, retry_after_ms=13),
    row("ms-wins-over-rounded-seconds", {"retry-after": "1", "retry-after-ms": "157"},
        retry_after_ms=157),
    row("ms-wins-even-when-larger", {"retry-after": "1", "retry-after-ms": "2500"},
        retry_after_ms=2_500),
    row("ms-wins-over-a-date", {"retry-after": "Fri, 15 Jan 2027 08:00:30 GMT",
                                "retry-after-ms": "250"}, retry_after_ms=250),
    row("bad-ms-does-not-hide-good-s", {"retry-after": "3", "retry-after-ms": "-1"},
        retry_after_ms=3_000),
    row("one-year-is-believed", {"retry-after": str(366 * 86_400)},
        retry_after_ms=366 * 86_400_000),
]

RETRY_MALFORMED = [
    bad("negative", {"retry-after": "-1"}),
    bad("nan", {"retry-after": "NaN"}),
    bad("inf", {"retry-after": "inf"}),
    bad("exponent", {"retry-after": "1e3"}),
    bad("hex", {"retry-after": "0x10"}),
    bad("empty", {"retry-after": ""}),
    bad("blank", {"retry-after": "   "}),
    bad("word", {"retry-after": "soon"}),
    bad("list", {"retry-after": "1, 2"}),
    bad("non-ascii-digits", {"retry-after": "١٠"}),
    bad("day-out-of-range", {"retry-after": "Wed, 32 Oct 2026 07:28:00 GMT"}),
    bad("year-out-of-range", {"retry-after": "Wed, 21 Oct 99999 07:28:00 GMT"}),
    bad("offset-out-of-range", {"retry-after": "1 Jan 2027 00:00:00 +9999999"}),
    bad("date-beyond-a-year", {"retry-after": "Fri, 15 Jan 2100 08:00:00 GMT"}),
    bad("beyond-a-year", {"retry-after": "99999999999"}),
    bad("ten-kb", {"retry-after": TEN_KB}),
    bad("ms-negative", {"retry-after-ms": "-5"}),
    bad("ms-nan", {"retry-after-ms": "nan"}),
    bad("ms-date", {"retry-after-ms": "Fri, 15 Jan 2027 08:00:30 GMT"}),
    bad("ms-ten-kb", {"retry-after-ms": TEN_KB}),
    bad("not-a-string", {"retry-after": 5}),
]


@pytest.mark.parametrize(("headers", "expected"), RETRY + RETRY_MALFORMED)
def test_retry_after(headers: dict[str, Any], expected: RateLimitInfo) -> None:
    check(headers, expected)


# --- OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens}, reset a Go duration ------

OPENAI = [
    row("requests", {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
                     "x-ratelimit-reset-requests": "1s"},
        request_limit=60, request_remaining=59, request_reset_ms=1_000),
    row("tokens", {"x-ratelimit-limit-tokens": "150000",
                   "x-ratelimit-remaining-tokens": "149984",
                   "x-ratelimit-reset-tokens": "6m0s"},
        token_limit=150_000, token_remaining=149_984, token_reset_ms=360_000),
    row("ms", {"x-ratelimit-reset-requests": "20ms"}, request_reset_ms=20),
    row("h-m-fractional-s", {"x-ratelimit-reset-requests": "1h2m3.5s"},
        request_reset_ms=3_723_500),
    row("fractional-s", {"x-ratelimit-reset-requests": "59.929s"}, request_reset_ms=59_929),
    row("m-fractional-s", {"x-ratelimit-reset-tokens": "2m59.56s"}, token_reset_ms=179_560),
    row("zero", {"x-ratelimit-reset-requests": "0s"}, request_reset_ms=0),
    row("fractional-h", {"x-ratelimit-reset-requests": "1.5h"}, request_reset_ms=5_400_000),
    row("us", {"x-ratelimit-reset-requests": "100us"}, request_reset_ms=1),
    row("micro-sign", {"x-ratelimit-reset-requests": "1500µs"}, request_reset_ms=2),
    row("greek-mu", {"x-ratelimit-reset-requests": "1000μs"}, request_reset_ms=1),
    row("ns", {"x-ratelimit-reset-requests": "1ns"}, request_reset_ms=1),
    row("sub-ms-rounds-up", {"x-ratelimit-reset-requests": "0.5ms"}, request_reset_ms=1),
    row("bare-number-is-seconds", {"x-ratelimit-reset-requests": "1.5"}, request_reset_ms=1_500),
    row("zero-remaining", {"x-ratelimit-remaining-requests": "0"}, request_remaining=0),
    row("largest-count", {"x-ratelimit-limit-tokens": str(2**63 - 1)}, token_limit=2**63 - 1),
]

OPENAI_MALFORMED = [
    bad("negative-duration", {"x-ratelimit-reset-requests": "-1s"}),
    bad("unknown-unit", {"x-ratelimit-reset-requests": "1d"}),
    bad("unit-only", {"x-ratelimit-reset-requests": "ms"}),
    bad("two-dots", {"x-ratelimit-reset-requests": "1.2.3s"}),
    bad("space-inside", {"x-ratelimit-reset-requests": "1 s"}),
    bad("negative-part", {"x-ratelimit-reset-requests": "1h-2m"}),
    bad("beyond-a-year", {"x-ratelimit-reset-tokens": "9999h"}),
    bad("nan", {"x-ratelimit-reset-tokens": "NaNs"}),
    bad("ten-kb-duration", {"x-ratelimit-reset-tokens": "1s" * 5_120}),
    bad("negative-count", {"x-ratelimit-remaining-requests": "-1"}),
    bad("fractional-count", {"x-ratelimit-limit-requests": "1.5"}),
    bad("exponent-count", {"x-ratelimit-limit-requests": "1e3"}),
    bad("word-count", {"x-ratelimit-limit-tokens": "lots"}),
    bad("count-over-int64", {"x-ratelimit-limit-tokens": str(2**63)}),
    bad("count-of-twenty-digits", {"x-ratelimit-remaining-tokens": "1" * 20}),
    bad("ten-kb-count", {"x-ratelimit-remaining-tokens": TEN_KB}),
]


@pytest.mark.parametrize(("headers", "expected"), OPENAI + OPENAI_MALFORMED)
def test_openai(headers: dict[str, Any], expected: RateLimitInfo) -> None:
    check(headers, expected)


# --- Anthropic: anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}, RFC 3339 --------

ANTHROPIC = [
    row("requests", {"anthropic-ratelimit-requests-limit": "50",
                     "anthropic-ratelimit-requests-remaining": "49",
                     "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:30Z"},
        request_limit=50, request_remaining=49, request_reset_ms=30_000),
    row("tokens", {"anthropic-ratelimit-tokens-limit": "80000",
                   "anthropic-ratelimit-tokens-remaining": "0",
                   "anthropic-ratelimit-tokens-reset": "2027-01-15T08:00:00.250Z"},
        token_limit=80_000, token_remaining=0, token_reset_ms=250),
    row("offset", {"anthropic-ratelimit-requests-reset": "2027-01-15T09:00:01+01:00"},
        request_reset_ms=1_000),
    row("lower-case-t-and-z", {"anthropic-ratelimit-requests-reset": "2027-01-15t08:00:01z"},
        request_reset_ms=1_000),
    row("nanoseconds", {"anthropic-ratelimit-requests-reset": "2027-01-15T08:00:01.000000001Z"},
        request_reset_ms=1_000),
    row("space-separator", {"anthropic-ratelimit-requests-reset": "2027-01-15 08:00:02Z"},
        request_reset_ms=2_000),
    row("no-offset-is-utc", {"anthropic-ratelimit-requests-reset": "2027-01-15T08:00:02"},
        request_reset_ms=2_000),
    row("in-the-past", {"anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:00Z"},
        token_reset_ms=0),
    row("year-one-is-the-past", {"anthropic-ratelimit-tokens-reset": "0001-01-01T00:00:00+01:00"},
        token_reset_ms=0),
]

ANTHROPIC_MALFORMED = [
    bad("seconds-not-a-time", {"anthropic-ratelimit-requests-reset": "30"}),
    bad("date-only", {"anthropic-ratelimit-requests-reset": "2027-01-15"}),
    bad("month-13", {"anthropic-ratelimit-requests-reset": "2027-13-15T08:00:00Z"}),
    bad("hour-25", {"anthropic-ratelimit-requests-reset": "2027-01-15T25:00:00Z"}),
    bad("offset-24h", {"anthropic-ratelimit-requests-reset": "2027-01-15T08:00:00+24:00"}),
    bad("word", {"anthropic-ratelimit-tokens-reset": "tomorrow"}),
    bad("http-date", {"anthropic-ratelimit-tokens-reset": "Fri, 15 Jan 2027 08:00:30 GMT"}),
    bad("beyond-a-year", {"anthropic-ratelimit-tokens-reset": "2999-01-01T00:00:00Z"}),
    bad("ten-kb", {"anthropic-ratelimit-tokens-reset": "2027-01-15T08:00:00." + TEN_KB + "Z"}),
    bad("negative-limit", {"anthropic-ratelimit-requests-limit": "-50"}),
    bad("garbage-remaining", {"anthropic-ratelimit-tokens-remaining": "12abc"}),
    bad("input-tokens-not-read", {"anthropic-ratelimit-input-tokens-limit": "1000",
                                  "anthropic-ratelimit-output-tokens-remaining": "5"}),
]


@pytest.mark.parametrize(("headers", "expected"), ANTHROPIC + ANTHROPIC_MALFORMED)
def test_anthropic(headers: dict[str, Any], expected: RateLimitInfo) -> None:
    check(headers, expected)


# --- IETF drafts up to -05: ratelimit-{limit,remaining,reset}, reset in delta seconds ---------

IETF = [
    row("all-three", {"ratelimit-limit": "100", "ratelimit-remaining": "50",
                      "ratelimit-reset": "30"},
        request_limit=100, request_remaining=50, request_reset_ms=30_000),
    row("limit-as-list", {"ratelimit-limit": "10, 10;w=1, 50;w=60"}, request_limit=10),
    row("limit-with-window", {"ratelimit-limit": "100;w=60"}, request_limit=100),
    row("fractional-reset", {"ratelimit-reset": "0.5"}, request_reset_ms=500),
    row("epoch-reset-tolerated", {"ratelimit-reset": str(T0_S + 5)}, request_reset_ms=5_000),
]

IETF_MALFORMED = [
    bad("negative-remaining", {"ratelimit-remaining": "-3"}),
    bad("word-reset", {"ratelimit-reset": "soon"}),
    bad("params-only", {"ratelimit-limit": ";w=60"}),
    bad("word-first", {"ratelimit-limit": "abc, 10"}),
    bad("duration-reset", {"ratelimit-reset": "30s"}),
    bad("ten-kb", {"ratelimit-limit": "1, " * 3_500}),
]


@pytest.mark.parametrize(("headers", "expected"), IETF + IETF_MALFORMED)
def test_ietf_fields(headers: dict[str, Any], expected: RateLimitInfo) -> None:
    check(headers, expected)


# --- IETF draft -06+ structured fields: ratelimit and ratelimit-policy (RFC 9651) -------------

STRUCTURED = [
    row("one-policy", {"ratelimit": '"default";r=50;t=30',
                       "ratelimit-policy": '"default";q=100;w=60'},
        request_limit=100, request_remaining=50, request_reset_ms=30_000),
    row("most-restrictive-item", {
        "ratelimit": '"burst";r=5;t=1, "daily";r=2;t=3600',
        "ratelimit-policy": '"burst";q=10;w=1, "daily";q=1000;w=86400'},
        request_limit=1_000, request_remaining=2, request_reset_ms=3_600_000),
    row("tie-takes-the-later-reset", {
        "ratelimit": '"a";r=0;t=1, "b";r=0;t=9',
        "ratelimit-policy": '"a";q=10;w=1, "b";q=60;w=60'},
        request_limit=60, request_remaining=0, request_reset_ms=9_000),
    row("tie-prefers-a-known-reset", {"ratelimit": '"a";r=0, "b";r=0;t=0'},
        request_remaining=0, request_reset_ms=0),
    row("without-policy", {"ratelimit": '"default";r=50;t=30'},
        request_remaining=50, request_reset_ms=30_000),
    row("without-reset", {"ratelimit": '"default";r=7'}, request_remaining=7),
    row("policy-only-smallest-per-second", {
        "ratelimit-policy": '"x";q=100;w=60, "y";q=10;w=1'}, request_limit=100),
    row("policy-without-window-counts-as-one-second", {
        "ratelimit-policy": '"x";q=100, "y";q=1000;w=60'}, request_limit=1_000),
    row("unmatched-item-uses-tightest-policy", {
        "ratelimit": '"other";r=3;t=4',
        "ratelimit-policy": '"x";q=100;w=60, "y";q=10;w=1'},
        request_limit=100, request_remaining=3, request_reset_ms=4_000),
    row("token-names", {"ratelimit": "default;r=1;t=2"}, request_remaining=1,
        request_reset_ms=2_000),
    row("other-units-skipped", {
        "ratelimit": '"bytes";r=0;t=60, "req";r=7;t=20',
        "ratelimit-policy": '"bytes";q=1000;qu="content-bytes";w=60, "req";q=10;w=60'},
        request_limit=10, request_remaining=7, request_reset_ms=20_000),
    row("explicit-requests-unit", {"ratelimit-policy": '"p";q=5;qu="requests";w=60'},
        request_limit=5),
    row("partition-key-ignored", {"ratelimit": '"default";r=3;t=4;pk=:YWJj:'},
        request_remaining=3, request_reset_ms=4_000),
    row("quoted-comma-and-semicolon", {"ratelimit": r'"a,b;c\"d";r=1;t=2',
                                       "ratelimit-policy": r'"a,b;c\"d";q=5;w=60'},
        request_limit=5, request_remaining=1, request_reset_ms=2_000),
    row("upper-case-params", {"ratelimit": '"default";R=5;T=6'},
        request_remaining=5, request_reset_ms=6_000),
    row("draft-06-dictionary", {"ratelimit": "limit=10, remaining=0, reset=5"},
        request_limit=10, request_remaining=0, request_reset_ms=5_000),
    row("draft-06-dictionary-wins-over-policy", {"ratelimit": "limit=10, remaining=1",
                                                 "ratelimit-policy": "50;w=60"},
        request_limit=10, request_remaining=1),
    row("draft-06-integer-policies", {"ratelimit-policy": "10;w=1, 50;w=60"}, request_limit=50),
    row("zero-quota", {"ratelimit-policy": '"off";q=0;w=60'}, request_limit=0),
    row("zero-window", {"ratelimit-policy": '"z";q=3;w=0'}, request_limit=3),
    row("bad-item-skipped", {"ratelimit": '"a";r=-1;t=1, "b";r=4;t=2'},
        request_remaining=4, request_reset_ms=2_000),
    row("bad-reset-kept-remaining", {"ratelimit": '"a";r=4;t=soon'}, request_remaining=4),
]

STRUCTURED_MALFORMED = [
    bad("no-remaining", {"ratelimit": '"default";t=30'}),
    bad("negative-remaining", {"ratelimit": '"default";r=-1;t=30'}),
    bad("inner-list", {"ratelimit": '("a" "b");r=1;t=2'}),
    bad("unbalanced-quote", {"ratelimit": '"abc;r=1;t=2'}),
    bad("only-commas", {"ratelimit": ",,,", "ratelimit-policy": ";;;"}),
    bad("empty-param", {"ratelimit": '"a";r=;t=', "ratelimit-policy": '"a";q=;w='}),
    bad("bare-key", {"ratelimit": '"a";r;t'}),
    bad("policy-without-quota", {"ratelimit-policy": '"a";w=60'}),
    bad("policy-other-unit-only", {"ratelimit-policy": '"b";q=1000;qu="content-bytes"'}),
    bad("item-of-other-unit", {"ratelimit": '"b";r=0;t=5',
                               "ratelimit-policy": '"b";q=9;qu="concurrent-requests"'}),
    bad("dictionary-garbage", {"ratelimit": "limit=x, remaining=-1, reset=soon"}),
    bad("ten-kb", {"ratelimit": '"a";r=1;t=2, ' * 800}),
]


@pytest.mark.parametrize(("headers", "expected"), STRUCTURED + STRUCTURED_MALFORMED)
def test_structured_fields(headers: dict[str, Any], expected: RateLimitInfo) -> None:
    check(headers, expected)


# --- GitHub / Twitter / Discord: x-ratelimit-{limit,remaining,reset} -------------------------

GITHUB = [
    row("epoch-seconds", {"x-ratelimit-limit": "5000", "x-ratelimit-remaining": "4999",
                          "x-ratelimit-reset": str(T0_S + 1_800)},
        request_limit=5_000, request_remaining=4_999, request_reset_ms=1_800_000),
    row("delta-seconds", {"x-ratelimit-reset": "30"}, request_reset_ms=30_000),
    row("epoch-in-the-past", {"x-ratelimit-reset": str(T0_S - 10)}, request_reset_ms=0),
    row("epoch-ms", {"x-ratelimit-reset": str(T0 + 250)}, request_reset_ms=250),
    row("fractional-epoch", {"x-ratelimit-reset": f"{T0_S + 1}.5"}, request_reset_ms=1_500),
    row("first-epoch-second", {"x-ratelimit-reset": str(rl.EPOCH_SECONDS_FROM)},
        request_reset_ms=0),
]

GITHUB_MALFORMED = [
    bad("negative", {"x-ratelimit-reset": "-5"}),
    bad("word", {"x-ratelimit-reset": "abc"}),
    bad("exponent", {"x-ratelimit-reset": "1e9"}),
    bad("delta-beyond-a-year", {"x-ratelimit-reset": "99999999"}),
    bad("epoch-beyond-a-year", {"x-ratelimit-reset": str(T0_S + 400 * 86_400)}),
    bad("empty-remaining", {"X-RateLimit-Remaining": ""}),
    bad("negative-limit", {"x-ratelimit-limit": "-1"}),
    bad("ten-kb", {"x-ratelimit-reset": TEN_KB}),
]


@pytest.mark.parametrize(("headers", "expected"), GITHUB + GITHUB_MALFORMED)
def test_github_style(headers: dict[str, Any], expected: RateLimitInfo) -> None:
    check(headers, expected)


# --- real responses, as the upstreams send them ----------------------------------------------

def test_an_openai_429() -> None:
    info = parse({
        "Date": "Fri, 15 Jan 2027 08:00:00 GMT", "Content-Type": "application/json",
        "x-ratelimit-limit-requests": "500", "x-ratelimit-limit-tokens": "30000",
        "x-ratelimit-remaining-requests": "499", "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-requests": "120ms", "x-ratelimit-reset-tokens": "7.66s",
        "retry-after": "8", "retry-after-ms": "7660", "set-cookie": "__cf_bm=x; path=/",
    })
    assert info == RateLimitInfo(
        retry_after_ms=7_660, request_limit=500, request_remaining=499, request_reset_ms=120,
        token_limit=30_000, token_remaining=0, token_reset_ms=7_660,
        request_window_ms=60_000, retry_after_from="retry-after-ms",
    )


def test_an_anthropic_429() -> None:
    info = parse({
        "retry-after": "12",
        "anthropic-ratelimit-requests-limit": "4000",
        "anthropic-ratelimit-requests-remaining": "3999",
        "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:00.015Z",
        "anthropic-ratelimit-tokens-limit": "400000",
        "anthropic-ratelimit-tokens-remaining": "0",
        "anthropic-ratelimit-tokens-reset": "2027-01-15T08:00:12Z",
        "anthropic-ratelimit-input-tokens-limit": "400000",
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": "2027-01-15T08:00:12Z",
        "request-id": "req_018EeWyXxfu5pfWkrYcMdjWG",
    })
    assert info == RateLimitInfo(
        retry_after_ms=12_000, request_limit=4_000, request_remaining=3_999, request_reset_ms=15,
        token_limit=400_000, token_remaining=0, token_reset_ms=12_000,
        request_window_ms=60_000, retry_after_from="retry-after",
    )


def test_a_github_403() -> None:
    info = parse({"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0",
                  "X-RateLimit-Reset": str(T0_S + 42), "X-RateLimit-Used": "60",
                  "X-RateLimit-Resource": "core"})
    assert info == RateLimitInfo(request_limit=60, request_remaining=0, request_reset_ms=42_000,
                                 request_window_ms=3_600_000)  # GitHub's limits are per hour


# --- names are case-insensitive --------------------------------------------------------------

EVERY_DIALECT = {
    "retry-after": "2", "retry-after-ms": "1500",
    "anthropic-ratelimit-tokens-limit": "1000", "anthropic-ratelimit-tokens-remaining": "10",
    "anthropic-ratelimit-tokens-reset": "2027-01-15T08:00:03Z",
    "x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "5",
    "x-ratelimit-reset-requests": "4s",
    "ratelimit": '"default";r=50;t=30', "ratelimit-policy": '"default";q=100;w=60',
    "ratelimit-limit": "7", "ratelimit-remaining": "6", "ratelimit-reset": "5",
    "x-ratelimit-limit": "5000", "x-ratelimit-remaining": "4000", "x-ratelimit-reset": "9",
}


@pytest.mark.parametrize("spell", [str.upper, str.title, str.lower,
                                   lambda n: "".join(c.upper() if i % 2 else c
                                                     for i, c in enumerate(n))],
                         ids=["upper", "title", "lower", "mixed"])
def test_header_names_are_case_insensitive(spell: Any) -> None:
    expected = parse(EVERY_DIALECT)
    assert not expected.is_empty()
    assert parse({spell(name): value for name, value in EVERY_DIALECT.items()}) == expected


def test_values_keep_their_case_where_it_does_not_matter() -> None:
    assert parse({"Retry-After": "fri, 15 jan 2027 08:00:30 gmt"}).retry_after_ms == 30_000
    assert parse({"x-ratelimit-reset-requests": "1S"}).is_empty()  # Go units are lower case


def test_one_name_in_two_spellings_is_joined_as_http_joins_a_repeated_field() -> None:
    # A scalar that becomes a list is ambiguous: ignored.
    assert parse({"Retry-After": "5", "retry-after": "5"}).is_empty()
    # A list field simply gets more members; the most restrictive still wins.
    joined = parse({"RateLimit": '"a";r=5;t=1', "ratelimit": '"b";r=1;t=1'})
    assert joined.request_remaining == 1


def test_unknown_headers_and_non_string_entries_are_ignored() -> None:
    assert parse({}).is_empty()
    assert parse({"content-type": "application/json", "x-request-id": "1"}).is_empty()
    assert parse({"retry-after": None, 5: "5", "x-ratelimit-limit": 3}).is_empty()
    assert parse({" Retry-After ": "4"}).retry_after_ms == 4_000


# --- precedence between dialects -------------------------------------------------------------

# Each dialect's own request limit; the more specific dialect wins.
REQUEST_DIALECTS = [
    ("anthropic", {"anthropic-ratelimit-requests-limit": "1"}),
    ("openai", {"x-ratelimit-limit-requests": "2"}),
    ("structured", {"ratelimit-policy": '"p";q=3;w=60'}),
    ("ietf", {"ratelimit-limit": "4"}),
    ("github", {"x-ratelimit-limit": "5"}),
]


@pytest.mark.parametrize("top", range(len(REQUEST_DIALECTS)),
                         ids=[name for name, _ in REQUEST_DIALECTS])
def test_the_most_specific_dialect_gives_the_request_limit(top: int) -> None:
    headers: dict[str, str] = {}
    for _, dialect in reversed(REQUEST_DIALECTS[top:]):  # insertion order must not matter
        headers.update(dialect)
    assert parse(headers).request_limit == top + 1


def test_precedence_is_per_field_so_a_lower_dialect_fills_the_gaps() -> None:
    info = parse({
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "-1",  # malformed: the next dialect's is used
        "x-ratelimit-remaining-requests": "7",
        "x-ratelimit-reset": "30",
    })
    assert (info.request_limit, info.request_remaining, info.request_reset_ms) == (50, 7, 30_000)


def test_token_fields_prefer_anthropic_over_openai() -> None:
    info = parse({"anthropic-ratelimit-tokens-remaining": "10",
                  "x-ratelimit-remaining-tokens": "20", "x-ratelimit-limit-tokens": "100"})
    assert (info.token_limit, info.token_remaining) == (100, 10)


def test_every_dialect_at_once() -> None:
    assert parse(EVERY_DIALECT) == RateLimitInfo(
        retry_after_ms=1_500,  # retry-after-ms over retry-after
        request_limit=60, request_remaining=5, request_reset_ms=4_000,  # OpenAI
        token_limit=1_000, token_remaining=10, token_reset_ms=3_000,  # Anthropic
        request_window_ms=60_000, retry_after_from="retry-after-ms",
    )


def test_absolute_times_are_judged_against_the_given_now() -> None:
    headers = {"retry-after": "Fri, 15 Jan 2027 08:01:00 GMT",
               "anthropic-ratelimit-requests-reset": "2027-01-15T08:01:00Z",
               "x-ratelimit-reset": str(T0_S + 60)}
    assert parse_rate_limit_headers(headers, T0).retry_after_ms == 60_000
    later = parse_rate_limit_headers(headers, T0 + 45_000)
    assert (later.retry_after_ms, later.request_reset_ms) == (15_000, 15_000)
    assert parse_rate_limit_headers(headers, T0 + 120_000).retry_after_ms == 0


# --- merge and is_empty ----------------------------------------------------------------------

PARSED = RateLimitInfo(retry_after_ms=3_000, request_limit=60, request_remaining=5,
                       request_reset_ms=1_000, token_limit=1_000)


@pytest.mark.parametrize(("rate", "expected"), [
    pytest.param(None, PARSED, id="no-rate"),
    pytest.param(RateLimitInfo(), PARSED, id="empty-rate"),
    pytest.param(RateLimitInfo(request_remaining=0, token_reset_ms=500),
                 RateLimitInfo(retry_after_ms=3_000, request_limit=60, request_remaining=0,
                               request_reset_ms=1_000, token_limit=1_000, token_reset_ms=500),
                 id="rate-wins-field-by-field"),
    pytest.param(RateLimitInfo(retry_after_ms=0, request_limit=0),
                 RateLimitInfo(retry_after_ms=0, request_limit=0, request_remaining=5,
                               request_reset_ms=1_000, token_limit=1_000),
                 id="zero-is-a-value"),
])
def test_merge(rate: RateLimitInfo | None, expected: RateLimitInfo) -> None:
    assert merge(rate, PARSED) == expected


def test_merge_over_nothing_parsed_is_the_rate() -> None:
    rate = RateLimitInfo(request_limit=10, request_reset_ms=0)
    assert merge(rate, RateLimitInfo()) == rate
    assert merge(None, RateLimitInfo()).is_empty()


def test_merge_of_rate_and_headers_as_a_release_sends_them() -> None:
    # SPEC §4.4 "rate-and-headers": {"rate": {"remaining": 0, "reset_ms": 500},
    # "headers": {"retry-after": "7"}}
    parsed = parse({"retry-after": "7", "x-ratelimit-remaining-requests": "3"})
    merged = merge(RateLimitInfo(request_remaining=0, request_reset_ms=500), parsed)
    assert merged == RateLimitInfo(retry_after_ms=7_000, request_remaining=0, request_reset_ms=500,
                                   retry_after_from="retry-after")


@pytest.mark.parametrize("field", [f.name for f in fields(RateLimitInfo)])
def test_is_empty(field: str) -> None:
    assert RateLimitInfo().is_empty()
    assert not RateLimitInfo(**{field: 0}).is_empty()


# --- never a crash ---------------------------------------------------------------------------

NAMES = sorted(rl._HEADERS)
NASTY = [
    "", " ", "-1", "-0", "+1", "NaN", "nan", "inf", "-inf", "1e309", "0x1F", "١٢٣", "\x00",
    "\ud800", "\t1\t", "1" * 10_240, "9" * 400, "." , "..", "1.", "1..2", "0.000000000000001",
    "Wed, 32 Oct 2026 07:28:00 GMT", "Mon, 01 Jan 0000 00:00:00 GMT",
    "1 Jan 2026 00:00:00 +9999999", "Fri, 31 Dec 9999 23:59:59 -2359",
    "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-23:59", "9999-12-31T23:59:59.9999999Z",
    '"', "(", ")", '"a";r=', ";;;", ",,,", "=", "r=1;t=", '"a";r=1;t=1e9', "limit=, reset=-",
    '"\\', '"a\\"', "1h" * 5_000, "999999999999999999999h", "1.5.5s", "µs",
    str(2**64), str(10**18), f"{T0_S}", f"{T0}", f"{T0 * 1000}",
]


@pytest.mark.parametrize("value", NASTY, ids=range(len(NASTY)))
def test_nasty_values_in_every_header_never_raise(value: str) -> None:
    assert_sane(parse({name: value for name in NAMES}))


def assert_sane(info: RateLimitInfo) -> None:
    assert isinstance(info, RateLimitInfo)
    for f in fields(info):
        value = getattr(info, f.name)
        if value is None:
            continue
        if f.name == "retry_after_from":
            assert value in ("retry-after", "retry-after-ms"), value
            continue
        assert type(value) is int and value >= 0, (f.name, value)
        bound = rl.MAX_DELAY_MS if f.name.endswith("_ms") else rl.MAX_COUNT
        assert value <= bound, (f.name, value)


FRAGMENTS = [
    "0", "1", "7", "59", "100", "-", ".", ",", ";", "=", '"', "\\", " ", "s", "ms", "m", "h", "us",
    "µs", "r", "t", "q", "w", "qu", "limit", "remaining", "reset", "Z", "T", ":", "+", "GMT",
    "Fri, 15 Jan 2027", "08:00:30", "2027-01-15", "default", "(", ")", "e", "NaN", "\x00", "é",
]


def test_random_values_never_raise() -> None:
    rng = random.Random(20270115)  # seeded: a failure reproduces
    for _ in range(3_000):
        headers = {
            rng.choice([str.upper, str.lower, str.title])(rng.choice(NAMES)):
                "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 12)))
            for _ in range(rng.randint(0, 8))
        }
        assert_sane(parse_rate_limit_headers(headers, rng.randint(0, 2 * T0)))


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # hypothesis is in the test extras; the seeded test above still runs

    @pytest.mark.skip(reason="hypothesis is not installed")
    def test_any_headers_never_raise() -> None:
        pass

else:
    _name = st.one_of(st.sampled_from(NAMES), st.text(max_size=30)).map(
        lambda n: n.upper() if len(n) % 3 == 0 else n)
    _value = st.one_of(
        st.text(max_size=60),
        st.lists(st.sampled_from(FRAGMENTS), max_size=20).map("".join),
        st.from_regex(r"\A-?[0-9]{0,25}(\.[0-9]{0,25})?(ns|us|ms|s|m|h)?\Z"),
        st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
        st.datetimes(timezones=st.just(UTC)).map(lambda d: format_datetime(d, usegmt=True)),
        st.integers().map(str),
        st.floats().map(str),
    )

    @settings(max_examples=500, deadline=None)
    @given(headers=st.dictionaries(_name, _value, max_size=12),
           now_ms=st.integers(min_value=0, max_value=4 * T0))
    def test_any_headers_never_raise(headers: dict[str, str], now_ms: int) -> None:
        assert_sane(parse_rate_limit_headers(headers, now_ms))


# --- the window a request limit counts over, and where a retry hint came from ----------------

WINDOWS = [
    pytest.param({"x-ratelimit-limit-requests": "500"}, 60_000, id="openai-per-minute"),
    pytest.param({"anthropic-ratelimit-requests-limit": "50"}, 60_000,
                 id="anthropic-per-minute"),
    pytest.param({"x-ratelimit-limit": "5000", "x-ratelimit-reset": str(T0_S + 60)}, 3_600_000,
                 id="github-per-hour"),
    pytest.param({"ratelimit-policy": '"day";q=1000;w=86400'}, 86_400_000,
                 id="policy-states-its-window"),
    pytest.param({"retry-after": "3"}, None, id="no-limit-no-window"),
]


@pytest.mark.parametrize(("headers", "window_ms"), WINDOWS)
def test_the_window_follows_the_dialect(headers: dict[str, Any], window_ms: int | None) -> None:
    assert parse(headers).request_window_ms == window_ms


SOURCES = [
    pytest.param({"retry-after": "30"}, "retry-after", id="seconds"),
    pytest.param({"retry-after": "Fri, 15 Jan 2027 08:00:30 GMT"}, "retry-after", id="date"),
    pytest.param({"retry-after-ms": "250"}, "retry-after-ms", id="ms"),
    pytest.param({"retry-after": "1", "retry-after-ms": "157"}, "retry-after-ms",
                 id="ms-wins"),
    pytest.param({"retry-after": "3", "retry-after-ms": "-1"}, "retry-after",
                 id="bad-ms-falls-back"),
    pytest.param({"retry-after": "soon"}, None, id="no-hint"),
]


@pytest.mark.parametrize(("headers", "source"), SOURCES)
def test_the_hint_names_the_header_it_came_from(headers: dict[str, Any],
                                                source: str | None) -> None:
    assert parse(headers).retry_after_from == source
