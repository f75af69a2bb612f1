"""Running the app: listen, serve until SIGTERM/SIGINT, then stop gracefully."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any, Callable, Coroutine

from fencepost.server.app import App
from fencepost.server.proxies import TrustedProxies
from fencepost.server.wire import Connections

# In-flight requests get this long to finish after SIGTERM.
GRACEFUL_SHUTDOWN_S = 10.0
_POLL_S = 0.02


def serve(app: App, host: str, port: int, trusted_proxies: list[str] | None = None,
          on_ready: Callable[[int], None] | None = None) -> None:
    """Run until SIGTERM/SIGINT (exit 0 after a graceful stop); exit 1, after one
    line on stderr, when the address cannot be bound or the store cannot be
    opened. `on_ready(port)` is called once the server listens with its store
    open, never before. X-Forwarded-For is believed only from `trusted_proxies`."""
    proxies = TrustedProxies(list(trusted_proxies or []))
    try:
        ok = _run(_serve(app, host, port, proxies, on_ready))
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        ok = True
    if not ok:
        raise SystemExit(1)


def _run(main: Coroutine[Any, Any, bool]) -> bool:
    try:
        import uvloop
    except ImportError:  # not on every platform; the stock loop works, slower
        return asyncio.run(main)
    return uvloop.run(main)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())  # a driver's message may span lines


async def _serve(app: App, host: str, port: int, proxies: TrustedProxies,
                 on_ready: Callable[[int], None] | None) -> bool:
    loop = asyncio.get_running_loop()
    connections = Connections(app, app.handle, app.refuse, proxies)
    # The address first: a busy port must fail before the store is opened (and,
    # on an empty store, before a bootstrap key is made). Connections are
    # accepted only once the store is open.
    try:
        server = await loop.create_server(
            connections.protocol, host, port, reuse_address=True, backlog=2048,
            start_serving=False,
        )
    except OSError as exc:
        print(f"fencepost: cannot listen on {host}:{port}: {_one_line(exc.strerror or exc)}",
              file=sys.stderr)
        return False
    try:
        await app.startup()
    except Exception as exc:  # noqa: BLE001 - reported in one line, no traceback
        server.close()
        print(f"fencepost: cannot start: {_one_line(exc)}", file=sys.stderr)
        return False
    try:
        await server.start_serving()
    except OSError as exc:
        server.close()
        await app.shutdown()
        print(f"fencepost: cannot listen on {host}:{port}: {_one_line(exc.strerror or exc)}",
              file=sys.stderr)
        return False
    if on_ready is not None:
        on_ready(int(server.sockets[0].getsockname()[1]))

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, stop, connections)
    await stop.wait()

    # Graceful stop: no new connections, parked waiters answered at once (503),
    # idle connections closed, busy ones given time to finish their response.
    server.close()
    app.begin_shutdown()
    connections.shut()
    deadline = loop.time() + GRACEFUL_SHUTDOWN_S
    while connections.busy() and loop.time() < deadline and not connections.aborted:
        await asyncio.sleep(_POLL_S)
    connections.abort()
    await asyncio.sleep(0)  # let the aborted transports report connection_lost
    await app.shutdown()
    return True


def _on_signal(stop: asyncio.Event, connections: Connections) -> None:
    if stop.is_set():
        connections.aborted = True  # asked twice: stop waiting for requests
    stop.set()
