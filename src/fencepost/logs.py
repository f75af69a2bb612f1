"""Application messages as JSON lines through stdlib `logging`.

The server's standard error carries JSON lines only (access log, event log and
these messages, each line a whole object), so a log shipper parses every line
the same way. A message is `{"ts", "log": "app", "level", "logger",
"message"}`, plus `"traceback"` (one string) when it reports an exception: a
traceback never spreads over lines of its own.

The one exception is a refusal to start (a busy port, a missing store): that
is one plain `fencepost: ...` line and the process exits, as for any command.
"""

from __future__ import annotations

import logging
import sys
from typing import IO

import msgspec

from fencepost.core.timefmt import format_at

_encoder = msgspec.json.Encoder()
_HANDLER_NAME = "fencepost-json"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": format_at(int(record.created * 1000)),
            "log": "app",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return _encoder.encode(line).decode()


def configure(stream: IO[str] | None = None, level: int = logging.INFO) -> None:
    """Send log records to `stream` (default: stderr) as JSON lines: fencepost's
    own from `level` up, every library's (asyncio, psycopg) and Python's
    warnings from WARNING up, so that nothing reaches the stream as loose text.
    Idempotent: configuring again replaces the handler."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == _HANDLER_NAME:
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("fencepost").setLevel(level)
    logging.captureWarnings(True)
