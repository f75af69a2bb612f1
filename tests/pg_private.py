"""PostgreSQL servers of a test's own: initdb in a temporary folder, run as the
`postgres` user on a free port, so that crashing, pausing or promoting them
disturbs nothing else (the machine's shared server on 5432 is never touched).

A primary and its streaming standbys (pg_basebackup -R) make a real
replication pair: the standby replays the primary's WAL over a replication
connection, and `promote` makes it a primary on a new timeline, which is what
every failover manager does after the old primary is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from support import free_port, missing

PG_BIN = Path("/usr/lib/postgresql")


def _server_binaries() -> Path:
    versions = sorted(PG_BIN.glob("*/bin/pg_ctl")) if PG_BIN.exists() else []
    if not versions or os.geteuid() != 0 or shutil.which("runuser") is None:
        missing("PostgreSQL server binaries and root (to run them as postgres)")
    return versions[-1].parent


class PrivatePostgres:
    def __init__(self, root: Path, standby_of: PrivatePostgres | None = None,
                 settings: dict[str, str] | None = None) -> None:
        self.bin = _server_binaries()
        self.data = root / "pgdata"
        self.port = free_port()
        self.settings = dict(settings or {})
        root.mkdir(parents=True, exist_ok=True)
        shutil.chown(root, "postgres")
        if standby_of is None:
            self._as_postgres(self.bin / "initdb", "-D", str(self.data), "-U", "postgres",
                              "--auth=trust", "-E", "UTF8")
        else:
            # A copy of the running primary that streams from it: -R writes
            # primary_conninfo and standby.signal.
            self._as_postgres(self.bin / "pg_basebackup", "-D", str(self.data), "-h",
                              "127.0.0.1", "-p", str(standby_of.port), "-U", "postgres",
                              "-X", "stream", "-R", "--checkpoint=fast")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *cmd: object) -> None:
        done = subprocess.run(["runuser", "-u", "postgres", "--", *map(str, cmd)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{cmd[0]} failed: {done.stdout}{done.stderr}"

    def start(self, env: dict[str, str] | None = None) -> None:
        """Start and wait until it takes connections; `env` for the server's
        processes (libfaketime's variables, say)."""
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1"
        for name, value in self.settings.items():
            options += f" -c {name}={value}"
        wrapper = ["env", *(f"{name}={value}" for name, value in (env or {}).items())]
        self._as_postgres(*wrapper, self.bin / "pg_ctl", "-D", self.data, "-w", "-l",
                          self.data / "log.txt", "-o", options, "start")

    def crash(self) -> None:
        """Stop at once, without a checkpoint: what a crash leaves behind."""
        self._as_postgres(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "stop")

    def kill9(self) -> None:
        """SIGKILL the postmaster and every backend: a machine that died."""
        for pid in [self.postmaster(), *self._children()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self._alive(self.postmaster()):
            time.sleep(0.05)

    def pause(self) -> None:
        """SIGSTOP the postmaster and every backend: the machine froze (a VM
        paused, a long stall); connections stay open, nothing answers."""
        for pid in [self.postmaster(), *self._children()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        if not (self.data / "postmaster.pid").exists():
            return  # not running: nothing paused
        for pid in [self.postmaster(), *self._children()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def promote(self) -> None:
        self._as_postgres(self.bin / "pg_ctl", "-D", self.data, "-w", "promote")

    def stop(self) -> None:
        self.resume()  # a paused server does not stop
        subprocess.run(["runuser", "-u", "postgres", "--", str(self.bin / "pg_ctl"), "-D",
                        str(self.data), "-m", "immediate", "stop"], capture_output=True,
                       timeout=60)

    def postmaster(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def _children(self) -> list[int]:
        done = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.postmaster())],
                              capture_output=True, text=True, timeout=10)
        return [int(pid) for pid in done.stdout.split()]

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description is not None else []


@contextlib.contextmanager
def private_root() -> Iterator[Path]:
    # Not under pytest's tmp_path: that is private to root, and the servers run
    # as the postgres user.
    root = Path(tempfile.mkdtemp(prefix="fencepost-pg-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Relay:
    """A TCP relay on loopback between a standby and its primary, standing for
    the network between them. `hold()` stops handing the primary's bytes on
    (the relay keeps reading, so the primary goes on sending, as over a slow
    or congested link); `cut()` closes every connection and drops what was
    held, so the standby never receives it: an asynchronous standby that was
    behind when its primary died."""

    def __init__(self, target_port: int) -> None:
        import socket
        import threading

        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held = threading.Event()
        self.cutting = threading.Event()
        self.dropped = 0  # bytes the primary sent that the standby never got
        self._sockets: list[socket.socket] = []
        self._guard = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self.cutting.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._guard:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: Any, sink: Any, from_primary: bool) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(1)
                return
            if from_primary and self.held.is_set():
                with self._guard:
                    self.dropped += len(data)
                continue
            try:
                sink.sendall(data)
            except OSError:
                return

    def hold(self) -> None:
        self.held.set()

    def cut(self) -> None:
        self.cutting.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._guard:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
