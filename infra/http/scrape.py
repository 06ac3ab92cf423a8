"""One scrape for a gateway of several worker processes (``infra/http/workers.py``).

Each worker counts in its own process, and the kernel hands a ``GET /metrics`` on the shared
HTTP port to any of them. So each worker n ≥ 1 serves its own registry on a loopback port it
picks (and tells worker 0 with "ready"), and worker 0 serves the whole: its own series and
each live worker's, every one labelled ``worker`` (``"0"``, ``"1"``, …), on ``--metrics-port``
and on its ``GET /metrics``; the ``GET /metrics`` of another worker answers worker 0's.

A gateway's counters and histograms are then the sum over ``worker``
(``sum without (worker) (rate(quill_requests_total[5m]))``), ``process_*`` are each worker's,
and a worker's restart is a counter reset of its own series, as Prometheus expects. A worker
that does not answer within ``PEER_TIMEOUT_S`` (one being restarted) is left out of that
scrape. A gateway of one worker serves its registry as it is, without the label.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import prometheus_client as prom
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry
from starlette.requests import Request
from starlette.responses import Response

from infra.runtime import MetricsServer, serve_metrics

PEER_TIMEOUT_S = 2.0
SCRAPES_AT_ONCE = 2
"""Threads answering ``GET /metrics`` (a flood of scrapes waits for them, not the threads the
rest of the gateway uses)."""
LABEL = "worker"


def fetch(url: str, accept: str = openmetrics.CONTENT_TYPE_LATEST) -> tuple[bytes, str] | None:
    """``GET url``: its body and content type, or None if it did not answer 200 in time."""
    request = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=PEER_TIMEOUT_S) as answer:  # noqa: S310
            return answer.read(), answer.headers.get("Content-Type", prom.CONTENT_TYPE_LATEST)
    except OSError:  # refused, timed out, or an HTTP error status
        return None


def _labelled(merged: dict[str, prom.Metric], worker: str, families: Iterable[prom.Metric]) -> None:
    for family in families:
        into = merged.get(family.name)
        if into is None:
            into = merged[family.name] = prom.Metric(
                family.name, family.documentation, family.type, family.unit
            )
        for sample in family.samples:
            labels = {**sample.labels, LABEL: worker}
            into.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)


class Whole(Collector):
    """Worker 0's series and each other worker's (``peers()``: worker → its metrics URL)."""

    def __init__(self, peers: Callable[[], dict[int, str]]) -> None:
        self.peers = peers

    def describe(self) -> list[prom.Metric]:
        return []  # nothing fixed: registering must not scrape the workers

    def collect(self) -> Iterator[prom.Metric]:
        merged: dict[str, prom.Metric] = {}
        _labelled(merged, "0", prom.REGISTRY.collect())
        for worker, url in sorted(self.peers().items()):
            answer = fetch(url)
            if answer is None:
                continue
            try:
                text = answer[0].decode()
                families = list(text_string_to_metric_families(text))  # type: ignore[no-untyped-call]
            except ValueError:  # not an exposition: not a worker of ours answering
                continue
            _labelled(merged, str(worker), families)
        yield from merged.values()


class Scrape:
    """What a gateway process serves as its metrics: ``endpoint`` for ``GET /metrics``, and
    ``serve`` for ``--metrics-port``.

    ``relay``: the whole gateway's metrics URL (worker 0's), for a worker n ≥ 1, whose
    ``GET /metrics`` answers it. Otherwise this is worker 0 (or the only worker), whose
    ``peers`` the launcher of its workers sets (``Workers.metrics``)."""

    def __init__(self, relay: str | None = None) -> None:
        self.relay = relay
        self.peers: Callable[[], dict[int, str]] = dict
        self.registry: Any = prom.REGISTRY
        self.server: MetricsServer | None = None
        self._threads: ThreadPoolExecutor | None = None

    async def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(SCRAPES_AT_ONCE, "quill-scrape")
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    def serve(self, port: int | None, host: str, workers: int) -> MetricsServer | None:
        """Serve the metrics on ``host:port`` (``port`` None: on no port of its own, unless
        there are other ``workers`` to relay to this one: then on a free loopback port).

        Raises:
            RuntimeError: it cannot listen there.
        """
        if workers > 1:
            self.registry = CollectorRegistry(auto_describe=False)
            self.registry.register(Whole(lambda: self.peers()))
            if port is None:
                port, host = 0, "127.0.0.1"
        self.server = serve_metrics(port, host, self.registry)
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None

    async def endpoint(self, request: Request) -> Response:
        """``GET /metrics``."""
        accept = request.headers.get("accept", "")
        if self.relay is not None:
            answer = await self._off_loop(fetch, self.relay, accept)
            if answer is None:
                return Response("worker 0 did not answer\n", status_code=503)
            return Response(answer[0], media_type=answer[1])
        if self.registry is prom.REGISTRY:
            return Response(prom.generate_latest(), media_type=prom.CONTENT_TYPE_LATEST)
        body = await self._off_loop(prom.generate_latest, self.registry)
        return Response(body, media_type=prom.CONTENT_TYPE_LATEST)
