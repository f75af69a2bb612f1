"""X-Request-Id (SPEC §2): the caller's, echoed when it is safe to echo, or a new
one; every response carries it and the access log records it."""

from __future__ import annotations

from random import getrandbits

MAX_REQUEST_ID_LENGTH = 128


def caller_request_id(value: str | None) -> str | None:
    """The caller's ID if it is safe to put back in a header and in a log line."""
    if value is None or not 0 < len(value) <= MAX_REQUEST_ID_LENGTH:
        return None
    if not value.isascii() or not value.isprintable() or " " in value:
        return None
    return value


def request_id_for(caller_value: str | None) -> str:
    """The caller's X-Request-Id when it may be echoed, else a new one."""
    return caller_request_id(caller_value) or new_request_id()


def new_request_id() -> str:
    """A random version-4 UUID. The IDs correlate log lines and need no secrecy,
    so they come from the process's PRNG: uuid.uuid4() reads the kernel's
    CSPRNG, a system call that cost ~15 µs per request in the benchmark."""
    value = getrandbits(128)
    value = (value & ~(0xF000 << 64)) | (0x4000 << 64)  # version 4
    value = (value & ~(0xC000 << 48)) | (0x8000 << 48)  # RFC 4122 variant
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
