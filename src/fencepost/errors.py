"""One error tree shared by the server and the client.

Every error has a snake_case `code` and an `http_status`; the server turns an
instance into the JSON envelope `{"error": {"code", "message", ...extra}}`, and
the client turns that envelope back into the same class.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar


class FencepostError(Exception):
    """Base of every fencepost error; `code` and `http_status` name it on the wire."""

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
        """Why a lease or session was lost (`expired`, `released`, `force_released`,
        `superseded`, `session_expired`, `session_ended`, or a client-side reason
        such as `unreachable`), when known."""
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
    """400: the body is not JSON, or a required header is missing or malformed."""

    code = "invalid_request"
    http_status = 400
    default_message = "The request is malformed."


class Unauthorized(FencepostError):
    """401: the API key is missing, unknown, expired or revoked."""

    code = "unauthorized"
    http_status = 401
    default_message = "A valid API key is required."


class Forbidden(FencepostError):
    """403: the key's role is too low for the route, or the caller's IP is not allowed."""

    code = "forbidden"
    http_status = 403
    default_message = "This key may not do that."


class NotFound(FencepostError):
    """404: no such route, pool, slot or key (in this project)."""

    code = "not_found"
    http_status = 404
    default_message = "No such resource."


class MethodNotAllowed(FencepostError):
    """405: the route does not take this HTTP method."""

    code = "method_not_allowed"
    http_status = 405
    default_message = "That method is not allowed on this route."


class LockHeld(FencepostError):
    """409: another token holds the lock; `operation` is the holder's, `retry_after` when it
    may expire."""

    code = "lock_held"
    http_status = 409
    default_message = "The lock is held by another token."


class LeaseExpired(FencepostError):
    """409: the renewal came less than 1 s before expiry; stop work before the lease expires."""

    code = "lease_expired"
    http_status = 409
    default_message = (
        "The lease is too close to its expiry to renew; stop work before it expires."
    )


class LeaseLost(FencepostError):
    """409: this token no longer holds the lock; `reason` says why when known."""

    code = "lease_lost"
    http_status = 409
    default_message = "This token does not hold the lock."


class SessionExpired(FencepostError):
    """409: the session renewal came less than 1 s before the session expires; it
    ends then, and everything attached with it."""

    code = "session_expired"
    http_status = 409
    default_message = (
        "The session is too close to its expiry to renew; stop work before it expires."
    )


class SessionLost(FencepostError):
    """409: the session has ended; `reason` is `session_expired` or
    `session_ended`, and every lease and slot attached to it ended with it."""

    code = "session_lost"
    http_status = 409
    default_message = "The session has ended."


class Capped(FencepostError):
    """409: the pool slot is at its request deadline and cannot be extended; release it."""

    code = "capped"
    http_status = 409
    default_message = "The slot is at its request deadline and cannot be extended."


class PayloadTooLarge(FencepostError):
    """413: the request body is over 64 KiB."""

    code = "payload_too_large"
    http_status = 413
    default_message = "The request body is larger than 64 KiB."


class ValidationError(FencepostError):
    """422: valid JSON with wrong, out-of-range or unknown fields; `details` names each."""

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
    """429: the API key is over its requests-per-minute quota; see `retry_after`."""

    code = "quota_exceeded"
    http_status = 429
    default_message = "This key is over its requests-per-minute quota."


class TooManySessions(FencepostError):
    """429: the API key holds as many live sessions as one key may
    (MAX_LIVE_SESSIONS); end one, or let one expire, first."""

    code = "too_many_sessions"
    http_status = 429
    default_message = "This key holds as many live sessions as a key may."


class TooManyRequests(FencepostError):
    """429: no pool slot is free and no wait was asked (or the queue is full)."""

    code = "too_many_requests"
    http_status = 429
    default_message = "No slot is free."


class ShuttingDown(FencepostError):
    """503: the server is stopping; retry (on another replica)."""

    code = "shutting_down"
    http_status = 503
    default_message = "The server is shutting down; retry on another replica."


class TooManyConnections(FencepostError):
    """503: the server holds as many connections as it allows; retry shortly."""

    code = "too_many_connections"
    http_status = 503
    default_message = "The server has too many open connections; retry shortly."


class StoreUnavailable(FencepostError):
    """503: the server's store is not answering."""

    code = "store_unavailable"
    http_status = 503
    default_message = "The store is not answering."


class StoreNotReplicated(StoreUnavailable):
    """503: the server was told to change nothing unless a synchronous standby
    confirms the commit (`--require-sync-replication`), and none does now."""

    code = "store_not_replicated"
    default_message = "No synchronous standby confirms commits now; nothing was changed."


class QueueTimeout(FencepostError):
    """504: waited the whole wait and no pool slot opened."""

    code = "queue_timeout"
    http_status = 504
    default_message = "Waited the whole wait and no slot opened."


class UpstreamUnavailable(FencepostError):
    """502: proxy mode could not get an answer from the pool's upstream
    (refused, reset, TLS failure, a broken answer)."""

    code = "upstream_unavailable"
    http_status = 502
    default_message = "The pool's upstream could not be reached."


class UpstreamTimeout(FencepostError):
    """504: proxy mode got no answer from the pool's upstream within its timeout_ms."""

    code = "upstream_timeout"
    http_status = 504
    default_message = "The pool's upstream did not answer in time."


class Conflict(FencepostError):
    """409: the request conflicts with existing state."""

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


_ALL_ERRORS: list[type[FencepostError]] = [FencepostError, *_all_subclasses(FencepostError)]
ERRORS_BY_CODE: dict[str, type[FencepostError]] = {cls.code: cls for cls in _ALL_ERRORS}
