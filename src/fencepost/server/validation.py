"""Decoding request bodies into Structs, naming every offending field on failure.

msgspec stops at the first error; when it fails we re-check each field on its
own so the 422 `details` list names all of them (SPEC §2 "Bad input").
"""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn, TypeVar

import msgspec

from fencepost.errors import InvalidRequest, ValidationError

T = TypeVar("T", bound=msgspec.Struct)
MAX_DETAILS = 32


def decode_body(body: bytes, cls: type[T]) -> T:
    if not body.strip():
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        return msgspec.json.decode(body, type=cls)
    except msgspec.ValidationError as exc:
        first_error = str(exc)  # explained below, on the slow path
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON ({exc}).") from None
    except RecursionError:
        raise InvalidRequest("The request body is nested too deeply.") from None
    except UnicodeDecodeError:
        raise InvalidRequest("The request body is not valid UTF-8.") from None
    # msgspec stops at the first bad field, possibly before reaching a syntax
    # error further on, and refuses numbers such as 1e400 even untyped. The
    # standard parser accepts any valid JSON, so it decides 400 versus 422 and
    # gives every field's value to check one by one.
    try:
        raw = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        raise InvalidRequest("The request body is not valid JSON.") from None
    raise ValidationError(field_errors(raw, cls) or [_detail_from(first_error)])


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def field_errors(raw: Any, cls: type[msgspec.Struct]) -> list[dict[str, str]]:
    if not isinstance(raw, dict):
        return [{"field": "body", "message": "expected a JSON object"}]
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    details: list[dict[str, str]] = []
    for name in raw:
        if name not in fields:
            details.append({"field": _shorten(name), "message": "unknown field"})
    for name, info in fields.items():
        if name not in raw:
            if info.required:
                details.append({"field": name, "message": "required field is missing"})
            continue
        try:
            msgspec.convert(raw[name], type=info.type, strict=True)
        except msgspec.ValidationError as exc:
            details.append({"field": name, "message": _plain(str(exc))})
    # Bounded: a hostile body with thousands of fields gets a short answer.
    return details[:MAX_DETAILS]


def _detail_from(msgspec_error: str) -> dict[str, str]:
    """A detail from msgspec's own message, e.g. a number out of range deep in metadata."""
    match = re.search(r"at `\$\.([A-Za-z0-9_]+)", msgspec_error)
    return {"field": match.group(1) if match else "body", "message": _plain(msgspec_error)}


def _shorten(name: str) -> str:
    return name if len(name) <= 64 else name[:61] + "..."


def _plain(message: str) -> str:
    # msgspec says "Expected `int` >= 5 - at `$`"; the location is the field itself.
    return message.split(" - at `$", 1)[0].replace("`", "")


def invalid_field(field: str, message: str) -> ValidationError:
    return ValidationError([{"field": field, "message": message}])
