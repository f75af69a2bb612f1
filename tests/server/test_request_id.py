"""Request IDs: the caller's echoed only when safe; new ones are version-4 UUIDs."""

from __future__ import annotations

import uuid

import pytest

from fencepost.server.request_id import caller_request_id, new_request_id, request_id_for


def test_new_ids_are_distinct_version_4_uuids() -> None:
    ids = [new_request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for value in ids[:1000]:
        parsed = uuid.UUID(value)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert str(parsed) == value  # canonical lower-case form


@pytest.mark.parametrize(
    "value", ["abc", "req-1:2/3", "x" * 128, "5f0e2c1a-8b7d-4e6f-a9c3-2d1b0a9f8e7d"]
)
def test_safe_caller_ids_are_echoed(value: str) -> None:
    assert caller_request_id(value) == value
    assert request_id_for(value) == value


@pytest.mark.parametrize("value", [
    None, "", "x" * 129, "has space", "tab\there", "new\nline", "caf\u00e9", "bell\x07",
    "del\x7f",
])
def test_unsafe_caller_ids_are_replaced(value: str | None) -> None:
    assert caller_request_id(value) is None
    replacement = request_id_for(value)
    assert uuid.UUID(replacement).version == 4
