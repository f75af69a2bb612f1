"""One worker of `fencepost serve --workers N` (see server/workers.py).

Started by the supervisor as `python -m fencepost.server.worker`. Its standard
input is the supervisor's line to it: first its options, one JSON object on
one line; after that each byte is a stop signal (the first starts the drain,
as SIGTERM does without workers), and the end of input (the supervisor died,
kill -9 included) is one too. The worker itself ignores SIGTERM and SIGINT: a
service manager that signals every process of the service (systemd's default)
or a Ctrl-C in a terminal then still stops each worker exactly once, through
its supervisor. It writes one byte to the pipe `ready_fd` once it listens with
its store open.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from fencepost.logs import configure as configure_logging
from fencepost.server.launch import ServeOptions, WorkerPlace, launch

_PR_SET_NAME = 15
_STDIN = 0


def _name(number: int) -> None:
    """A name (`fencepost-w2`) that `ps -o comm` and `top` show, so that an
    operator can tell the workers apart."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_NAME, f"fencepost-w{number}".encode()[:15])


def _read_options() -> dict[str, object]:
    """The first line of standard input, read unbuffered: the bytes after it
    are stop signals, for the server's loop to read."""
    line = bytearray()
    while not line.endswith(b"\n"):
        chunk = os.read(_STDIN, 1)
        if not chunk:
            raise SystemExit(1)  # the supervisor died before it said anything
        line += chunk
    config: dict[str, object] = json.loads(line)
    return config


def main() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: see launch
        signal.signal(sig, signal.SIG_IGN)
    config = _read_options()
    number = int(str(config["number"]))
    _name(number)
    configure_logging()
    ready_fd = int(str(config["ready_fd"]))

    def ready(port: int) -> None:
        os.write(ready_fd, b"1")
        os.close(ready_fd)

    anchor = config["clock_anchor"]
    assert isinstance(anchor, list)
    options = config["options"]
    assert isinstance(options, dict)
    launch(ServeOptions.from_json(options), on_ready=ready,
           worker=WorkerPlace(number, (int(anchor[0]), int(anchor[1]))), stop_fd=_STDIN)


if __name__ == "__main__":
    main()
