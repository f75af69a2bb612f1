"""UUID headers: the usual form passes as is, other UUID spellings are
normalised to it, anything else is a 400."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from fencepost.errors import InvalidRequest
from fencepost.server.http import required_uuid_header
from fencepost.server.messages import Request


def request_with(headers: dict[str, str]) -> Request:
    return Request("PUT", "/", "", headers, None, b"", "", asyncio.Event())


def test_canonical_form_is_returned_unchanged() -> None:
    value = str(uuid.uuid4())
    assert required_uuid_header(request_with({"x-lock-token": value}), "x-lock-token") == value


@pytest.mark.parametrize("spell", [
    str.upper, lambda v: v.replace("-", ""), lambda v: "{" + v + "}", lambda v: "urn:uuid:" + v,
])
def test_other_spellings_become_the_canonical_form(spell: object) -> None:
    value = str(uuid.uuid4())
    header = spell(value)  # type: ignore[operator]
    assert required_uuid_header(request_with({"x-lock-token": header}), "x-lock-token") == value


# A fixed UUID with a digit too many: every test process collects the same ids.
@pytest.mark.parametrize("bad", ["", "nope", "0b7c8f0e-6a3d-4b8e-9f21-5c4d3e2a1b0f0", "g" * 32])
def test_anything_else_is_refused(bad: str) -> None:
    with pytest.raises(InvalidRequest):
        required_uuid_header(request_with({"x-lock-token": bad}), "x-lock-token")


def test_missing_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        required_uuid_header(request_with({}), "x-lock-token")
