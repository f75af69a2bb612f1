"""Body decoding rules (SPEC §2 "Bad input") as pure functions: integral numbers are
integers where an integer is asked, and a repeated key anywhere is a 400, however the
body is spelled (the cheap count that skips the exact parse must never miss one)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencepost.errors import InvalidRequest, ValidationError
from fencepost.server import schemas
from fencepost.server.validation import decode_body

text = st.text(st.sampled_from("ab:\\\"é{}[], "), max_size=6)
scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | text
free_form = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(text, inner, max_size=3), max_leaves=12,
)


def _object(pairs: list[tuple[str, str]]) -> str:
    """A JSON object from already-encoded members, repeats kept as written."""
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs) + "}"


def _encode(value: Any, repeat_in: list[int], counter: list[int]) -> str:
    """`value` as JSON, repeating the first key of the object numbered `repeat_in`."""
    if isinstance(value, dict):
        number = counter[0]
        counter[0] += 1
        pairs = [(k, _encode(v, repeat_in, counter)) for k, v in value.items()]
        if pairs and number in repeat_in:
            pairs.append(pairs[0])
        return _object(pairs)
    if isinstance(value, list):
        return "[" + ", ".join(_encode(v, repeat_in, counter) for v in value) + "]"
    return json.dumps(value)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(metadata=st.dictionaries(text, free_form, max_size=4),
       operation=st.none() | st.text(st.sampled_from("x:\""), min_size=1, max_size=5),
       repeat=st.integers(-1, 6))
def test_a_repeated_key_anywhere_is_refused_and_none_is_found_where_none_is(
    metadata: dict[str, Any], operation: str | None, repeat: int
) -> None:
    body = {"ttl_seconds": 30, "metadata": metadata}
    if operation is not None:
        body["operation"] = operation
    counter = [0]
    encoded = _encode(body, [repeat], counter).encode()
    repeated = 0 <= repeat < counter[0] and encoded != _encode(body, [], [0]).encode()
    if repeated:
        with pytest.raises(InvalidRequest, match="repeats"):
            decode_body(encoded, schemas.AcquireLockBody)
    else:
        decoded = decode_body(encoded, schemas.AcquireLockBody)
        assert decoded.metadata == metadata and decoded.operation == operation


@pytest.mark.parametrize("number, expected", [
    ("60", 60), ("60.0", 60), ("6e1", 60), ("6.0E+1", 60), ("600e-1", 60), ("60.000", 60),
])
def test_an_integral_number_is_an_integer(number: str, expected: int) -> None:
    decoded = decode_body(b'{"ttl_seconds": %s}' % number.encode(), schemas.RenewLockBody)
    assert decoded.ttl_seconds == expected and type(decoded.ttl_seconds) is int


@pytest.mark.parametrize("number", ["60.5", "6.05e1", "1e400", "-1e400", "1e20", "4.0"])
def test_other_numbers_stay_422(number: str) -> None:
    with pytest.raises(ValidationError) as raised:
        decode_body(b'{"ttl_seconds": %s}' % number.encode(), schemas.RenewLockBody)
    assert [d["field"] for d in raised.value.details] == ["ttl_seconds"]


def test_free_form_numbers_are_kept_as_sent() -> None:
    decoded = decode_body(b'{"ttl_seconds": 3e1, "wait_seconds": 2.0, "metadata": {"n": 1.0}}',
                          schemas.AcquireLockBody)
    assert decoded.ttl_seconds == 30
    assert decoded.metadata == {"n": 1.0} and type(decoded.metadata["n"]) is float


def test_integral_numbers_in_nested_and_optional_fields() -> None:
    decoded = decode_body(b'{"status": 4.29e2, "rate": {"limit": 1e2, "reset_ms": 0.0}}',
                          schemas.ReleaseSlotBody)
    assert decoded.status == 429
    assert decoded.rate is not None and (decoded.rate.limit, decoded.rate.reset_ms) == (100, 0)


def test_details_still_name_every_bad_field_next_to_an_integral_one() -> None:
    with pytest.raises(ValidationError) as raised:
        decode_body(b'{"ttl_seconds": 30.0, "on_expiry": "never", "ttl": 1}',
                    schemas.AcquireLockBody)
    assert {d["field"] for d in raised.value.details} == {"on_expiry", "ttl"}


@pytest.mark.parametrize("depth", [600, 900, 5000])
def test_deeply_nested_metadata_is_a_400_never_an_error(depth: int) -> None:
    """Nesting that the decoder takes but the repeated-key count's recursion
    cannot follow is refused as too deep (it was a 500), as deeper nesting the
    decoder itself refuses is."""
    nested = "[" * depth + "]" * depth
    body = f'{{"ttl_seconds": 30, "metadata": {{"a": 1, "b": {{"c": {nested}}}}}}}'.encode()
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        decode_body(body, schemas.AcquireLockBody)
