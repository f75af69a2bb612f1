"""The server processes of one machine that serve one SQLite file: who is
alive, and how they wake each other's waiters.

Several processes serve one store file (the workers of `fencepost serve
--workers N`; a `fencepost project create` opens it beside them). Each draws a
random replica id (sql/replicas.py) and, for as long as it lives, binds a Unix
datagram socket named after it in Linux's abstract namespace. The kernel
drops the name the moment the process ends, however it ends (kill -9
included), so:

- liveness: a replica is dead exactly when its name can be bound by someone
  else: a fact the kernel knows, never a guess from slowness, so a loaded
  worker's waiters keep their place (the contract of sql/replicas.py);
- wake-ups: a process that frees a lock or slot sends the Freed events to
  every other replica's name after its commit, as PostgreSQL's replicas do
  with NOTIFY. A datagram to a local socket is delivered whole or, when the
  receiver is hopelessly behind (its buffer full), not at all; the waiters'
  safety wake (server/waiting.py) is the net for that case.

Where abstract names do not exist (not Linux), the names are files in the
temporary folder and a replica is dead when nobody receives at its file.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import socket
import struct
import sys
import tempfile
from typing import Any, Callable

from fencepost.store.base import Freed
from fencepost.store.batch import Cursor, Tx
from fencepost.store.sql.replicas import new_replica_id

# Events per datagram: a batch that frees hundreds of locks stays far below
# the socket buffer in a few datagrams.
EVENTS_PER_DATAGRAM = 64
_MAX_DATAGRAM = 65536
_READS_PER_TURN = 256
_ABSTRACT = sys.platform == "linux"
# struct ucred: pid, uid, gid (three C ints), sent along with SO_PASSCRED.
_UCRED = struct.Struct("3i")
_CREDENTIALS = socket.CMSG_SPACE(_UCRED.size) if _ABSTRACT else 0


def _from_this_user(ancillary: list[tuple[int, int, bytes]]) -> bool:
    if not _ABSTRACT:
        return True  # the socket file is this user's alone (mode 0600)
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS \
                and len(data) >= _UCRED.size:
            return bool(_UCRED.unpack_from(data)[1] == os.getuid())
    return False


def _address(replica: str) -> str | bytes:
    if _ABSTRACT:
        return b"\0fencepost-replica/" + replica.encode()
    return os.path.join(tempfile.gettempdir(), f"fencepost-replica-{replica}.sock")


def _is_alive(replica: str) -> bool:
    """Whether the process of `replica` still holds its name. In doubt (an
    error other than the name being taken or free), alive: a live waiter
    dropped from its line is worse than a dead one kept a little longer."""
    address = _address(replica)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            if _ABSTRACT:
                probe.bind(address)  # taken only while its owner lives
            else:
                probe.connect(address)  # refused once nobody receives there
        except OSError as exc:
            if not _ABSTRACT and exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                with contextlib.suppress(OSError):
                    os.unlink(address)
                return False
            return True  # the name is taken (EADDRINUSE), or in doubt
        return not _ABSTRACT  # bound: nobody held it


def encode(events: list[Freed]) -> list[bytes]:
    """The datagrams that carry `events`."""
    rows = [[e.kind, e.project, e.name, e.wake_all] for e in events]
    return [json.dumps(rows[i:i + EVENTS_PER_DATAGRAM]).encode()
            for i in range(0, len(rows), EVENTS_PER_DATAGRAM)]


def decode(datagram: bytes) -> list[Freed]:
    """The events of one datagram; nothing from one that is not ours."""
    try:
        rows = json.loads(datagram)
        return [Freed(str(kind), str(project), str(name), bool(wake_all))
                for kind, project, name, wake_all in rows]
    except (ValueError, TypeError):
        return []


class LocalPeers:
    """The Liveness of the SQLite store (sql/replicas.py), and its channel for
    wake-ups between the processes serving the file."""

    def __init__(self) -> None:
        self.replica = new_replica_id()
        self._socket: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- this process's name ---------------------------------------------------
    def bind(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[list[Freed]], None]) -> None:
        """Take this replica's name (before its row is written: a row whose
        name is free is a dead replica's) and hand what peers send to
        `deliver`, on `loop`."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        if _ABSTRACT:
            # An abstract name has no file permissions: any local user can
            # send to it. The kernel stamps each datagram with its sender's
            # uid, and only this user's are read.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind(_address(self.replica))
        if not _ABSTRACT:
            os.chmod(_address(self.replica), 0o600)
        self._socket, self._loop = sock, loop

        def readable() -> None:
            events: list[Freed] = []
            for _ in range(_READS_PER_TURN):  # a flood must not hold the loop
                try:
                    datagram, ancillary, _flags, _from = sock.recvmsg(_MAX_DATAGRAM, _CREDENTIALS)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                if _from_this_user(ancillary):
                    events.extend(decode(datagram))
            if events:
                deliver(events)

        loop.add_reader(sock.fileno(), readable)

    def unbind(self) -> None:
        sock, self._socket = self._socket, None
        if sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(sock.fileno())
        sock.close()
        if not _ABSTRACT:
            with contextlib.suppress(OSError):
                os.unlink(_address(self.replica))

    # --- Liveness ------------------------------------------------------------------
    def register(self, tx: Tx) -> None:
        tx.execute(
            "INSERT INTO replicas (id, started_ms) VALUES (?, ?) ON CONFLICT (id) DO NOTHING",
            (self.replica, tx.now_ms),
        )

    def dead_replicas(self, tx: Tx) -> list[str]:
        if self._socket is None:  # a store that only reads and writes (no name)
            return []
        self.register(tx)
        dead = [replica for replica in self.others(tx.execute) if not _is_alive(replica)]
        for replica in dead:
            tx.execute("DELETE FROM replicas WHERE id = ?", (replica,))
        return dead

    def others(self, execute: Callable[[str, tuple[Any, ...]], Cursor]) -> list[str]:
        """The other replicas on record (`execute`: a Tx's or a connection's)."""
        rows = execute("SELECT id FROM replicas WHERE id <> ?", (self.replica,)).fetchall()
        return [replica for (replica,) in rows]

    # --- wake-ups --------------------------------------------------------------------
    def send(self, replicas: list[str], events: list[Freed]) -> None:
        """Tell `replicas` about `events` (just committed). Called on the
        writer thread; a peer that died or cannot keep up is skipped."""
        sock = self._socket
        if sock is None or not replicas or not events:
            return
        datagrams = encode(events)
        for replica in replicas:
            address = _address(replica)
            for datagram in datagrams:
                try:
                    sock.sendto(datagram, address)
                except OSError:
                    break  # gone (the reaper removes it) or its buffer is full
