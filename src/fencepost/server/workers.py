"""`fencepost serve --workers N`: N serving processes on one port.

One CPython process serves on one core (the interpreter lock), so a machine
with more cores runs several. The supervisor (this module, the process the
user started):

1. holds the port: it binds it first, so a busy port fails before anything
   else, and keeps it (bound, never listening) so that port 0 names one port
   and nobody else takes it while a worker restarts;
2. opens the store once: migrations and the bootstrap key happen here, before
   any worker exists (a bad store is one line and exit 1, as without workers);
3. starts the workers (`python -m fencepost.server.worker`), each listening on
   the port with SO_REUSEPORT, so the kernel spreads new connections over
   them; each opens its own store connections and does its own group commit
   (SQLite's write lock serialises the workers' batches, as PostgreSQL's
   advisory lock serialises replicas). They share the supervisor's clock
   anchor, so that on SQLite they agree on every instant (SPEC §2);
4. says "serving on" once every worker listens with its store open;
5. passes each SIGTERM or SIGINT on to every worker as one stop (through
   the worker's standard input; workers take no stop signals, see
   worker.py), each of which then drains as SPEC §6 says, and exits 0 when
   all did; passes each SIGHUP on to every worker the same way, which
   reopens its log files (logrotate);
6. restarts a worker that dies (its parked waiters leave their lines as a
   dead replica's do), unless workers keep dying: then it stops the others
   and exits 1, loudly, rather than serve on a fraction of its capacity
   forever.

A worker stops (drains) when its supervisor dies, even by kill -9: its
standard input ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Callable

from prometheus_client.multiprocess import mark_process_dead

from fencepost.clock import SteadyClock
from fencepost.server.launch import ServeOptions
from fencepost.server.metrics import MULTIPROCESS_DIR
from fencepost.server.runner import REOPEN
from fencepost.store import make_store

_log = logging.getLogger("fencepost.serve")

# A stop, written to a worker's standard input (runner.REOPEN is the other byte).
STOP = b"s"
# A worker must say it is ready within this long of its start.
WORKER_START_S = 60.0
# More deaths than this within the window: the service stops instead.
MAX_DEATHS = 5
DEATH_WINDOW_S = 60.0
_POLL_S = 0.05


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def hold_port(host: str, port: int) -> list[socket.socket]:
    """Bind `host:port` (every address `host` names) for the workers to share.
    Raises OSError when the port is taken, by anyone: the first bind is made
    without SO_REUSEPORT, which no one else's socket on the port allows."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    held: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in infos:
            if held:  # one port for every address: the first one's
                address = (address[0], held[0].getsockname()[1], *address[2:])
            probe = socket.socket(family, kind, proto)
            with probe:
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)  # busy: EADDRINUSE, before anything is made
                address = probe.getsockname()
            sock = socket.socket(family, kind, proto)
            held.append(sock)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
    except OSError:
        for sock in held:
            sock.close()
        raise
    return held


async def prepare_store(
    options: ServeOptions, anchor: tuple[int, int],
    on_bootstrap: Callable[[str, bool], None] | None,
) -> None:
    """Migrate the store and make the bootstrap key, once, before any worker."""
    store = make_store(options.store, readers=0, clock_anchor=anchor,
                       timeout_s=options.store_timeout)
    await store.open()
    try:
        secret = await store.bootstrap(options.bootstrap_key)
    finally:
        await store.close()
    if secret is not None and on_bootstrap is not None:
        on_bootstrap(secret, options.bootstrap_key is None)


_METRICS_PREFIX = "fencepost-metrics-"


def new_metrics_dir() -> str:
    """A fresh folder for the workers' metrics, named after this process; the
    folders of supervisors that died without removing theirs (kill -9) are
    removed on the way."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_METRICS_PREFIX}*-*"):
        owner = folder.name.removeprefix(_METRICS_PREFIX).split("-", 1)[0]
        if owner.isdigit() and folder.stat().st_uid == os.getuid() \
                and not _alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{_METRICS_PREFIX}{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


@dataclass(slots=True)
class _Worker:
    number: int
    proc: subprocess.Popen[bytes]
    ready_fd: int | None  # closed (None) once the worker said it is ready
    told: bool = False  # its failed exit was logged


class Supervisor:
    def __init__(self, options: ServeOptions, count: int) -> None:
        self.options = options
        self.count = count
        self.anchor = SteadyClock().anchor
        self.workers: dict[int, _Worker] = {}
        self.signals: deque[int] = deque()
        self.stopping = False
        self.deaths: deque[float] = deque()
        # Each worker's metrics live in files here, so that any worker's
        # /metrics answers for all (see server/metrics.py).
        self.metrics_dir = new_metrics_dir()

    # --- workers -------------------------------------------------------------
    def spawn(self, number: int, port: int) -> None:
        read_end, write_end = os.pipe()
        config = {
            "options": {**self.options.to_json(), "port": port},
            "number": number, "clock_anchor": list(self.anchor), "ready_fd": write_end,
        }
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fencepost.server.worker"],
                stdin=subprocess.PIPE, pass_fds=(write_end,),
                env={**os.environ, MULTIPROCESS_DIR: self.metrics_dir},
            )
        finally:
            os.close(write_end)
        assert proc.stdin is not None
        # The options (secrets among them) go through a pipe, never argv or
        # env; the pipe stays open to carry the stops (see worker.py).
        proc.stdin.write(json.dumps(config).encode() + b"\n")
        proc.stdin.flush()
        self.workers[number] = _Worker(number, proc, read_end)

    def starting(self) -> list[_Worker]:
        return [w for w in self.workers.values() if w.ready_fd is not None]

    def collect_ready(self, timeout: float) -> None:
        """Mark the workers that said they are ready (or whose pipe closed:
        they died, which the supervising loop then sees)."""
        fds = {w.ready_fd: w for w in self.starting() if w.ready_fd is not None}
        if not fds:
            time.sleep(timeout)
            return
        readable, _, _ = select.select(list(fds), [], [], timeout)
        for fd in readable:
            worker = fds[fd]
            said = os.read(fd, 16)
            os.close(fd)
            worker.ready_fd = None
            if not said:  # closed without a word: it is dying
                worker.proc.wait()

    def stop_workers(self) -> None:
        """One stop to every worker: the first starts its drain, the second
        ends the drain, the third stops waiting for requests in flight."""
        for worker in self.workers.values():
            if worker.proc.poll() is None and worker.proc.stdin is not None:
                try:
                    worker.proc.stdin.write(STOP)
                    worker.proc.stdin.flush()
                except OSError:
                    pass  # it is ending already

    def ended(self) -> list[_Worker]:
        return [w for w in self.workers.values() if w.proc.poll() is not None]

    def forget(self, worker: _Worker) -> None:
        """A dead worker: its gauges leave the sums; its counts stay."""
        self.workers.pop(worker.number)
        mark_process_dead(worker.proc.pid, self.metrics_dir)  # type: ignore[no-untyped-call]

    def close_pipes(self) -> None:
        for worker in self.workers.values():
            if worker.ready_fd is not None:
                os.close(worker.ready_fd)
                worker.ready_fd = None
            if worker.proc.stdin is not None:
                try:
                    worker.proc.stdin.close()
                except OSError:
                    pass

    # --- signals ---------------------------------------------------------------
    def on_signal(self, sig: int, frame: FrameType | None) -> None:
        self.signals.append(sig)

    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.on_signal)

    def pass_signals_on(self) -> None:
        """Each SIGTERM or SIGINT becomes one stop to every worker; each SIGHUP
        is sent on to every worker, which reopens its log files."""
        while self.signals:
            if self.signals.popleft() == signal.SIGHUP:
                self.reopen_logs()
                continue
            self.stopping = True
            self.stop_workers()

    def reopen_logs(self) -> None:
        """Tell every worker to reopen its log files, through its standard
        input like a stop: a worker still starting reads it once it runs (a
        signal could end it before it set its handler)."""
        told = 0
        for worker in self.workers.values():
            if worker.proc.poll() is None and worker.proc.stdin is not None:
                try:
                    worker.proc.stdin.write(REOPEN)
                    worker.proc.stdin.flush()
                    told += 1
                except OSError:
                    pass  # it is ending already; a replacement opens the files afresh
        _log.info("SIGHUP: passed on to %d workers, to reopen their log files", told)

    def too_many_deaths(self, now: float) -> bool:
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > DEATH_WINDOW_S:
            self.deaths.popleft()
        return len(self.deaths) > MAX_DEATHS


def _describe_exit(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"code {code}"


def supervise(
    options: ServeOptions, count: int, on_ready: Callable[[int], None],
    on_bootstrap: Callable[[str, bool], None] | None,
) -> None:
    """Run `count` workers until SIGTERM/SIGINT; exit 0 once all drained, 1
    after one line on stderr when the service cannot start or keeps failing."""
    try:
        held = hold_port(options.host, options.port)
    except OSError as exc:
        print(f"fencepost: cannot listen on {options.host}:{options.port}: "
              f"{_one_line(exc.strerror or exc)}", file=sys.stderr)
        raise SystemExit(1) from None
    port = held[0].getsockname()[1]
    supervisor = Supervisor(options, count)
    supervisor.install_signals()
    try:
        try:
            asyncio.run(prepare_store(options, supervisor.anchor, on_bootstrap))
        except Exception as exc:  # noqa: BLE001 - reported in one line, no traceback
            print(f"fencepost: cannot start: {_one_line(exc)}", file=sys.stderr)
            raise SystemExit(1) from None
        raise SystemExit(_run(supervisor, port, on_ready))
    finally:
        supervisor.close_pipes()
        for sock in held:
            sock.close()
        shutil.rmtree(supervisor.metrics_dir, ignore_errors=True)


def _run(supervisor: Supervisor, port: int, on_ready: Callable[[int], None]) -> int:
    for number in range(1, supervisor.count + 1):
        supervisor.spawn(number, port)
    announced = False
    deadline = time.monotonic() + WORKER_START_S
    failed = False
    while True:
        supervisor.pass_signals_on()
        supervisor.collect_ready(_POLL_S)
        if not (announced or supervisor.stopping or supervisor.starting()
                or supervisor.ended()):
            announced = True
            on_ready(port)
        if not announced and not supervisor.stopping and time.monotonic() > deadline:
            print("fencepost: cannot start: the workers did not start in time", file=sys.stderr)
            failed = True
            supervisor.stopping = True
            supervisor.stop_workers()
        for worker in supervisor.ended():
            code = worker.proc.returncode
            if supervisor.stopping:
                if code != 0 and not worker.told:
                    worker.told = True
                    _log.error("worker %d (pid %d) ended (%s) while stopping", worker.number,
                               worker.proc.pid, _describe_exit(code))
                failed = failed or code != 0
                continue
            if not announced:
                # A worker that cannot start: its own line said why.
                print(f"fencepost: cannot start: worker {worker.number} exited "
                      f"({_describe_exit(code)})", file=sys.stderr)
            elif not supervisor.too_many_deaths(time.monotonic()):
                _log.error("worker %d (pid %d) ended (%s); starting it again",
                           worker.number, worker.proc.pid, _describe_exit(code))
                supervisor.forget(worker)
                supervisor.spawn(worker.number, port)
                continue
            else:
                _log.error("worker %d (pid %d) ended (%s), the %dth worker death within "
                           "%.0f s; stopping the service", worker.number, worker.proc.pid,
                           _describe_exit(code), len(supervisor.deaths), DEATH_WINDOW_S)
            failed = True
            supervisor.stopping = True
            supervisor.stop_workers()
        if supervisor.stopping and len(supervisor.ended()) == len(supervisor.workers):
            return 1 if failed else 0
