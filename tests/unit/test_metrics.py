"""``infra.metrics.Live``: gauges read on scrape from the sources services add."""

from __future__ import annotations

import prometheus_client as prom
import pytest

from infra.metrics import Live, Sources, worst
from tests.metrics_scrape import Scrape


def scraped(registry: prom.CollectorRegistry) -> Scrape:
    return Scrape.parse(prom.generate_latest(registry).decode())


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> prom.CollectorRegistry:
    """A registry of the test's own (``Live`` registers where ``prom.REGISTRY`` points)."""
    own = prom.CollectorRegistry(auto_describe=True)
    monkeypatch.setattr(prom, "REGISTRY", own)
    return own


def test_no_source_no_sample_then_summed_or_worst(registry: prom.CollectorRegistry) -> None:
    total = Live("t_total_depth", "summed")
    deepest = Live("t_deepest", "worst", combine=worst)
    assert "t_total_depth" not in scraped(registry).declared  # a process without the service
    a, b = Sources(), Sources()
    for sources, n in ((a, 3), (b, 5)):
        sources.add(total, lambda n=n: n)
        sources.add(deepest, lambda n=n: n)
    now = scraped(registry)
    assert (now.value("t_total_depth"), now.value("t_deepest")) == (8, 5)
    b.remove()
    now = scraped(registry)
    assert (now.value("t_total_depth"), now.value("t_deepest")) == (3, 3)


def test_labelled_values_merge_and_a_failing_source_is_left_out(
    registry: prom.CollectorRegistry,
) -> None:
    busy = Live("t_busy", "per tenant", labels=("tenant",))
    sources = Sources()
    sources.add(busy, lambda: {("a",): 1, ("b",): 2})
    sources.add(busy, lambda: {("a",): 4})

    def broken() -> float:
        raise RuntimeError("dictionary changed size during iteration")

    sources.add(busy, broken)
    now = scraped(registry)
    assert (now.value("t_busy", tenant="a"), now.value("t_busy", tenant="b")) == (5, 2)
