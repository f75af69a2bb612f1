"""Click parameter types for fencepost's values: names, JSON objects, headers, seconds."""

from __future__ import annotations

import json
import math
from typing import Any

import click

from fencepost.core.names import is_valid_name

NAME_RULE = "letters, digits and . _ : - (starting with a letter or digit), up to 128"


class Seconds(click.FloatRange):
    """A number of seconds within a range. click's FloatRange lets `nan`
    through (no comparison with it is true), and a wait of nan seconds would
    then be nothing in one place and for ever in another."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not math.isfinite(_float_or(value)):
            self.fail(f"{value!r} is not a finite number of seconds.", param, ctx)
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(f"{value!r} is not a finite number of seconds.", param, ctx)
        return super().convert(value, param, ctx)


def _float_or(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0  # not a number at all: FloatRange says so


class NameType(click.ParamType[str]):
    """A lock key or pool name (SPEC §2); a bad one fails before any request."""

    name = "name"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if not isinstance(value, str) or not is_valid_name(value):
            self.fail(f"{value!r} is not a valid name ({NAME_RULE}).", param, ctx)
        return value


class JsonObject(click.ParamType[dict[str, Any]]):
    """A JSON object given on the command line."""

    name = "json"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> dict[str, Any]:
        if isinstance(value, dict):
            return value
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            self.fail(f"not valid JSON ({exc.msg} at position {exc.pos}).", param, ctx)
        if not isinstance(parsed, dict):
            self.fail("must be a JSON object, such as '{\"host\": \"ci-7\"}'.", param, ctx)
        return parsed


class HeaderType(click.ParamType[tuple[str, str]]):
    """An HTTP header as `Name: value`."""

    name = "header"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        name, sep, text = str(value).partition(":")
        if not sep or not name.strip():
            self.fail(f"{value!r} is not a header; write it as 'Name: value'.", param, ctx)
        return name.strip(), text.strip()


class UuidType(click.ParamType[str]):
    """A lock token (a UUID)."""

    name = "uuid"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        import uuid

        try:
            return str(uuid.UUID(str(value)))
        except ValueError:
            self.fail(f"{value!r} is not a UUID (lock tokens are UUIDs).", param, ctx)


NAME = NameType()
JSON_OBJECT = JsonObject()
HEADER = HeaderType()
UUID = UuidType()
