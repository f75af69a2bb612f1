"""Click parameter types for fencepost's values: names, JSON objects, headers, seconds."""

from __future__ import annotations

import json
import math
import os
import re
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


class Duration(click.ParamType[int]):
    """A length of time: a number with a unit (`s`, `m`, `h`, `d`: `90s`,
    `15m`, `24h`, `7d`) or plain seconds, within [low, high] seconds; the
    value is in milliseconds."""

    name = "duration"
    _UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        number, unit = (text[:-1], text[-1]) if text[-1:] in self._UNITS else (text, "s")
        seconds = _float_or(number, math.nan) * self._UNITS[unit]
        if not math.isfinite(seconds) or not self.low <= seconds <= self.high:
            self.fail(f"{value!r} is not a duration from {_said(self.low)} to "
                      f"{_said(self.high)} (such as 90s, 15m, 24h or 7d).", param, ctx)
        return round(seconds * 1000)


def _said(seconds: float) -> str:
    return f"{seconds / 86_400:g}d" if seconds >= 86_400 else f"{seconds:g}s"


def _float_or(text: str, otherwise: float = 0.0) -> float:
    try:
        return float(text)
    except ValueError:
        return otherwise  # not a number at all: FloatRange (or Duration) says so


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


class SecretHeader(click.ParamType[tuple[str, str]]):
    """A header whose value is a secret (a pool's upstream credentials, SPEC
    §4.7), named on the command line and read from where the secret already
    lives: `Name=env:VARIABLE` or `Name=file:PATH` (the file's content, one
    trailing newline dropped). A value written on the command line is refused:
    it would sit in the shell's history and in /proc for every local user."""

    name = "NAME=env:VAR|file:PATH"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        name, sep, source = str(value).partition("=")
        kind, colon, where = source.partition(":")
        if not sep or not name.strip() or not colon or kind not in ("env", "file") or not where:
            self.fail(f"{_shown(value)} names no source: write NAME=env:VARIABLE or "
                      "NAME=file:PATH (a secret on the command line would be in the shell's "
                      "history and visible to other users).", param, ctx)
        secret = _read_secret(kind, where)
        if secret is None:
            missing = "no environment variable" if kind == "env" else "no readable file"
            self.fail(f"{name.strip()}: {missing} {where!r}.", param, ctx)
        return name.strip(), secret


def _shown(value: Any) -> str:
    """An argument as an error message may show it: only the header name it
    starts with, in case the rest is the secret it should not be."""
    name = re.match(r"[!#$%&'*+.^_`|~0-9A-Za-z-]*", str(value))
    return repr((name.group(0) if name else "") + "...")


def _read_secret(kind: str, where: str) -> str | None:
    if kind == "env":
        return os.environ.get(where)
    try:
        with open(where, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError):
        return None
    return text[:-1] if text.endswith("\n") else text


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
