"""Path and header parameters as the route table declares them: the JSON Schema
the OpenAPI document shows is also what the app checks, so the two agree."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Literal

from fencepost.errors import FencepostError, InvalidRequest, NotFound, ValidationError
from fencepost.server.http import CANONICAL_UUID, required_uuid_header
from fencepost.server.messages import Request
from fencepost.server.validation import invalid_field


@dataclass(frozen=True, slots=True)
class Param:
    """A path, header or query parameter, the JSON Schema of its value, and the
    error the server answers when a value breaks it (with `refusal` as its
    message where the error is not a 422 naming the field)."""

    name: str
    where: Literal["path", "header", "query"]
    schema: dict[str, Any]
    description: str
    required: bool = False
    refused_with: type[FencepostError] | None = None
    refusal: str = ""


# The value of a checked parameter from the request, or None when an optional
# one is absent; raises the parameter's error when the value breaks its schema.
Check = Callable[[Request], "str | None"]


def check_of(param: Param) -> Check | None:
    """How the app checks `param` before the handler runs; None for the query
    (each route reads its own) and for headers it only passes on."""
    if param.where == "path":
        return _path_check(param)
    if param.where == "header":
        return _header_check(param)
    return None


def _path_check(param: Param) -> Check:
    schema = param.schema
    pattern = re.compile(schema["pattern"]) if "pattern" in schema else None
    enum = frozenset(schema.get("enum", ()))
    shortest, longest = schema.get("minLength", 0), schema.get("maxLength", sys.maxsize)
    name = param.name
    # U+0000 (a `%00` in the path) is refused like any other breach, so that the
    # store never sees it (PostgreSQL's TEXT cannot hold it, SPEC §2); a pattern
    # or an enum keeps it out too, but a key's `id` has neither.

    def check(request: Request) -> str:
        value = request.path_params[name]
        if (
            (pattern is not None and pattern.fullmatch(value) is None)
            or (enum and value not in enum)
            or not shortest <= len(value) <= longest
            or "\x00" in value
        ):
            raise _refusal(param)
        return value

    return check


def _refusal(param: Param) -> FencepostError:
    if param.refused_with is ValidationError:
        return invalid_field(param.name, f"must match {param.schema['pattern']}")
    if param.refused_with is NotFound:
        return NotFound(param.refusal)
    if param.refused_with is InvalidRequest:
        return InvalidRequest(param.refusal)
    raise AssertionError(f"no refusal for the path parameter {param.name}")


def _header_check(param: Param) -> Check:
    schema = param.schema
    header = param.name.lower()
    if schema.get("format") == "uuid":
        assert param.required and param.refused_with is InvalidRequest

        def uuid_check(request: Request) -> str:
            value = request.headers.get(header)
            if value is not None and CANONICAL_UUID.fullmatch(value):
                return value  # the usual form, without a second call
            return required_uuid_header(request, header)

        return uuid_check
    if schema.get("type") == "integer":
        assert not param.required and param.refused_with is InvalidRequest
        digits = len(str(schema["maximum"]))

        def integer_check(request: Request) -> str | None:
            value = request.headers.get(header)
            if value is None:
                return None
            value = value.strip()
            if not (value.isascii() and value.isdigit()) or len(value) > digits:
                raise InvalidRequest(param.refusal, details=[
                    {"field": param.name, "message": "not a number"}
                ])
            return value

        return integer_check
    assert param.refused_with is None, f"no check for the header {param.name}"

    def passed_on(request: Request) -> str | None:
        return request.headers.get(header)

    return passed_on
