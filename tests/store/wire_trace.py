"""libpq's wire trace of a PostgreSQL store's writer connections, to count
what a batch sends and how many times it waits for the database."""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
from typing import Any, Iterator


@contextlib.contextmanager
def wire_trace(store: Any) -> Iterator[list[str]]:
    """libpq's trace of the messages on every writer connection that begins a
    batch meanwhile: the lines of all of them, once the block ends."""
    engine = store._writer._engine
    inner = engine.begin
    traced: dict[int, tuple[Any, str]] = {}
    lines: list[str] = []

    def begin(conn: Any, exclusive: bool, keys: list[int], changes: bool = True) -> Any:
        if exclusive and id(conn) not in traced:
            fd, path = tempfile.mkstemp(prefix="fencepost-trace-")
            conn.pgconn.trace(fd)
            conn.pgconn.set_trace_flags(_flags())
            traced[id(conn)] = (conn, path)
        return inner(conn, exclusive, keys, changes)

    engine.begin = begin
    try:
        yield lines
    finally:
        engine.begin = inner
        for conn, path in traced.values():
            conn.pgconn.untrace()
            with open(path) as trace:
                lines.extend(trace.read().splitlines())
            os.unlink(path)


def _flags() -> Any:
    from psycopg import pq

    return pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE


def count_round_trips(lines: list[str]) -> tuple[int, int]:
    """Statements sent (an Execute, or a simple Query, which may hold several:
    counted as one) and round trips in a trace. A round trip is a request the
    client ends and the database answers with ReadyForQuery: a simple Query, or
    a pipeline's Sync. (Counting each turn from sending to reading would also
    count psycopg reading early results while it still sends, which it does
    when the socket's buffer fills: more turns, no more waits.)"""
    statements = round_trips = 0
    for line in lines:
        direction, _, message = line.split("\t")[:3]
        if direction == "F":
            statements += message in ("Execute", "Query")
            round_trips += message in ("Sync", "Query")
    return statements, round_trips


def summary(lines: list[str]) -> str:
    """The trace's messages with runs of one kind collapsed, for a failure's
    message."""
    kinds = (" ".join(line.split("\t")[:3:2]) for line in lines)
    runs = [(kind, len(list(run))) for kind, run in itertools.groupby(kinds)]
    return ", ".join(kind if count == 1 else f"{kind} x{count}" for kind, count in runs)
