"""Decoding request bodies into Structs, naming every offending field on failure.

SPEC §2 "Bad input": a body that is not JSON, or an object with a repeated key
(which value counts would be a guess), is a 400; a JSON number with an integral
value (`60.0`, `6e1`) is that integer where an integer is asked; anything else
that does not fit the Struct is a 422 whose `details` name every bad field
(msgspec stops at the first, so on failure each field is re-checked alone), and
so is a string anywhere in the body (an object key too) that holds U+0000.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, NoReturn, TypeVar

import msgspec
from msgspec import inspect

from fencepost.errors import InvalidRequest, ValidationError

T = TypeVar("T", bound=msgspec.Struct)
MAX_DETAILS = 32


# What JSON counts as whitespace (RFC 8259 §2). bytes.strip() also strips
# vertical tab and form feed, which are not JSON.
JSON_WHITESPACE = b" \t\n\r"


def decode_body(body: bytes, cls: type[T]) -> T:
    if not body.strip(JSON_WHITESPACE):
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        value = msgspec.json.decode(body, type=cls)
    except msgspec.ValidationError as exc:
        value = _decode_slowly(body, cls, str(exc))
        _refuse_nul(body)
        return value
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON ({exc}).") from None
    except RecursionError:
        raise InvalidRequest("The request body is nested too deeply.") from None
    except UnicodeDecodeError:
        raise InvalidRequest("The request body is not valid UTF-8.") from None
    # msgspec keeps the last of repeated keys without a word. Parsing every body
    # a second time to find them (stdlib json with a pairs hook) costs 5-9 µs
    # per body against msgspec's ~0.5 µs (timeit, this machine), so it is done
    # only when a cheap count cannot rule repeats out: each member of a JSON
    # object has one colon outside strings, so a body with no more colons than
    # the members its decoded value shows repeats no key. A renewal
    # `{"ttl_seconds": N}` costs one bytes.count; a 6-member acquire ~2.5 µs
    # for the count; a colon inside a string (a URL in metadata) sends the body
    # to the exact parse.
    colons = body.count(b":")
    try:
        if colons > 1 and colons > _members_seen(value):
            _parse_exactly(body)
    except RecursionError:  # nested deeper than the count's recursion goes
        raise InvalidRequest("The request body is nested too deeply.") from None
    _refuse_nul(body)
    return value


# SPEC §2: a string containing U+0000 is a 422 on both stores (PostgreSQL's TEXT
# cannot hold it). Inside a JSON string a NUL can only be the escape \u0000 (a raw
# NUL byte is not JSON, and no other escape decodes to it), so a body without
# these six bytes has none: the usual body costs one bytes search (~0.2 µs for
# an acquire, timeit), and only a body that has them is walked, to be sure (an
# escaped backslash, "\\u0000", is no NUL) and to name the fields.
NUL_ESCAPE = b"\\u0000"


def _refuse_nul(body: bytes) -> None:
    if NUL_ESCAPE in body:
        details = nul_details(msgspec.json.decode(body))
        if details:
            raise ValidationError(details)


def nul_details(raw: Any) -> list[dict[str, str]]:
    """A detail for every string in the decoded JSON `raw` that holds U+0000, a
    value (`metadata.job.host`, `keys[1]`) or an object key (naming the object
    whose key it is; `body` for the body's own keys), at most MAX_DETAILS."""
    details: list[dict[str, str]] = []
    # A stack, not recursion: the body may nest as deep as the parser allowed.
    stack: list[tuple[str, Any]] = [("", raw)]
    while stack and len(details) < MAX_DETAILS:
        path, value = stack.pop()
        if type(value) is str:
            if "\x00" in value:
                details.append({"field": _path_named(path), "message": _NUL_MESSAGE})
        elif type(value) is dict:
            if any("\x00" in key for key in value):
                details.append({"field": _path_named(path),
                                "message": "an object key must not contain U+0000 (NUL)"})
            for key, item in reversed(value.items()):
                if type(item) in _WALKED:
                    name = _shorten(key.replace("\x00", "\\u0000"))
                    stack.append((f"{path}.{name}" if path else name, item))
        elif type(value) is list:
            for index in range(len(value) - 1, -1, -1):
                if type(value[index]) in _WALKED:
                    stack.append((f"{path}[{index}]", value[index]))
    return details[:MAX_DETAILS]


def _path_named(path: str) -> str:
    """`path` as a detail names it: bounded (a deep path is cut in the middle)."""
    if not path:
        return "body"
    return path if len(path) <= 200 else f"{path[:97]}...{path[-100:]}"


_NUL_MESSAGE = "must not contain U+0000 (NUL)"
_WALKED = (str, dict, list)


def _decode_slowly(body: bytes, cls: type[T], first_error: str) -> T:
    """The body does not fit `cls` as it stands: a 400 if it is not JSON or repeats
    a key; the Struct if integral numbers stood where integers are asked; else a
    422 naming every bad field."""
    # msgspec stops at the first bad field, possibly before reaching a syntax
    # error or a repeated key further on. The standard parser accepts any valid
    # JSON, so it decides 400 versus 422 and gives each field's value to check.
    raw = _parse_exactly(body)
    wanted = _type_info(cls)
    try:
        # msgspec's own reading of the numbers (it refuses 1e400 even untyped),
        # so that what is accepted here is what the fast path would accept.
        untyped = msgspec.json.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass  # a number msgspec cannot hold (1e400): first_error names it
    else:
        try:
            return msgspec.convert(_integral_to_int(untyped, wanted), cls, strict=True)
        except msgspec.ValidationError as exc:
            first_error = str(exc)
    details = field_errors(_integral_to_int(raw, wanted), cls)
    if NUL_ESCAPE in body:
        # A field already refused for its type or bounds is not named twice.
        named = {detail["field"] for detail in details}
        details += [d for d in nul_details(raw) if _top_field(d["field"]) not in named]
    raise ValidationError(details[:MAX_DETAILS] or [_detail_from(first_error)])


def _top_field(path: str) -> str:
    """The body's field a detail's path starts with (`metadata` of `metadata.a[0]`)."""
    return re.split(r"[.\[]", path, maxsplit=1)[0]


def _parse_exactly(body: bytes) -> Any:
    """The body by the standard parser: any valid JSON, and a 400 for a repeated key."""
    try:
        return json.loads(body, parse_constant=_reject_constant, object_pairs_hook=_no_repeats)
    except _RepeatedKey as exc:
        raise InvalidRequest(
            f"The request body repeats the key {_shorten(exc.key)!r} in one object.",
            details=[{"field": _shorten(exc.key), "message": "repeated key"}],
        ) from None
    except (ValueError, RecursionError):
        raise InvalidRequest("The request body is not valid JSON.") from None


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return obj


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


_DEFAULTS: dict[type, tuple[tuple[str, Any], ...]] = {}
_CONTAINERS = (dict, list)


def _defaults(cls: type[msgspec.Struct]) -> tuple[tuple[str, Any], ...]:
    """Each field's name and the value it has when the body leaves it out."""
    return tuple(
        (f.name, f.default if f.default_factory is msgspec.NODEFAULT else f.default_factory())
        for f in msgspec.structs.fields(cls)
    )


def _members_seen(value: Any) -> int:
    """How many object members the decoded value proves the body had: a Struct
    field counts when it differs from its default (a field sent with its
    default value is missed, which only costs the exact parse)."""
    kind = type(value)
    if kind is dict:
        nested = [_members_seen(v) for v in value.values() if type(v) in _CONTAINERS]
        return len(value) + sum(nested)
    if kind is list:
        return sum([_members_seen(v) for v in value if type(v) in _CONTAINERS])
    defaults = _DEFAULTS.get(kind)
    if defaults is None:
        if not isinstance(value, msgspec.Struct):
            return 0
        defaults = _DEFAULTS[kind] = _defaults(kind)
    count = 0
    for name, default in defaults:
        field = getattr(value, name)
        if field is not default and field != default:
            count += 1 + _members_seen(field)
    return count


@functools.cache
def _type_info(cls: type[msgspec.Struct]) -> inspect.Type:
    return inspect.type_info(cls)


def _integral_to_int(value: Any, wanted: inspect.Type) -> Any:
    """`value` with every float of integral value that stands where `wanted` asks
    an integer made an int (60.0 and 6e1 are 60; 60.5 is left to be refused).
    Free-form values (metadata) are left exactly as sent."""
    wanted = _unwrapped(wanted)
    if isinstance(value, float):
        if value.is_integer() and _asks_int(wanted):
            return int(value)
        return value
    if isinstance(wanted, inspect.UnionType):
        for option in map(_unwrapped, wanted.types):
            if isinstance(option, (inspect.StructType, inspect.DictType, inspect.ListType)):
                return _integral_to_int(value, option)
        return value
    if isinstance(wanted, inspect.StructType) and isinstance(value, dict):
        fields = {f.encode_name: f.type for f in wanted.fields}
        return {k: _integral_to_int(v, fields[k]) if k in fields else v for k, v in value.items()}
    if isinstance(wanted, inspect.DictType) and isinstance(value, dict):
        return {k: _integral_to_int(v, wanted.value_type) for k, v in value.items()}
    if isinstance(wanted, inspect.ListType) and isinstance(value, list):
        return [_integral_to_int(v, wanted.item_type) for v in value]
    return value


def _unwrapped(wanted: inspect.Type) -> inspect.Type:
    """The type under `Annotated[..., Meta(...)]` (a description, bounds)."""
    while isinstance(wanted, inspect.Metadata):
        wanted = wanted.type
    return wanted


def _asks_int(wanted: inspect.Type) -> bool:
    options = wanted.types if isinstance(wanted, inspect.UnionType) else (wanted,)
    kinds = [_unwrapped(option) for option in options]
    asks_int = any(isinstance(k, inspect.IntType) for k in kinds)
    return asks_int and not any(isinstance(k, inspect.FloatType) for k in kinds)


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
            details.append({"field": name + _inner_path(str(exc), info.type),
                            "message": _plain(str(exc))})
    # Bounded: a hostile body with thousands of fields gets a short answer.
    return details[:MAX_DETAILS]


_INNER = re.compile(r" - at (?:`key` in )?`\$((?:\.[A-Za-z0-9_]+)+)`\Z")
_MISSING = re.compile(r"\AObject missing required field `([A-Za-z0-9_]+)`")


def _inner_path(msgspec_error: str, field_type: Any) -> str:
    """Where inside an object field (a Struct, such as a pool's `upstream`) the
    error is, as `.timeout_ms`; "" for any other field (its detail names it
    alone, as before)."""
    structs = [t for t in getattr(field_type, "__args__", (field_type,))
               if isinstance(t, type) and issubclass(t, msgspec.Struct)]
    if not structs:
        return ""
    match = _INNER.search(msgspec_error)
    if match:
        return match.group(1)
    missing = _MISSING.search(msgspec_error)
    return f".{missing.group(1)}" if missing else ""


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
