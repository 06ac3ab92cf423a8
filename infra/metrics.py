"""The Prometheus families the services export (catalogue: docs/operations.md, "Health and
metrics"; the dashboard and alert rules in ``deploy/`` use them).

Counters and histograms are counted where things happen, through children bound once (a label
lookup costs more than the increment). Gauges of a service's state are :class:`Live`: nothing
is done on the hot path; a scrape asks each running service (``Live.add``) for its value.
Scrapes of ``--metrics-port`` run in prometheus-client's HTTP thread, so a source reads the
service's state without awaiting, and copies a container before walking it (``tuple(d)`` is
one step under the GIL; a generator over a dict being changed is not).

The writer's batch sizes and append latency are in ``services/writer/append.py``, its
partitions' in ``services/writer/partitions.py``, where they are counted.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import prometheus_client as prom
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from contracts.subjects import Subjects

log = logging.getLogger("quill.metrics")

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

# ---------------------------------------------------------------- every service

REQUESTS = prom.Counter(
    "quill_requests_total",
    "Requests handled, by service, kind, op and outcome (ok or the error code).",
    ["service", "kind", "op", "outcome"],
)
LATENCY = prom.Histogram(
    "quill_request_seconds",
    "Time from receiving a request to replying.",
    ["service", "kind", "op"],
    buckets=LATENCY_BUCKETS,
)
PUBLISH_FAILURES = prom.Counter(
    "quill_publish_failures_total",
    "Audit records and workspace.updated notices that could not be published.",
    ["service", "stream"],
)


class Requests:
    """``quill_requests_total`` and ``quill_request_seconds`` of one service, their children
    bound once per (kind, op, outcome): op names and outcomes are bounded sets."""

    def __init__(self, service: str) -> None:
        self.service = service
        self._bound: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    def observe(self, kind: str, op: str, outcome: str, elapsed: float) -> None:
        bound = self._bound.get((kind, op, outcome))
        if bound is None:
            bound = self._bound[(kind, op, outcome)] = (
                REQUESTS.labels(self.service, kind, op, outcome),
                LATENCY.labels(self.service, kind, op),
            )
        bound[0].inc()
        bound[1].observe(elapsed)


def publish_failed(service: str, stream: str) -> None:
    """Count one record of ``stream`` (``audit``, ``updated``) that ``service`` could not
    publish (rare: no child to cache)."""
    PUBLISH_FAILURES.labels(service, stream).inc()


_REFUSED_PUBLISH = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)


def refused_publishes(service: str, subjects: Subjects) -> Callable[[Exception], None]:
    """An error callback for ``bus.connect``: a publish of an audit record or a
    ``workspace.updated`` notice that the server refused (the service's credentials may not
    publish there) comes back as an asynchronous error; count it as a publish failure."""
    streams = {
        subjects.audit("t", "w").rsplit(".", 2)[0].lower() + ".": "audit",
        subjects.updated("t", "w").rsplit(".", 2)[0].lower() + ".": "updated",
    }

    def on_error(exc: Exception) -> None:
        match = _REFUSED_PUBLISH.search(str(exc))
        if match is None:
            return
        subject = match.group(1).lower()
        for prefix, stream in streams.items():
            if subject.startswith(prefix):
                publish_failed(service, stream)

    return on_error


# ---------------------------------------------------------------- gauges read on scrape

Value = float | Mapping[tuple[str, ...], float]
"""What a source says: a number, or a number per label values (a labelled gauge)."""


class Live(Collector):
    """A gauge computed when scraped, from the sources the running services added: several
    services of one process (as the tests run them) are ``combine``d (summed, or the worst of
    them). No source: no sample (a gateway shows no writer queue)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: tuple[str, ...] = (),
        combine: Callable[[Iterable[float]], float] = sum,
    ) -> None:
        self.name, self.documentation, self.labels = name, documentation, labels
        self.combine = combine
        self._sources: dict[int, Callable[[], Value]] = {}
        prom.REGISTRY.register(self)

    def add(self, source: Callable[[], Value]) -> Callable[[], None]:
        """Read ``source`` at each scrape until the returned function is called."""
        key = id(source)
        self._sources[key] = source

        def remove() -> None:
            self._sources.pop(key, None)

        return remove

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self.name, self.documentation, labels=self.labels)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        values: list[Value] = []
        for source in tuple(self._sources.values()):
            try:
                values.append(source())
            except Exception:  # a scrape never fails for one source; the next one reads again
                log.debug("metric %s: a source failed", self.name, exc_info=True)
        if not values:
            return
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
        if not self.labels:
            family.add_metric([], self.combine(float(v) for v in values))  # type: ignore[arg-type]
        else:
            merged: dict[tuple[str, ...], list[float]] = {}
            for value in values:
                assert isinstance(value, Mapping)
                for key, n in value.items():
                    merged.setdefault(key, []).append(n)
            for key, ns in sorted(merged.items()):
                family.add_metric(list(key), self.combine(ns))
        yield family


def worst(values: Iterable[float]) -> float:
    return max(values, default=0.0)


class Sources:
    """The sources one service added, removed together when it stops."""

    def __init__(self) -> None:
        self._removers: list[Callable[[], None]] = []

    def add(self, gauge: Live, source: Callable[[], Value]) -> None:
        self._removers.append(gauge.add(source))

    def remove(self) -> None:
        for remove in self._removers:
            remove()
        self._removers.clear()


# ---------------------------------------------------------------- writer

WRITER_APPENDS = prom.Counter(
    "quill_writer_appends_total",
    "Workspace groups sent to the log, by outcome: ok, conflict (the workspace's or the "
    "partition's sequence moved on), refused, uncertain (no acknowledgement), storage_full.",
    ["outcome"],
)
WRITER_COMPACTIONS_HELD = prom.Counter(
    "quill_writer_compactions_held_total",
    "Compactions due and not run, by why: has_forks (a source's history is read by its "
    "forks up to their fork points).",
    ["reason"],
)
WRITER_MERGE_PATHS = prom.Histogram(
    "quill_writer_merge_paths",
    "Paths a merge read: those changed on either side since its merge base (its cost).",
    buckets=(1, 10, 100, 1_000, 10_000, 100_000),
)
WRITER_QUEUE_DEPTH = Live(
    "quill_writer_queue_depth", "Commands accepted and not yet answered, in all."
)
WRITER_QUEUE_DEPTH_MAX = Live(
    "quill_writer_queue_depth_max",
    "Commands accepted and not yet answered by the workspace that has the most.",
    combine=worst,
)
WRITER_WORKSPACES = Live("quill_writer_workspaces", "Workspaces held in the writer's memory.")

# ---------------------------------------------------------------- reader

READER_LAG_VERSIONS = Live(
    "quill_reader_lag_versions",
    "Events in the log this reader has not applied yet (log's last sequence minus applied).",
    combine=worst,
)
READER_LAG_SECONDS = Live(
    "quill_reader_lag_seconds",
    "How long the oldest event this reader has not applied has been in the log (0: caught up).",
    combine=worst,
)
READER_APPLY_SECONDS = prom.Histogram(
    "quill_reader_apply_seconds",
    "Time to apply one batch of events to the reader's projection.",
    buckets=LATENCY_BUCKETS,
)
READER_VERSION_WAITERS = Live(
    "quill_reader_version_waiters", "Queries waiting for a version (min_version) to be applied."
)

# ---------------------------------------------------------------- executor

EXECUTOR_SLOTS_BUSY = Live(
    "quill_executor_slots_busy", "Slots running a request, per tenant.", labels=("tenant",)
)
EXECUTOR_QUEUED = Live(
    "quill_executor_queued", "Requests waiting for a slot, per tenant.", labels=("tenant",)
)
EXECUTOR_LIVE_COMMANDS = Live(
    "quill_executor_live_commands",
    "Commands running on past their call (exec.run with yield_ms) held here, per tenant.",
    labels=("tenant",),
)
EXECUTOR_SHELLS = Live(
    "quill_executor_shells", "Open shells held here, per tenant.", labels=("tenant",)
)
EXECUTOR_KILLS = prom.Counter(
    "quill_executor_sandbox_kills_total",
    "Commands the executor ended (or processes it killed), by why: timeout, memory, "
    "background (left running), quota (checkout over its bytes), cancel (executor stopping).",
    ["why"],
)
EXECUTOR_EGRESS = prom.Counter(
    "quill_executor_egress_connections_total",
    "Connections through the egress proxy, by verdict: allowed, refused (host not allowed, "
    "address not public, a bad request, a limit), failed (no answer).",
    ["verdict"],
)
EXECUTOR_EGRESS_BYTES = prom.Counter(
    "quill_executor_egress_bytes_total",
    "Bytes the egress proxy relayed, by direction: sent (by commands), received.",
    ["direction"],
)
EXECUTOR_CHECKOUT_BYTES = Live(
    "quill_executor_checkout_bytes", "Bytes the executor's checkouts hold on its disk."
)
