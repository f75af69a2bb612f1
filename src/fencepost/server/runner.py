"""Running the app under uvicorn with a clean, prompt SIGTERM."""

from __future__ import annotations

from types import FrameType
from typing import Any

import uvicorn

from fencepost.server.app import begin_shutdown

# In-flight requests get this long to finish after SIGTERM.
GRACEFUL_SHUTDOWN_S = 10


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Any) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # A graceful stop is a clean exit (status 0), so uvicorn must not
        # re-raise the signal once it has finished shutting down.
        self._captured_signals.clear()
        begin_shutdown(self._app)


def serve(app: Any, host: str, port: int, trusted_proxies: list[str] | None = None) -> None:
    """Run until SIGTERM/SIGINT. X-Forwarded-For is believed only from
    `trusted_proxies`: otherwise any client could claim an allowlisted address."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        proxy_headers=bool(trusted_proxies),
        forwarded_allow_ips=list(trusted_proxies or []),
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,  # fencepost writes its own access log, without secrets
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        timeout_keep_alive=30,
        server_header=False,
    )
    server = _Server(config, app)
    server.run()
    if not server.started:
        raise SystemExit(1)
