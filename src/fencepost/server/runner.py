"""Running the app: listen, serve until SIGTERM/SIGINT, then stop gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import ssl
import sys
from typing import Any, Callable, Coroutine

from fencepost.server.app import App
from fencepost.server.proxies import TrustedProxies
from fencepost.server.routes import proxy
from fencepost.server.wire import (
    DEFAULT_MAX_PER_SOURCE,
    DEFAULT_OUTPUT_BUDGET,
    REQUEST_READ_S,
    Connections,
)

# What a worker's supervisor writes to its standard input for a SIGHUP
# (server/workers.py); every other byte is a stop.
REOPEN = b"h"
# In-flight requests get this long to finish after SIGTERM.
GRACEFUL_SHUTDOWN_S = 10.0
DEFAULT_MAX_CONNECTIONS = 4096
# File descriptors kept free of connections: the store's database files and
# sockets, the access log, and a few for anything else the process opens.
RESERVED_FDS = 64
_POLL_S = 0.02


def serve(
    app: App, host: str, port: int, trusted_proxies: list[str] | None = None,
    max_connections: int | None = None, tls: ssl.SSLContext | None = None,
    on_ready: Callable[[int], None] | None = None, drain_seconds: float = 0.0,
    reuse_port: bool = False, stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
    stop_fd: int | None = None, max_per_source: int | None = DEFAULT_MAX_PER_SOURCE,
    output_budget: int | None = DEFAULT_OUTPUT_BUDGET,
) -> None:
    """Run until SIGTERM/SIGINT (exit 0 after a graceful stop); exit 1, after one
    line on stderr, when the address cannot be bound or the store cannot be
    opened. `on_ready(port)` is called once the server listens with its store
    open, never before. X-Forwarded-For is believed only from `trusted_proxies`.
    At `max_connections` open connections (default: see `connection_cap`) the
    idlest makes room for a new one, or, with none idle, the newcomer is
    refused with a 503; one address holds at most `max_per_source` (0: no
    cap; trusted proxies are not capped). With `tls` (see `tls_context`), HTTPS only.
    On SIGTERM, /readyz turns 503 at once and everything else keeps serving for
    `drain_seconds` (see `_stop`). A worker (server/workers.py) shares its
    port with its siblings (`reuse_port`) and takes no signals: each byte its
    supervisor writes to `stop_fd` counts as one, and the end of that pipe
    (the supervisor is gone) as one too."""
    proxies = TrustedProxies(list(trusted_proxies or []))
    cap = connection_cap(max_connections)
    return_freed_memory()
    try:
        ok = _run(_serve(app, host, port, proxies, cap, tls, on_ready, drain_seconds,
                         reuse_port, stop_signals, stop_fd, max_per_source, output_budget))
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


def return_freed_memory() -> None:
    """glibc serves a large allocation (an answer of megabytes) from mmap and
    gives it back when it is freed, but after each such free it raises the
    size it maps from (up to 32 MB), so later large answers come from the heap,
    which it seldom gives back: a burst of clients that never read left the
    server hundreds of MB larger for good. A fixed threshold keeps large
    buffers mapped, and returned when freed. Nothing elsewhere (another libc)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
_MMAP_THRESHOLD_BYTES = 256 * 1024


def connection_cap(requested: int | None) -> int:
    """How many connections to hold at once. The soft file limit is raised to
    the hard one first; the cap then stays below it, with room for the store's
    files and sockets, so that a flood of connections is refused with a 503
    instead of every accept failing (EMFILE) for everyone."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    room = max(1, soft - RESERVED_FDS)
    return min(requested, room) if requested is not None else min(DEFAULT_MAX_CONNECTIONS, room)


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server TLS context from PEM files (the certificate file may hold the
    chain). TLS 1.2 at least; the ciphers are Python's secure defaults.
    Raises ValueError with a one-line reason when the files are unusable."""
    for path in (cert_file, key_file):
        if not os.path.isfile(path):
            raise ValueError(f"no such file: {path}")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise ValueError(f"cannot load the certificate {cert_file!r} and key {key_file!r}: "
                         f"{reason}") from None
    return context


def _one_line(text: object) -> str:
    return " ".join(str(text).split())  # a driver's message may span lines


async def _serve(
    app: App, host: str, port: int, proxies: TrustedProxies, max_connections: int,
    tls: ssl.SSLContext | None, on_ready: Callable[[int], None] | None,
    drain_seconds: float = 0.0, reuse_port: bool = False,
    stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
    stop_fd: int | None = None, max_per_source: int | None = None,
    output_budget: int | None = None,
) -> bool:
    loop = asyncio.get_running_loop()
    connections = Connections(app.handle, app.refuse, proxies, max_connections, max_per_source,
                              output_budget, streams_body=proxy.streams_body)
    # The address first: a busy port must fail before the store is opened (and,
    # on an empty store, before a bootstrap key is made). Connections are
    # accepted only once the store is open.
    try:
        server = await loop.create_server(
            connections.protocol, host, port, reuse_address=True, reuse_port=reuse_port or None,
            backlog=2048,
            start_serving=False, ssl=tls,
            # A client that opens a connection and never finishes the handshake
            # is dropped like one that never sends a request.
            ssl_handshake_timeout=REQUEST_READ_S if tls is not None else None,
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

    signals = _Signals(connections)
    for sig in stop_signals:
        loop.add_signal_handler(sig, signals.received)
    # SIGHUP reopens the log files (logrotate); it never stops the server.
    loop.add_signal_handler(signal.SIGHUP, app.reopen_logs)
    if stop_fd is not None:
        _read_stops(loop, stop_fd, signals, app.reopen_logs)
    await signals.stop.wait()
    await _stop(app, server, connections, signals, drain_seconds)
    return True


async def _stop(
    app: App, server: asyncio.Server, connections: Connections, signals: _Signals,
    drain_seconds: float,
) -> None:
    """The graceful stop (SPEC §6), in the order load balancers need:
    1. readiness off at once, so that they stop sending new work here;
    2. everything else keeps serving for `drain_seconds`, the time they take to
       notice (their probe interval times the failures they wait for);
    3. the listener closes (new connections are refused), parked waiters are
       answered 503 shutting_down, idle connections close, and requests in
       flight get GRACEFUL_SHUTDOWN_S to finish."""
    app.stop_being_ready()
    if drain_seconds > 0:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(signals.hurry.wait(), drain_seconds)
    loop = asyncio.get_running_loop()
    server.close()
    app.begin_shutdown()
    connections.shut()
    deadline = loop.time() + GRACEFUL_SHUTDOWN_S
    while connections.busy() and loop.time() < deadline and not connections.aborted:
        await asyncio.sleep(_POLL_S)
    connections.abort()
    await asyncio.sleep(0)  # let the aborted transports report connection_lost
    await app.shutdown()


def _read_stops(loop: asyncio.AbstractEventLoop, fd: int, signals: _Signals,
                reopen: Callable[[], None]) -> None:
    """A worker's standard input: each byte from its supervisor is a stop, or
    (REOPEN) a SIGHUP the supervisor received; its end is a stop."""
    os.set_blocking(fd, False)

    def readable() -> None:
        try:
            data = os.read(fd, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the writer is gone: stop, once
            loop.remove_reader(fd)
            signals.received()
        for byte in data:
            if byte == REOPEN[0]:
                reopen()
            else:
                signals.received()

    loop.add_reader(fd, readable)


class _Signals:
    """SIGTERM/SIGINT: the first starts the stop; one during the drain ends the
    drain early; one after it stops waiting for requests in flight."""

    def __init__(self, connections: Connections) -> None:
        self.stop = asyncio.Event()
        self.hurry = asyncio.Event()
        self._connections = connections

    def received(self) -> None:
        if not self.stop.is_set():
            self.stop.set()
        elif not self.hurry.is_set():
            self.hurry.set()
        else:
            self._connections.aborted = True
