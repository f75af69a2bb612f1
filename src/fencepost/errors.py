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
        super().__init__(self.message)

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


def _all_subclasses(cls: type[FencepostError]) -> list[type[FencepostError]]:
    found: list[type[FencepostError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


ERRORS_BY_CODE: dict[str, type[FencepostError]] = {
    cls.code: cls for cls in [FencepostError, *_all_subclasses(FencepostError)]
}
