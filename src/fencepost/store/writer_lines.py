"""The jobs a writer with several connections has waiting (store/batch.py), and
which of them its next batch may take."""

from __future__ import annotations

import collections
import heapq
import itertools
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fencepost.store.batch import Job, Key

# The most operations in one batch of an inline writer (SQLite's statements
# are calls in this process).
MAX_BATCH = 512
# The most a batch takes from these lines: a writer with several connections.
# Its keys are held until it commits, and on PostgreSQL each operation that
# its first statement did not decide costs a few round trips: with 512, while
# 10,000 waiters joined the lines of 100 locks, batches ran for 3-5 s, the
# writer's other connections found every key held, and the waiters' sweep
# could not refresh a place before it ran out (parking never finished). 64
# is a whole batch of workload (a) at 64 connections: alternating runs at
# 512, 128 and 64 showed no difference beyond this machine's noise.
MAX_LINES_BATCH = 64


class JobLines:
    """The jobs waiting for a connection, in submission order, and the keys
    that the batches in flight hold. A batch takes the waiting jobs in order,
    passing over each job that touches a key a batch in flight holds (and
    every later job on that key, so one key's jobs keep their order).

    Each key has a line of its jobs, and a job is ready when it is first in
    the line of every key it touches and no batch in flight holds any of
    them; ready jobs wait in a heap by submission order. A job marked
    `ahead` joins the front of its keys' lines instead, and the heap's front
    (upkeep that must not wait behind a backlog). A take and a finish
    then cost a few steps per job, however many wait: scanning every waiting
    job at each take cost the writer most of a core when 10,000 waiters
    joined the lines of 100 locks (they queue behind one another, key by
    key), and parking them took minutes."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._lines: dict[Key, collections.deque[Job[Any]]] = {}
        self._ready: list[tuple[int, Job[Any]]] = []  # a heap by submission order
        self._held: set[Key] = set()
        self._waiting = 0
        self._submitted = itertools.count()
        self._ahead = itertools.count(-1, -1)  # before every ordinary job, latest first
        self._stopping = False

    def put(self, job: Job[Any]) -> None:
        job.keys = tuple(set(job.keys))  # once in each line it joins
        with self._changed:
            job.order = next(self._ahead if job.ahead else self._submitted)
            self._waiting += 1
            first = True
            for key in job.keys:
                line = self._lines.get(key)
                if line is None:
                    self._lines[key] = collections.deque((job,))
                elif job.ahead:
                    # The job it displaces stays in the ready heap if it is
                    # there: popped, it is found not ready and skipped, and
                    # pushed again once this one is taken (_next_batch).
                    line.appendleft(job)
                else:
                    line.append(job)
                    first = False
            if first and self._ready_now(job):
                heapq.heappush(self._ready, (job.order, job))
                self._changed.notify()

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()

    def count(self) -> int:
        """How many jobs wait for a batch."""
        return self._waiting

    def take(self) -> tuple[list[Job[Any]], set[Key]] | None:
        """The next batch and the keys it holds, waiting for one; None once
        stopping and nothing is left."""
        with self._changed:
            while True:
                taken = self._take_now()
                if taken is not None:
                    return taken
                if self._stopping and not self._waiting:
                    self._changed.notify_all()
                    return None
                self._changed.wait()

    def take_ready(self) -> tuple[list[Job[Any]], set[Key]] | None:
        """The next batch and the keys it holds, or None when no job is ready
        now (never waits: for a writer on the event loop)."""
        with self._changed:
            return self._take_now()

    def _take_now(self) -> tuple[list[Job[Any]], set[Key]] | None:
        batch, keys = self._next_batch()
        if not batch:
            return None
        self._held |= keys
        return batch, keys

    def waiting(self) -> list[Job[Any]]:
        """Every job not yet taken into a batch (for the watchdog: rare, and
        a walk over all of them)."""
        with self._changed:
            seen: dict[int, Job[Any]] = {}
            for line in self._lines.values():
                for job in line:
                    seen.setdefault(id(job), job)
            for _, job in self._ready:
                seen.setdefault(id(job), job)
            return [job for job in seen.values() if not job.taken]

    def done(self, keys: set[Key]) -> None:
        with self._changed:
            self._held -= keys
            for key in keys:
                line = self._lines.get(key)
                if line and self._ready_now(line[0]):
                    heapq.heappush(self._ready, (line[0].order, line[0]))
            if self._ready or self._stopping:
                self._changed.notify_all()

    def _ready_now(self, job: Job[Any]) -> bool:
        """First in each of its lines, and none of its keys held by a batch in
        flight (the batch being taken holds none yet: its own jobs on a key
        may follow one another in it)."""
        lines, held = self._lines, self._held
        return not job.taken and all(
            lines[key][0] is job and key not in held for key in job.keys
        )

    def _next_batch(self) -> tuple[list[Job[Any]], set[Key]]:
        batch: list[Job[Any]] = []
        keys: set[Key] = set()
        ready = self._ready
        while ready and len(batch) < MAX_LINES_BATCH:
            _, job = heapq.heappop(ready)
            if not self._ready_now(job):
                continue  # taken, or a key is held now: pushed again when it is free
            job.taken = True
            self._waiting -= 1
            batch.append(job)
            keys.update(job.keys)
            for key in job.keys:
                line = self._lines[key]
                line.popleft()
                if not line:
                    del self._lines[key]
                elif self._ready_now(line[0]):
                    heapq.heappush(ready, (line[0].order, line[0]))
        return batch, keys
