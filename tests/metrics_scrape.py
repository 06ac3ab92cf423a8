"""Reading Prometheus metrics in tests: this process's registry (the services started in
process), or a scrape served over HTTP; samples by name and labels."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import prometheus_client as prom
from prometheus_client.parser import text_string_to_metric_families

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


async def until(condition: Callable[[Scrape], bool], timeout: float = 20.0) -> Scrape:
    """Scrape until ``condition`` holds (gauges change as the services work); the scrape.

    Raises:
        TimeoutError: it did not hold within ``timeout`` seconds (the last scrape said).
    """
    try:
        async with asyncio.timeout(timeout):
            while not condition(now := scrape()):
                await asyncio.sleep(0.02)  # polling a scrape: nothing to wait on instead
    except TimeoutError:
        last = _quill(scrape())
        raise TimeoutError(f"not seen within {timeout} s; last scrape:\n{last}") from None
    return now


def _quill(s: Scrape) -> str:
    return "\n".join(line for line in s.text.splitlines() if line.startswith("quill_"))
