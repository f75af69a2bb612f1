"""The garbage collector's settings for a server process.

A server holding many requests at once (10,000 parked waiters, each a
connection, a request and a few coroutines) has a large heap of long-lived
objects, and CPython's full (generation 2) collection walks all of it: with
the default thresholds one ran every few seconds under load and stopped the
event loop for 0.3-0.9 s each time, every request in flight waiting behind it
(measured: workload (e) p99 0.38-1.1 s, against 0.1 s with these settings; see
docs/decisions.md). Objects made at startup are never garbage, so they leave
the collector's view altogether; the young generations are collected less
often, and the full collection runs a hundred times more rarely. Cycles that
outlive a young collection wait longer to be freed, which costs some memory,
not correctness: almost everything a request makes is freed by reference
counting, without the collector.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 50, 1_000)


def tune() -> None:
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
