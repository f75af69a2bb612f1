"""A JWT from the caller's identity provider, sent as the bearer (SPEC §5.1).

Tokens expire (minutes to an hour), and whatever renews them writes them to a
file (a sidecar, `oauth2-proxy`, a CI runner) or prints them on request (`gcloud
auth print-identity-token`, `vault read -field=token ...`). So the client reads
the token from a file or a command, keeps it, reads it again when it is about
to expire (its `exp`, read without checking: the server checks), and once more
when the server refuses it (401), sending the refused call again only if the
token changed: a 401 did nothing, so the resend is safe.
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import threading
import time
from typing import Callable

from fencepost.errors import Unauthorized

# A token is read again this long before its `exp`, so that no call carries
# one that expires on the way.
REREAD_BEFORE_S = 30.0
# A command that prints the token gets this long.
COMMAND_TIMEOUT_S = 30.0
# A file or command whose token has no `exp` is read again this often.
REREAD_EVERY_S = 60.0
MAX_TOKEN_CHARS = 16_384


def _expiry(token: str) -> float | None:
    """The token's `exp` (epoch seconds), read without verifying anything."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        exp = claims.get("exp")
        return float(exp) if isinstance(exp, (int, float)) else None
    except (IndexError, ValueError, AttributeError):
        return None


class BearerToken:
    """The current token from `file` or `command` (one of them)."""

    def __init__(self, file: str | None = None, command: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if (file is None) == (command is None):
            raise ValueError("give a token file or a token command, not both or neither")
        if command is not None and not shlex.split(command):
            raise ValueError("the token command is empty")
        self.file, self.command = file, command
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires: float | None = None  # its `exp`, decoded once per read
        self._read_at = 0.0

    @property
    def source(self) -> str:
        return f"file {self.file}" if self.file is not None else f"command `{self.command}`"

    @property
    def cached(self) -> str | None:
        """The token last read (None before the first read)."""
        return self._token

    def current(self) -> str:
        """The token, read again first when it is about to expire."""
        with self._lock:
            if self._token is None or self.due():
                self._token = self._read()
            return self._token

    def after_refusal(self, used: str | None) -> bool:
        """Read the token again after the server refused `used`; True when the
        token is now another one (worth sending the call again)."""
        with self._lock:
            if self._token != used:
                return True  # another thread read a new one already
            self._token = self._read()
            return self._token != used

    def due(self) -> bool:
        """Whether the token held is about to expire (or none is held)."""
        if self._token is None:
            return True
        now = self._clock()
        if self._expires is None:
            return now - self._read_at >= REREAD_EVERY_S
        return now >= self._expires - REREAD_BEFORE_S

    def _read(self) -> str:
        try:
            if self.file is not None:
                with open(self.file, encoding="utf-8") as source:
                    text = source.read(MAX_TOKEN_CHARS + 1)
            else:
                assert self.command is not None
                done = subprocess.run(shlex.split(self.command), capture_output=True,
                                      text=True, timeout=COMMAND_TIMEOUT_S, check=False)
                if done.returncode != 0:
                    said = done.stderr.strip().splitlines()[-1:] or [""]
                    raise OSError(f"it exited with {done.returncode} {said[0]}".strip())
                text = done.stdout
        except (OSError, subprocess.SubprocessError, UnicodeDecodeError) as exc:
            raise Unauthorized(f"Could not read the token from the {self.source}: {exc}") \
                from None
        token = text.strip()
        if not token or len(token) > MAX_TOKEN_CHARS or any(c.isspace() for c in token):
            raise Unauthorized(f"The {self.source} gave no token (one line, no spaces).")
        self._read_at = self._clock()
        self._expires = _expiry(token)
        return token
