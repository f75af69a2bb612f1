"""The sans-I/O layer: what to send and how to read the answer, as pure values and
functions. The async and sync clients differ only in how they move bytes.

A `Call` describes one HTTP request and how to decode its answer; a `Reply` is
the answer (status, headers, body). `error_from_reply` turns any non-2xx answer
into the exception class the server meant, from the one shared error tree.
"""

from __future__ import annotations

import email.utils
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import msgspec

from fencepost.core.names import NAME_PATTERN, is_valid_name
from fencepost.errors import (
    ERRORS_BY_CODE,
    FencepostError,
    TransportError,
    UnexpectedResponse,
    ValidationError,
)

T = TypeVar("T")
M = TypeVar("M", bound=msgspec.Struct)

# The server accepts waits up to this long per request (SPEC §3.1); longer waits
# are made of several requests.
MAX_LOCK_WAIT_S = 300.0
_CLIENT_ONLY = {TransportError, UnexpectedResponse}


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer, independent of the HTTP library that fetched it."""

    status: int
    headers: Mapping[str, str]
    content: bytes


@dataclass(frozen=True, slots=True)
class Wait:
    """A wait that a retried request must shorten: the time still left until
    `deadline` (a `time.monotonic()` instant, capped at `cap_s`) goes into the body
    field `field`, in seconds or milliseconds."""

    deadline: float
    field: str
    in_ms: bool = False
    cap_s: float = MAX_LOCK_WAIT_S

    def remaining_s(self, now: float) -> float:
        """Seconds of the wait left at `now`, capped at `cap_s`."""
        return max(0.0, min(self.cap_s, self.deadline - now))


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request to make and how to decode its answer.

    `idempotent`: sending it twice has the effect of sending it once, so it may be
    retried even when an earlier attempt may have reached the server. `retry`:
    False for calls whose caller runs its own schedule (the lease keeper).
    `timeout`: overrides the client's read timeout for this call. `renews`: it
    renews a lease (the clients tell `on_renewed` when it got through).
    """

    method: str
    path: str
    decode: Callable[[Reply], T]
    body: dict[str, Any] | None = None
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    idempotent: bool = True
    retry: bool = True
    wait: Wait | None = None
    timeout: float | None = None
    renews: bool = False
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def body_at(self, now: float) -> dict[str, Any] | None:
        """The body to send at `now`: a wait is shortened by the time already spent."""
        if self.wait is None:
            return self.body
        remaining = self.wait.remaining_s(now)
        value: float | int = int(remaining * 1000) if self.wait.in_ms else round(remaining, 3)
        return {**(self.body or {}), self.wait.field: value}

    def read_timeout(self, default: float, now: float) -> float:
        """How long to wait for the answer: the server may hold a waiting request
        for the whole wait, so that is added to the usual timeout."""
        base = self.timeout if self.timeout is not None else default
        if self.wait is not None:
            base += self.wait.remaining_s(now)
        return base

    def all_headers(self) -> dict[str, str]:
        """The call's headers plus its `X-Request-Id` (the same on every retry)."""
        return {"X-Request-Id": self.request_id, **self.headers}


@dataclass(frozen=True, slots=True)
class Sleep:
    """A step of a program: pause this long (the driver may cut it short to stop)."""

    seconds: float


Step = Call[Any] | Sleep


def new_token() -> str:
    """A fresh lock token (a random UUID)."""
    return str(uuid.uuid4())


def name_segment(name: str, field_name: str) -> str:
    """A lock key or pool name for a URL path, checked against the naming rule
    first, so a bad name fails here with the same error the server would give."""
    if not isinstance(name, str) or not is_valid_name(name):
        raise ValidationError([{"field": field_name, "message": f"must match {NAME_PATTERN}"}])
    return name


def id_segment(value: str) -> str:
    """An opaque ID (key ID, slot ID) for a URL path, escaped."""
    return quote(value, safe="")


# --- decoding -----------------------------------------------------------------


def decode_as(model: type[M]) -> Callable[[Reply], M]:
    """A decoder of a 2xx JSON body into `model`."""

    def decode(reply: Reply) -> M:
        return parse_body(reply, model)

    return decode


def parse_body(reply: Reply, model: type[M]) -> M:
    """The JSON body as `model`; an unreadable body is `UnexpectedResponse`."""
    try:
        return msgspec.json.decode(reply.content, type=model)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UnexpectedResponse(
            f"The server's answer (HTTP {reply.status}) could not be read: {exc}.",
            status=reply.status,
        ) from None


def decode_flag(name: str) -> Callable[[Reply], bool]:
    """A decoder of `{"<name>": true|false}`."""

    def decode(reply: Reply) -> bool:
        body = parse_json(reply)
        value = body.get(name) if isinstance(body, dict) else None
        if not isinstance(value, bool):
            raise UnexpectedResponse(
                f"The server's answer has no boolean {name!r}.", status=reply.status
            )
        return value

    return decode


def parse_json(reply: Reply) -> Any:
    """The JSON body as builtins; a body that is not JSON is `UnexpectedResponse`."""
    try:
        return json.loads(reply.content)
    except ValueError:
        raise UnexpectedResponse(
            f"The server's answer (HTTP {reply.status}) is not JSON.", status=reply.status
        ) from None


def header_int(headers: Mapping[str, str], name: str) -> int | None:
    """A response header holding a whole number, or None."""
    value = headers.get(name)
    if value is None or not (value.strip().isascii() and value.strip().isdigit()):
        return None
    return int(value.strip())


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """`Retry-After` as seconds: a number of seconds or an HTTP date."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if moment is None:
            return None
        seconds = moment.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds)


def error_from_reply(reply: Reply) -> FencepostError:
    """The exception for a non-2xx answer: the class named by `error.code`, with
    the server's message, extra fields, `retry_after` and the request ID."""
    error = _error_from_body(reply)
    error.request_id = reply.headers.get("x-request-id")
    error.retry_after_header = parse_retry_after(reply.headers.get("retry-after"))
    return error


def _error_from_body(reply: Reply) -> FencepostError:
    try:
        body = json.loads(reply.content)
        info = body["error"]
        code = info["code"]
        message = info["message"]
        if not isinstance(code, str) or not isinstance(message, str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        return UnexpectedResponse(
            f"The server answered HTTP {reply.status} without a fencepost error body.",
            status=reply.status,
        )
    cls = ERRORS_BY_CODE.get(code)
    if cls is None or cls in _CLIENT_ONLY:
        return UnexpectedResponse(message, status=reply.status, server_code=code)
    extra = {k: v for k, v in info.items() if k not in {"code", "message", "headers"}}
    retry_after_ms = extra.pop("retry_after_ms", None)
    if not isinstance(retry_after_ms, int) or isinstance(retry_after_ms, bool):
        retry_after_ms = None
    if issubclass(cls, ValidationError):
        details = extra.pop("details", None)
        error: FencepostError = cls(details if isinstance(details, list) else [], message)
        error.extra.update(extra)
        error.retry_after_ms = retry_after_ms
        return error
    return cls(message, retry_after_ms=retry_after_ms, **extra)


def raise_for_status(reply: Reply) -> None:
    """Raise the error class the server meant for any non-2xx answer."""
    if not 200 <= reply.status < 300:
        raise error_from_reply(reply)
