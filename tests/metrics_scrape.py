"""Reading Prometheus metrics in tests: this process's registry (the services started in
process), or a scrape served over HTTP; samples by name and labels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import prometheus_client as prom
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import describe, eventually

Sample = tuple[str, dict[str, str], float]


@dataclass(frozen=True)
class Scrape:
    text: str
    samples: list[Sample]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        samples = [
            (s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
        return cls(text, samples)

    @property
    def declared(self) -> set[str]:
        """Every family with a ``# TYPE`` line."""
        return {line.split()[2] for line in self.text.splitlines() if line.startswith("# TYPE ")}

    def value(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels`` (0 without any)."""
        return sum(
            v
            for n, got, v in self.samples
            if n == name and all(got.get(k) == want for k, want in labels.items())
        )

    def grew(self, before: Scrape, name: str, **labels: str) -> float:
        return self.value(name, **labels) - before.value(name, **labels)


def scrape() -> Scrape:
    """This process's registry, as ``--metrics-port`` serves it."""
    return Scrape.parse(prom.generate_latest().decode())


async def scraped(condition: Callable[[Scrape], bool], timeout: float = 20.0) -> Scrape:
    """This process's scrape once ``condition`` holds of it (gauges change as the services
    work).

    Raises:
        AssertionError: it did not hold within ``timeout`` seconds (the last scrape said).
    """
    try:
        return await eventually(
            lambda: now if condition(now := scrape()) else None, timeout, describe(condition)
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last scrape:\n{_quill(scrape())}") from None


def _quill(s: Scrape) -> str:
    return "\n".join(line for line in s.text.splitlines() if line.startswith("quill_"))
