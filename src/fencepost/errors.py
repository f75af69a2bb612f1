"""One error tree shared by the server and the client.

Every error has a snake_case `code` and an `http_status`; the server turns an
instance into the JSON envelope `{"error": {"code", "message", ...extra}}`, and
the client turns that envelope back into the same class.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar


class FencepostError(Exception):
    code: ClassVar[str] = "internal_error"
    http_status: ClassVar[int] = 500
    default_message: ClassVar[str] = "The server failed to handle the request."

    def __init__(
        self,
        message: str | None = None,
        *,
        retry_after_ms: int | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        self.message = message or self.default_message
        self.retry_after_ms = retry_after_ms
        self.extra = extra
        self.headers = dict(headers or {})
        # Set by the client from the response: the request's X-Request-Id, and the
        # response's Retry-After header in seconds when the body had no retry_after_ms.
        self.request_id: str | None = None
        self.retry_after_header: float | None = None
        super().__init__(self.message)

    @property
    def retry_after(self) -> float | None:
        """Seconds the server asked the caller to wait before retrying, if it said."""
        if self.retry_after_ms is not None:
            return self.retry_after_ms / 1000
        return self.retry_after_header

    @property
    def operation(self) -> str | None:
        """The current holder's `operation` (on `lock_held`), when the server sent it."""
        value = self.extra.get("operation")
        return value if isinstance(value, str) else None

    @property
    def reason(self) -> str | None:
        """Why a lease was lost (`expired`, `released`, `force_released`, `superseded`,
        or a client-side reason such as `unreachable`), when known."""
        value = self.extra.get("reason")
        return value if isinstance(value, str) else None

    @property
    def retry_after_seconds(self) -> int | None:
        """Whole seconds for `Retry-After`, rounded up, never below 1."""
        if self.retry_after_ms is None:
            return None
        return max(1, math.ceil(self.retry_after_ms / 1000))

    def to_body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        error.update(self.extra)
        if self.retry_after_ms is not None:
            error["retry_after_ms"] = self.retry_after_ms
        return {"error": error}

    def response_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        seconds = self.retry_after_seconds
        if seconds is not None:
            headers["Retry-After"] = str(seconds)
        return headers


class InvalidRequest(FencepostError):
    code = "invalid_request"
    http_status = 400
    default_message = "The request is malformed."


class Unauthorized(FencepostError):
    code = "unauthorized"
    http_status = 401
    default_message = "A valid API key is required."


class Forbidden(FencepostError):
    code = "forbidden"
    http_status = 403
    default_message = "This key may not do that."


class NotFound(FencepostError):
    code = "not_found"
    http_status = 404
    default_message = "No such resource."


class MethodNotAllowed(FencepostError):
    code = "method_not_allowed"
    http_status = 405
    default_message = "That method is not allowed on this route."


class LockHeld(FencepostError):
    code = "lock_held"
    http_status = 409
    default_message = "The lock is held by another token."


class LeaseExpired(FencepostError):
    code = "lease_expired"
    http_status = 409
    default_message = (
        "The lease is too close to its expiry to renew; stop work before it expires."
    )


class LeaseLost(FencepostError):
    code = "lease_lost"
    http_status = 409
    default_message = "This token does not hold the lock."


class Capped(FencepostError):
    code = "capped"
    http_status = 409
    default_message = "The slot is at its request deadline and cannot be extended."


class PayloadTooLarge(FencepostError):
    code = "payload_too_large"
    http_status = 413
    default_message = "The request body is larger than 64 KiB."


class ValidationError(FencepostError):
    code = "validation_error"
    http_status = 422
    default_message = "The request has invalid fields."

    def __init__(self, details: list[dict[str, str]], message: str | None = None) -> None:
        if message is None:
            names = ", ".join(d["field"] for d in details)
            message = f"Invalid fields: {names}." if names else None
        super().__init__(message, details=details)

    @property
    def details(self) -> list[dict[str, str]]:
        return list(self.extra["details"])


class QuotaExceeded(FencepostError):
    code = "quota_exceeded"
    http_status = 429
    default_message = "This key is over its requests-per-minute quota."


class TooManyRequests(FencepostError):
    code = "too_many_requests"
    http_status = 429
    default_message = "No slot is free."


class ShuttingDown(FencepostError):
    code = "shutting_down"
    http_status = 503
    default_message = "The server is shutting down; retry on another replica."


class StoreUnavailable(FencepostError):
    code = "store_unavailable"
    http_status = 503
    default_message = "The store is not answering."


class QueueTimeout(FencepostError):
    code = "queue_timeout"
    http_status = 504
    default_message = "Waited the whole wait and no slot opened."


class Conflict(FencepostError):
    code = "conflict"
    http_status = 409
    default_message = "That conflicts with existing state."


# --- client-only errors: the client raises these; the server never sends them ---


class TransportError(FencepostError):
    """The server could not be reached, or the connection failed before an answer came.

    `maybe_sent` is False when the request surely never reached the server (the
    connection could not be opened), True when it may have been processed."""

    code = "transport_error"
    http_status = 0
    default_message = "The server could not be reached."

    def __init__(self, message: str | None = None, *, maybe_sent: bool = True) -> None:
        super().__init__(message)
        self.maybe_sent = maybe_sent


class UnexpectedResponse(FencepostError):
    """The server (or a proxy in front of it) answered with something that is not a
    fencepost response: not JSON, no error envelope, or an error code this client
    does not know. `status` is the HTTP status received, `server_code` the code."""

    code = "unexpected_response"
    http_status = 0
    default_message = "The server sent a response this client does not understand."

    def __init__(
        self, message: str | None = None, *, status: int = 0, server_code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.server_code = server_code


def _all_subclasses(cls: type[FencepostError]) -> list[type[FencepostError]]:
    found: list[type[FencepostError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


ERRORS_BY_CODE: dict[str, type[FencepostError]] = {
    cls.code: cls for cls in [FencepostError, *_all_subclasses(FencepostError)]
}
