"""The Prometheus metrics (`GET /metrics`), one registry per app.

Two kinds of series:
- this process's own counters and histograms (requests, acquires, grants and
  ends, refusals, store batches, reaper work), fed by the event hub and a few
  direct hooks; with several replicas each exposes its own, and a query sums
  them;
- the shared state, read from the store at scrape time (live and overdue
  leases, every pool's gauges): the same truth from every replica, so a query
  takes `max` across replicas, never `sum`.

Labels stay few: a route is its template (`/v1/locks/{key}`), never a raw path;
lock keys are never labels; pools are (pools are few and made by admins).

The workers of `serve --workers N` share one port, so a scrape reaches any one
of them: each then answers for all, through prometheus_client's multiprocess
mode (the supervisor gives them one PROMETHEUS_MULTIPROC_DIR; each process's
series live in files there, summed at scrape time, a dead worker's counts
included). The parked-waiters gauge is then refreshed at each reap (4x a
second) rather than read at scrape time.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from fencepost.events import (
    AcquireAttempt,
    DatabaseChanged,
    Ended,
    Event,
    Granted,
    KeyChanged,
    Lost,
    PoolChanged,
    Refused,
    SessionChanged,
)
from fencepost.store.base import Census, PoolView
from fencepost.store.standing import Mode, Replication

# No `_created` series: they double the exposition and no alert or graph here uses them.
disable_created_metrics()  # type: ignore[no-untyped-call]
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
UNMATCHED_ROUTE = "unmatched"  # any path no route serves: one label value, not one per path
# Set (by the supervisor of several workers) before prometheus_client is
# imported; it then keeps every value in that folder's files.
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"

_REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0, 60.0)
_WAIT_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
_HELD_BUCKETS = (0.01, 0.1, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)
_BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class Metrics:
    def __init__(self, parked: Callable[[], int] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "fencepost_http_requests", "HTTP requests answered, by route template and status.",
            ["method", "route", "status"], registry=r)
        self.latency = Histogram(
            "fencepost_http_request_duration_seconds",
            "Time from a request's arrival at the app to its response (waiting in line "
            "included).", ["method", "route"], buckets=_REQUEST_BUCKETS, registry=r)
        self.acquires = Counter(
            "fencepost_acquires", "Lock and slot acquire attempts, by how they ended.",
            ["kind", "outcome"], registry=r)
        self.waited = Histogram(
            "fencepost_acquire_wait_seconds", "How long acquire attempts took, waiting included.",
            ["kind"], buckets=_WAIT_BUCKETS, registry=r)
        self.granted = Counter(
            "fencepost_leases_granted", "New lock leases and pool slots granted by this process.",
            ["kind"], registry=r)
        self.lock_modes = Counter(
            "fencepost_lock_leases_granted",
            "New lock leases granted by this process, by mode (each shared lease and "
            "each key of a lock set counts once).", ["mode"], registry=r)
        self.admissions = Counter(
            "fencepost_pool_admissions", "Slots granted by this process, per pool.",
            ["project", "pool"], registry=r)
        self.ended = Counter(
            "fencepost_leases_ended",
            "Leases and slots ended by this process (the reaper included), by reason.",
            ["kind", "reason"], registry=r)
        self.held = Histogram(
            "fencepost_lease_held_seconds", "How long ended leases and slots were held.",
            ["kind"], buckets=_HELD_BUCKETS, registry=r)
        self.lost = Counter(
            "fencepost_leases_lost", "Renewals refused because the lease was gone, by reason.",
            ["reason"], registry=r)
        self.refused = Counter(
            "fencepost_callers_refused", "Callers refused: 401, 403, or 429 over the key's quota.",
            ["status"], registry=r)
        self.tokens_refused = Counter(
            "fencepost_tokens_refused",
            "JWTs from an identity provider refused (401), by reason: token_expired, "
            "wrong_audience, unknown_key_id, bad_signature... (a fixed set).", ["reason"],
            registry=r)
        self.key_changes = Counter(
            "fencepost_key_changes", "API keys created or revoked.", ["action"], registry=r)
        self.pool_changes = Counter(
            "fencepost_pool_changes", "Pools created, changed or deleted.", ["action"], registry=r)
        self.sessions = Counter(
            "fencepost_sessions",
            "Sessions started, ended (the reaper included) and found lost by their holders' "
            "renewals, by this process, with the reason an end or loss had.",
            ["action", "reason"], registry=r)
        self.database_changes = Counter(
            "fencepost_store_database_changes",
            "Databases a PostgreSQL store's connections reached other than the one this "
            "process last wrote to: `new` (a failover; tokens floored above every one seen), "
            "`went_back` (a database behind one written to, written to for want of another: "
            "an error the operator should look into).", ["change"], registry=r)
        for change in ("new", "went_back"):
            self.database_changes.labels(change)  # 0 from the start, for alerts
        self.batch_size = Histogram(
            "fencepost_store_batch_size", "Operations per store batch (one transaction).",
            ["mode"], buckets=_BATCH_SIZE_BUCKETS, registry=r)
        self.batch_seconds = Histogram(
            "fencepost_store_batch_duration_seconds",
            "Time from a store batch's begin to its commit.",
            ["mode"], buckets=_COMMIT_BUCKETS, registry=r)
        self.batch_failures = Counter(
            "fencepost_store_batch_failures", "Store batches that failed as a whole.",
            ["mode"], registry=r)
        self.batch_replays = Counter(
            "fencepost_store_batch_replays",
            "Store batches rolled back and run again with a savepoint per operation, "
            "because an operation raised (each does the batch's work twice).",
            ["mode"], registry=r)
        for mode in ("write", "read"):
            self.batch_replays.labels(mode)  # shown at 0: an alert can tell "none" from "absent"
        self.reaper_runs = Counter(
            "fencepost_reaper_runs", "Reaper passes of this process.", registry=r)
        self.reaper_freed = Counter(
            "fencepost_reaper_freed", "Leases and slots this process's reaper freed.", registry=r)
        self.reaper_failures = Counter(
            "fencepost_reaper_failures", "Reaper passes that failed.", registry=r)
        self.reaper_seconds = Histogram(
            "fencepost_reaper_duration_seconds", "Time of one reaper pass.",
            buckets=_COMMIT_BUCKETS, registry=r)
        self._shared_dir = os.environ.get(MULTIPROCESS_DIR) or None
        self._parked = parked
        self.waiting = Gauge("fencepost_waiters_parked",
                             "Requests waiting in line in this process now (with workers: "
                             "in all of them).", registry=r, multiprocess_mode="livesum")
        if parked is not None and self._shared_dir is None:
            self.waiting.set_function(parked)
        self.shared = SharedState()
        r.register(self.shared)
        # The request path's children, made once per (method, route, status):
        # afterwards a request costs one dict lookup, an inc and an observe.
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._labelled: dict[tuple[Any, tuple[str, ...]], Any] = {}

    # --- the request path ---------------------------------------------------
    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        children = self._children.get((method, route, status))
        if children is None:
            children = (self.requests.labels(method, route, str(status)),
                        self.latency.labels(method, route))
            self._children[(method, route, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, made once: `labels()` alone costs more than
        the inc or observe it serves."""
        child = self._labelled.get((metric, labels))
        if child is None:
            child = self._labelled[(metric, labels)] = metric.labels(*labels)
        return child

    # --- the event hub's subscriber ------------------------------------------
    def on_event(self, event: Event) -> None:
        if isinstance(event, AcquireAttempt):
            self._child(self.acquires, event.kind, event.outcome).inc()
            self._child(self.waited, event.kind).observe(event.waited_s)
        elif isinstance(event, Granted):
            self._child(self.granted, event.kind).inc()
            if event.mode is not None:
                self._child(self.lock_modes, event.mode).inc()
            if event.kind == "slot":
                self._child(self.admissions, event.project, event.name).inc()
        elif isinstance(event, Ended):
            self._child(self.ended, event.kind, event.reason).inc(event.count)
            if event.held_ms is not None:
                self._child(self.held, event.kind).observe(event.held_ms / 1000)
        elif isinstance(event, Lost):
            self.lost.labels(event.reason or event.code).inc()
        elif isinstance(event, Refused):
            self.refused.labels(str(event.status)).inc()
            if event.token_reason is not None:
                self.tokens_refused.labels(event.token_reason).inc()
        elif isinstance(event, KeyChanged):
            self.key_changes.labels(event.action).inc()
        elif isinstance(event, PoolChanged):
            self.pool_changes.labels(event.action).inc()
        elif isinstance(event, SessionChanged):
            self._child(self.sessions, event.action, event.reason or "").inc()
        elif isinstance(event, DatabaseChanged):
            self.database_changes.labels(event.change).inc()

    # --- the store's hooks ---------------------------------------------------
    def observe_batch(
        self, writes: bool, size: int, seconds: float, failed: bool, replayed: bool
    ) -> None:
        mode = "write" if writes else "read"
        if replayed:  # counted even when the batch then failed: the work was done twice
            self.batch_replays.labels(mode).inc()
        if failed:
            self.batch_failures.labels(mode).inc()
            return
        self.batch_size.labels(mode).observe(size)
        self.batch_seconds.labels(mode).observe(seconds)

    def observe_reap(self, freed: int | None, seconds: float) -> None:
        if self._shared_dir is not None and self._parked is not None:
            self.waiting.set(self._parked())  # the other workers read it from its file
        self.reaper_runs.inc()
        self.reaper_seconds.observe(seconds)
        if freed is None:
            self.reaper_failures.inc()
        else:
            self.reaper_freed.inc(freed)

    def exposition(self, census: Census | None, replication: Replication | None = None) -> bytes:
        """The text exposition, with the shared state as just read (None: the
        store did not answer) and the store's replication as last read."""
        self.shared.census = census
        self.shared.replication = replication
        if self._shared_dir is None:
            return generate_latest(self.registry)
        every_worker = CollectorRegistry()
        MultiProcessCollector(every_worker, self._shared_dir)  # type: ignore[no-untyped-call]
        every_worker.register(self.shared)
        return generate_latest(every_worker)


class SharedState(Collector):
    """The store's counts, as last read (set just before each exposition)."""

    def __init__(self) -> None:
        self.census: Census | None = None
        self.replication: Replication | None = None

    def describe(self) -> Iterable[Metric]:
        return []  # made at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        census = self.census
        up = GaugeMetricFamily("fencepost_store_up",
                               "1 when the store answered this scrape's read, else 0.")
        up.add_metric([], 0 if census is None else 1)
        yield up
        replication = self.replication
        if replication is not None:
            mode = GaugeMetricFamily(
                "fencepost_store_replication",
                "1 for the replication that confirms the store's commits (none, async, sync), "
                "as last read (at each connection and every 10 s).", labels=["mode"])
            for each in Mode:
                mode.add_metric([each.value], 1 if replication.mode == each else 0)
            yield mode
            standbys = GaugeMetricFamily(
                "fencepost_store_standbys", "Standbys streaming from the store's primary.")
            standbys.add_metric([], replication.standbys)
            yield standbys
        if census is None:
            return
        live = GaugeMetricFamily("fencepost_leases_live",
                                 "Live lock leases and pool slots in the store (all replicas).",
                                 labels=["kind"])
        live.add_metric(["lock"], census.live_leases)
        live.add_metric(["slot"], census.live_slots)
        yield live
        overdue = GaugeMetricFamily(
            "fencepost_leases_overdue",
            "Live `keep` leases past their expiry: held on, but no longer renewed.")
        overdue.add_metric([], census.overdue_leases)
        yield overdue
        sessions = GaugeMetricFamily(
            "fencepost_sessions_live", "Live sessions in the store (all replicas).")
        sessions.add_metric([], census.live_sessions)
        yield sessions
        yield from _pool_families(census.pools)


_POOL_GAUGES: tuple[tuple[str, str], ...] = (
    ("in_use", "Live slots of the pool."),
    ("limit", "The pool's configured concurrency limit."),
    ("effective_limit", "The concurrency limit in force now (adaptive pools learn it)."),
    ("queued", "Requests waiting in the pool's line (all replicas)."),
    ("paused", "1 while the pool holds back admissions after throttling evidence."),
    ("learned_rpm", "Requests per minute the pool admits by its rate (learned or set); "
                    "absent without a rate."),
)
_POOL_COUNTERS: tuple[tuple[str, str], ...] = (
    ("released", "Slots released by their holders (the store's count, all replicas)."),
    ("reclaimed", "Slots reclaimed after their holders stopped renewing (all replicas)."),
    ("reported_429", "Releases whose report said status 429 (all replicas)."),
    ("reported_throttled", "Throttled upstream requests reported on release (all replicas)."),
)


def _pool_families(pools: list[tuple[str, PoolView]]) -> Iterator[Metric]:
    labels = ["project", "pool"]
    gauges = {name: GaugeMetricFamily(f"fencepost_pool_{name}", doc, labels=labels)
              for name, doc in _POOL_GAUGES}
    counters = {name: CounterMetricFamily(f"fencepost_pool_{name}", doc, labels=labels)
                for name, doc in _POOL_COUNTERS}
    for project, view in pools:
        at = [project, view.name]
        gauges["in_use"].add_metric(at, view.in_use)
        gauges["limit"].add_metric(at, view.config.limit)
        gauges["effective_limit"].add_metric(at, view.effective_limit)
        gauges["queued"].add_metric(at, view.queued)
        gauges["paused"].add_metric(at, 1 if view.governor.paused_until_ms > view.now_ms else 0)
        if view.effective_rpm is not None:
            gauges["learned_rpm"].add_metric(at, view.effective_rpm)
        counters["released"].add_metric(at, view.stats.released)
        counters["reclaimed"].add_metric(at, view.stats.reclaimed)
        counters["reported_429"].add_metric(at, view.stats.status_429)
        counters["reported_throttled"].add_metric(at, view.stats.throttled)
    yield from gauges.values()
    yield from counters.values()
