"""An upstream's rate-limit state from its response headers (SPEC §4.4, §4.5).

Pure: no I/O and no clock reading; absolute times are turned into delays
against the `now_ms` the caller passes. Header names are matched
case-insensitively. A value that does not parse (negative, NaN, a garbage
date, absurdly large, longer than MAX_VALUE_CHARS) is ignored, never raised.

Dialects understood, and where they come from:

- `retry-after`: RFC 9110 §10.2.3, delay-seconds (a fraction is tolerated) or
  an HTTP-date. `retry-after-ms`: OpenAI's and Azure OpenAI's millisecond
  variant.
- `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`: OpenAI (and the
  many APIs that copy it); reset is a Go `time.Duration` string (`1s`,
  `6m0s`, `20ms`, `1h2m3.5s`); a bare number is read as seconds.
- `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`: Anthropic;
  reset is an RFC 3339 time. (Anthropic's `tokens-*` already report the most
  restrictive of its token limits, so `input-tokens-*` and `output-tokens-*`
  are not read.)
- `ratelimit-{limit,remaining,reset}`: draft-ietf-httpapi-ratelimit-headers up
  to -05; reset in delta seconds. A limit written as a list
  (`10, 10;w=1, 50;w=60`) gives its first number.
- `ratelimit` / `ratelimit-policy`: the structured fields (RFC 9651) of
  draft-ietf-httpapi-ratelimit-headers -07 and later
  (`ratelimit: "default";r=50;t=30`, `ratelimit-policy: "default";q=100;w=60`),
  plus draft -06's dictionary form (`ratelimit: limit=10, remaining=0, reset=5`)
  and its integer policies (`ratelimit-policy: 10;w=1, 50;w=60`). Policies
  whose quota unit `qu` is not "requests", and the items naming them, are
  skipped. Of several items the most restrictive wins: the lowest remaining
  (ties: the later reset); the limit is that item's policy's quota, or, when
  no policy has its name, the policy with the smallest quota per second
  (q/w, a missing w counting as 1).
- `x-ratelimit-{limit,remaining,reset}`: GitHub, Twitter/X, Discord and many
  others; reset is Unix epoch seconds when it looks like one (>= 1e9, i.e.
  after 2001-09-09), epoch milliseconds when >= 1e12, otherwise delta seconds.
  The same reading is tolerated for `ratelimit-reset`.

Precedence when several dialects give the same field: each field is taken
from the most specific dialect that gives a valid value for it, in this order:
Anthropic, OpenAI (both name the unit, requests or tokens), the structured
IETF fields, the older IETF fields, then the bare `x-ratelimit-*`. For the retry
hint, likewise, a valid `retry-after-ms` wins over `retry-after`: servers that
send both (OpenAI) send the same instant twice, `retry-after` rounded up to
whole seconds, so taking the larger would turn a 150 ms hint into a 1 s pause
(openai-python also reads `retry-after-ms` first).

Units: `*_limit` and `*_remaining` are counts as the upstream states them, per
its own window (which only the structured `ratelimit-policy` names; OpenAI and
Anthropic report per minute, GitHub per hour). Delays are whole milliseconds,
rounded up so that nobody retries early; a time already past is a delay of 0.

If the mapping holds one name in several spellings (`Retry-After` and
`retry-after`), their values are joined with ", " in iteration order, as HTTP
joins a repeated field (RFC 9110 §5.3); a scalar that then holds a list is
ignored, as the values disagree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from email.utils import parsedate_to_datetime
from fractions import Fraction

MAX_VALUE_CHARS = 1024  # a longer value is ignored without being parsed
MAX_COUNT = 2**63 - 1  # fits a signed 64-bit database column
MAX_DELAY_MS = 366 * 86_400_000  # a reset or retry hint more than a year out is not believed
EPOCH_SECONDS_FROM = 1_000_000_000  # 2001-09-09 as Unix seconds
EPOCH_MILLIS_FROM = 1_000_000_000_000  # the same instant in milliseconds
MINUTE_MS = 60_000
HOUR_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class RateLimitInfo:
    retry_after_ms: int | None = None  # pause new calls for this long
    request_limit: int | None = None  # requests allowed per window
    request_remaining: int | None = None
    request_reset_ms: int | None = None  # ms from now until the request window resets
    token_limit: int | None = None
    token_remaining: int | None = None
    token_reset_ms: int | None = None
    # The window `request_limit` counts over, when the dialect says (SPEC §4.5):
    # a policy's `w`, per minute for OpenAI and Anthropic, per hour for GitHub.
    request_window_ms: int | None = None
    retry_after_from: str | None = None  # "retry-after-ms" or "retry-after"

    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))


def merge(rate: RateLimitInfo | None, parsed: RateLimitInfo) -> RateLimitInfo:
    """Pre-parsed `rate` over the parsed headers (SPEC §4.4: `rate` wins), field
    by field: a field `rate` leaves unset is taken from `parsed`."""
    if rate is None:
        return parsed
    values: dict[str, object] = {}
    for f in fields(RateLimitInfo):
        mine = getattr(rate, f.name)
        values[f.name] = mine if mine is not None else getattr(parsed, f.name)
    return RateLimitInfo(**values)  # type: ignore[arg-type]


def parse_rate_limit_headers(headers: Mapping[str, str], now_ms: int) -> RateLimitInfo:
    """The rate-limit state that `headers` describe; an empty RateLimitInfo if none."""
    h = _fold(headers)

    precise_ms = _delay_text_ms(h.get("retry-after-ms"), Decimal(1))  # OpenAI / Azure
    retry_after_ms = _first((precise_ms, _retry_after_ms(h.get("retry-after"), now_ms)))
    retry_after_from = None
    if retry_after_ms is not None:
        retry_after_from = "retry-after-ms" if precise_ms is not None else "retry-after"

    anthropic_req = _anthropic(h, "requests", now_ms)
    anthropic_tok = _anthropic(h, "tokens", now_ms)
    openai_req = _openai(h, "requests")
    openai_tok = _openai(h, "tokens")
    structured = _structured(h)
    ietf = _Triple(  # draft-ietf-httpapi-ratelimit-headers up to -05
        _first_count(h.get("ratelimit-limit")),
        _count(h.get("ratelimit-remaining")),
        _epoch_or_delta_ms(h.get("ratelimit-reset"), now_ms),
    )
    github = _Triple(  # GitHub, Twitter/X, Discord: the de facto x-ratelimit-*
        _count(h.get("x-ratelimit-limit")),
        _count(h.get("x-ratelimit-remaining")),
        _epoch_or_delta_ms(h.get("x-ratelimit-reset"), now_ms),
        HOUR_MS,  # GitHub's limits are per hour
    )
    requests = (anthropic_req, openai_req, structured, ietf, github)  # most specific first
    tokens = (anthropic_tok, openai_tok)
    return RateLimitInfo(
        retry_after_ms=retry_after_ms,
        request_limit=_first(t.limit for t in requests),
        request_remaining=_first(t.remaining for t in requests),
        request_reset_ms=_first(t.reset_ms for t in requests),
        token_limit=_first(t.limit for t in tokens),
        token_remaining=_first(t.remaining for t in tokens),
        token_reset_ms=_first(t.reset_ms for t in tokens),
        request_window_ms=next((t.window_ms for t in requests if t.limit is not None), None),
        retry_after_from=retry_after_from,
    )


# --- the dialects ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Triple:
    limit: int | None = None
    remaining: int | None = None
    reset_ms: int | None = None
    window_ms: int | None = None  # the window `limit` counts over, when known


def _anthropic(h: Mapping[str, str], unit: str, now_ms: int) -> _Triple:
    # Anthropic: anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}, reset RFC 3339.
    prefix = f"anthropic-ratelimit-{unit}-"
    return _Triple(
        _count(h.get(prefix + "limit")),
        _count(h.get(prefix + "remaining")),
        _rfc3339_delay_ms(h.get(prefix + "reset"), now_ms),
        MINUTE_MS,
    )


def _openai(h: Mapping[str, str], unit: str) -> _Triple:
    # OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens}, reset a Go duration.
    return _Triple(
        _count(h.get(f"x-ratelimit-limit-{unit}")),
        _count(h.get(f"x-ratelimit-remaining-{unit}")),
        _duration_ms(h.get(f"x-ratelimit-reset-{unit}")),
        MINUTE_MS,
    )


@dataclass(frozen=True, slots=True)
class _Policy:
    name: str
    quota: int
    window_s: int | None


def _structured(h: Mapping[str, str]) -> _Triple:
    # draft-ietf-httpapi-ratelimit-headers -06 (dictionary) and -07+ (named policies, RFC 9651).
    policies: list[_Policy] = []
    other_units: set[str] = set()
    for item, params in _sf_list(h.get("ratelimit-policy")):
        unit = params.get("qu", "requests")
        if unit != "requests":
            other_units.add(item)
            continue
        quota = _count(params["q"]) if "q" in params else _count(item)
        if quota is not None:
            policies.append(_Policy(item, quota, _count(params.get("w"))))

    limit: int | None = None
    remaining: int | None = None
    reset_ms: int | None = None
    chosen_name: str | None = None
    members = _sf_list(h.get("ratelimit"))
    dictionary = {m[1].lower(): m[2] for item, _ in members if (m := _DICT_MEMBER.fullmatch(item))}
    if dictionary:
        # Draft -06: `ratelimit: limit=10, remaining=0, reset=5`.
        limit = _count(dictionary.get("limit"))
        remaining = _count(dictionary.get("remaining"))
        reset_ms = _delay_text_ms(dictionary.get("reset"), Decimal(1000))
    else:
        # Draft -07+: `ratelimit: "name";r=<remaining>;t=<seconds>`; take the most restrictive.
        best: tuple[int, int] | None = None  # (remaining, -reset): the smaller, the tighter
        for item, params in members:
            r = _count(params.get("r"))
            if r is None or item in other_units:
                continue
            t = _delay_text_ms(params.get("t"), Decimal(1000))
            key = (r, -(t if t is not None else -1))
            if best is None or key < best:  # on a tie the first listed stays
                best, remaining, reset_ms, chosen_name = key, r, t, item

    window_ms: int | None = None
    if limit is None and policies:
        named = [p for p in policies if p.name == chosen_name]
        policy = named[0] if named else min(
            policies, key=lambda p: Fraction(p.quota, p.window_s or 1))
        limit = policy.quota
        window_ms = policy.window_s * 1000 if policy.window_s else None
    return _Triple(limit, remaining, reset_ms, window_ms)


# --- values ----------------------------------------------------------------------------------

_FIELDS = ("limit", "remaining", "reset")
_UNITS = ("requests", "tokens")
_HEADERS = frozenset(
    {
        "retry-after",
        "retry-after-ms",
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    }
    | {f"x-ratelimit-{f}-{u}" for f in _FIELDS for u in _UNITS}
    | {f"anthropic-ratelimit-{u}-{f}" for f in _FIELDS for u in _UNITS}
)

_COUNT = re.compile(r"[0-9]{1,19}")
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
_DURATION = re.compile(r"(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNIT_MS = {
    "ns": Decimal("0.000001"),
    "us": Decimal("0.001"),
    "µs": Decimal("0.001"),  # U+00B5, as Go writes it
    "μs": Decimal("0.001"),  # U+03BC, which Go also accepts
    "ms": Decimal(1),
    "s": Decimal(1000),
    "m": Decimal(60_000),
    "h": Decimal(3_600_000),
}
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?"
    r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?"
)
_DICT_MEMBER = re.compile(r"(limit|remaining|reset)\s*=\s*(.*)", re.IGNORECASE | re.DOTALL)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


def _fold(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers this module reads, by lower-case name; repeated names joined."""
    found: dict[str, list[str]] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            continue  # typed Mapping[str, str], but the caller's JSON may say otherwise
        key = name.strip().lower()
        if key in _HEADERS:
            found.setdefault(key, []).append(value)
    return {key: ", ".join(values) for key, values in found.items()}


def _text(value: str | None) -> str | None:
    if value is None or len(value) > MAX_VALUE_CHARS:
        return None
    return value.strip() or None


def _first(values: Iterable[int | None]) -> int | None:
    for value in values:
        if value is not None:
            return value
    return None


def _count(value: str | None) -> int | None:
    text = _text(value)
    if text is None or not _COUNT.fullmatch(text):
        return None
    number = int(text)
    return number if number <= MAX_COUNT else None


def _first_count(value: str | None) -> int | None:
    """The leading number of a list such as `10, 10;w=1, 50;w=60` (IETF drafts -02..-05)."""
    text = _text(value)
    if text is None:
        return None
    return _count(text.split(",", 1)[0].split(";", 1)[0])


def _bounded_ms(ms: Decimal | int) -> int | None:
    if ms < 0 or ms > MAX_DELAY_MS:
        return None
    return math.ceil(ms)


def _delay_text_ms(value: str | None, unit_ms: Decimal) -> int | None:
    """A non-negative decimal number of `unit_ms` milliseconds, rounded up."""
    text = _text(value)
    if text is None or not _DECIMAL.fullmatch(text):
        return None
    return _bounded_ms(Decimal(text) * unit_ms)


def _until_ms(epoch_ms: Decimal | int, now_ms: int) -> int | None:
    """Milliseconds from now until an absolute time; 0 when it has passed."""
    return _bounded_ms(max(Decimal(0), Decimal(epoch_ms) - now_ms))


def _retry_after_ms(value: str | None, now_ms: int) -> int | None:
    # RFC 9110 §10.2.3: delay-seconds, or an HTTP-date (IMF-fixdate, RFC 850, asctime).
    text = _text(value)
    if text is None:
        return None
    if _DECIMAL.fullmatch(text):
        return _delay_text_ms(text, Decimal(1000))
    if not any(c.isalpha() for c in text):
        return None
    try:
        when = parsedate_to_datetime(text)
    except (ValueError, TypeError, IndexError, OverflowError):
        return None  # the stdlib raises any of these on garbage
    return _datetime_delay_ms(when, now_ms)


def _rfc3339_delay_ms(value: str | None, now_ms: int) -> int | None:
    text = _text(value)
    if text is None:
        return None
    text = text.upper()  # RFC 3339 §5.6 allows `t` and `z`; fromisoformat does not
    if not _RFC3339.fullmatch(text):
        return None
    try:
        when = datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        return None
    return _datetime_delay_ms(when, now_ms)


def _datetime_delay_ms(when: datetime, now_ms: int) -> int | None:
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # `-0000` dates and offset-less times: taken as UTC
    try:
        epoch_us = (when - _EPOCH) // _ONE_US
    except (ValueError, OverflowError):
        return None
    return _until_ms(Decimal(epoch_us) / 1000, now_ms)


def _duration_ms(value: str | None) -> int | None:
    # Go's time.ParseDuration syntax, unsigned: a sequence of <decimal><unit>.
    text = _text(value)
    if text is None:
        return None
    if _DECIMAL.fullmatch(text):
        return _delay_text_ms(text, Decimal(1000))  # a bare number: seconds
    if not _DURATION.fullmatch(text):
        return None
    total = sum(
        (Decimal(number) * _DURATION_UNIT_MS[unit] for number, unit in
         _DURATION_PART.findall(text)),
        Decimal(0),
    )
    return _bounded_ms(total)


def _epoch_or_delta_ms(value: str | None, now_ms: int) -> int | None:
    # GitHub/Twitter style: Unix seconds (or milliseconds) if it looks like one, else a delay.
    text = _text(value)
    if text is None or not _DECIMAL.fullmatch(text):
        return None
    number = Decimal(text)
    if number >= EPOCH_MILLIS_FROM:
        return _until_ms(number, now_ms)
    if number >= EPOCH_SECONDS_FROM:
        return _until_ms(number * 1000, now_ms)
    return _bounded_ms(number * 1000)


def _sf_list(value: str | None) -> list[tuple[str, dict[str, str]]]:
    """An RFC 9651 list, read tolerantly: (item, {param: value}) per member, with
    quoted strings unquoted, keys lower-cased, a bare key's value "?1" and inner
    lists skipped. Commas and semicolons inside quoted strings do not split."""
    text = _text(value)
    if text is None:
        return []
    members: list[tuple[str, dict[str, str]]] = []
    for member in _split_unquoted(text, ","):
        parts = _split_unquoted(member, ";")
        item = parts[0].strip()
        if not item or item.startswith("("):
            continue
        params: dict[str, str] = {}
        for part in parts[1:]:
            key, eq, raw = part.partition("=")
            key = key.strip().lower()
            if key and key not in params:  # RFC 9651 says the last wins; the first is as good
                params[key] = _unquote(raw.strip()) if eq else "?1"
        members.append((_unquote(item), params))
    return members


def _split_unquoted(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    start = 0
    quoted = escaped = False
    for i, c in enumerate(text):
        if escaped:
            escaped = False
        elif c == "\\" and quoted:
            escaped = True
        elif c == '"':
            quoted = not quoted
        elif c == sep and not quoted:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text
