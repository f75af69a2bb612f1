"""Exit codes that scripts can branch on (documented in README, "Use it from the
shell"). `fencepost run` exits with its command's own code instead, except when
fencepost itself fails before or while running it."""

from __future__ import annotations

from enum import IntEnum

from fencepost.errors import (
    Capped,
    FencepostError,
    Forbidden,
    InvalidRequest,
    LeaseExpired,
    LeaseLost,
    LockHeld,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    QueueTimeout,
    QuotaExceeded,
    TooManyRequests,
    TransportError,
    Unauthorized,
    UnexpectedResponse,
    ValidationError,
)


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1
    """Anything not below."""
    USAGE = 2
    """Bad arguments or configuration; the server refused the input (400, 413, 422)."""
    BUSY = 3
    """The lock is held, no pool slot is free, the wait ran out, or the key is over quota."""
    LOST = 4
    """The lease was lost or expired (also: lost while `fencepost run` ran the command)."""
    NOT_FOUND = 5
    """No such pool, key or slot."""
    DENIED = 6
    """The API key is missing, unknown, expired, revoked or lacks the role."""
    UNAVAILABLE = 7
    """The server could not be reached, is shutting down, or failed (5xx)."""
    CANNOT_EXECUTE = 126
    """`fencepost run`: the command exists but could not be executed."""
    COMMAND_NOT_FOUND = 127
    """`fencepost run`: the command was not found."""


def exit_code_for(error: FencepostError) -> ExitCode:
    """The exit code for a failed call."""
    if isinstance(error, LockHeld | TooManyRequests | QueueTimeout | QuotaExceeded):
        return ExitCode.BUSY
    if isinstance(error, LeaseLost | LeaseExpired | Capped):
        return ExitCode.LOST
    if isinstance(error, NotFound):
        return ExitCode.NOT_FOUND
    if isinstance(error, Unauthorized | Forbidden):
        return ExitCode.DENIED
    if isinstance(error, ValidationError | InvalidRequest | PayloadTooLarge | MethodNotAllowed):
        return ExitCode.USAGE
    if isinstance(error, TransportError | UnexpectedResponse) or error.http_status >= 500:
        return ExitCode.UNAVAILABLE
    return ExitCode.ERROR
