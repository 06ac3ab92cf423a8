"""Console (``python -m bench.console [--files N] [--events N]``): the first paint of the
console's timeline, tree and workspaces pages for a workspace of 100,000 files and 1,000,000
events, each printed next to a baseline measured in the same run: the same data through the
SDK (the ``events``, ``list`` and ``workspaces`` queries each page makes) and through REST.

The log is made as ``bench/size.py`` makes it (writer-shaped events appended in atomic
batches on a bare nats-server: 100 files an event, then single-file writes), then a writer
and a reader replica run as processes and a gateway in this process. Figures: the median of
``ROUNDS`` of the whole HTML page served (``html``: request to last byte, over HTTP), and,
when Playwright and Chromium are there, the browser's first contentful paint of the page
(``paint``: navigation start to the first text drawn).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from bench import size
from infra import bus
from quill.client import Quill
from services.gateway.server import GatewayConfig, start_gateway

ROUNDS = 7
CHROMIUM = "/usr/bin/chromium"


async def median_s(call: Callable[[], Awaitable[Any]], rounds: int = ROUNDS) -> float:
    took = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await call()
        took.append(time.perf_counter() - t0)
    return statistics.median(took)


async def build(url: str, files: int, events: int) -> float:
    """The log of ``bench/size`` (``size.build``), appended; seconds it took."""
    nc = await bus.connect(url, "bench-console")
    try:
        return await size.build(nc, files, events)
    finally:
        await nc.close()


async def paints(base: str, pages: dict[str, str]) -> dict[str, float]:
    """Each page's first contentful paint in headless Chromium (median ms), if available."""
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        return {}
    if shutil.which(CHROMIUM) is None:
        return {}
    found: dict[str, float] = {}
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        for label, path in pages.items():
            took = []
            for _ in range(ROUNDS):
                await page.goto(base + path, wait_until="load")
                fcp = await page.wait_for_function(
                    "performance.getEntriesByName('first-contentful-paint')[0]?.startTime",
                    timeout=10_000,
                )
                took.append(float(await fcp.json_value()))
            found[label] = statistics.median(took)
        await browser.close()
    return found


def row(label: str, seconds: float, paint_ms: float | None, base: str) -> None:
    paint = f"{paint_ms:8.0f} ms" if paint_ms is not None else f"{'-':>11}"
    print(f"{label:<34} {seconds * 1000:8.0f} ms {paint}   {base}")


async def main(files: int = size.FILES, events: int = size.EVENTS) -> None:
    with size.bare_nats("console") as (tmp, server, procs):
        made = await build(server.url, files, events)
        procs.append(size.service(server.url, "writer", tmp / "writer"))
        procs.append(size.service(server.url, "reader", tmp / "reader"))
        quill = await Quill.connect(server.url, actor="bench", timeout=3600)
        t0 = time.perf_counter()
        await size.applied(quill, "bench/size", events)
        caught = time.perf_counter() - t0
        nc = await bus.connect(server.url, "bench-console-ping")
        await size.pinged(nc, "writer")
        await nc.close()
        ws = quill.workspace("bench/size")
        t0 = time.perf_counter()
        await ws.create(exist_ok=True)  # what the gateway asks first: the writer loads it
        loaded = time.perf_counter() - t0
        gateway = await start_gateway(GatewayConfig(server.url, port=0))
        print(f"Console: {files:,} files, {events:,} events")
        print(
            f"(log appended in {made:.0f} s; a reader replica caught up in {caught:.0f} s; "
            f"the writer loaded it in {loaded:.0f} s)\n"
        )
        pages = {
            "timeline (newest 50 events)": "/ui/w/bench:size/",
            "timeline, an old page": f"/ui/w/bench:size/?before={events // 2}",
            "tree (root)": "/ui/w/bench:size/tree",
            "tree (a directory of 100 files)": "/ui/w/bench:size/tree?path=d000",
            "workspaces": "/ui/?tenant=bench",
        }
        baselines: dict[str, tuple[str, Callable[[], Awaitable[Any]]]] = {
            "timeline (newest 50 events)": (
                "SDK events (50)",
                lambda: ws.events(after=events - 50, limit=50),
            ),
            "timeline, an old page": (
                "SDK events (50)",
                lambda: ws.events(after=events // 2 - 51, limit=50),
            ),
            "tree (root)": ("SDK list (200)", lambda: ws.list(".", limit=200)),
            "tree (a directory of 100 files)": (
                "SDK list (200)",
                lambda: ws.list("d000", limit=200),
            ),
            "workspaces": ("SDK workspaces", lambda: quill.workspaces("bench")),
        }
        async with httpx.AsyncClient(base_url=gateway.url, timeout=600) as http:
            for path in pages.values():  # warm: the gateway's handles, the replica's caches
                (await http.get(path)).raise_for_status()
            rest = await median_s(lambda: http.get("/v1/workspaces?limit=50"))
            print(f"{'page':<34} {'html':>11} {'paint':>11}   baseline (same run)")
            painted = await paints(gateway.url, pages)
            for label, path in pages.items():
                served = await median_s(lambda path=path: http.get(path))
                name, call = baselines[label]
                base = await median_s(call)
                row(label, served, painted.get(label), f"{name} {base * 1000:.0f} ms")
            print(f"\n(REST GET /v1/workspaces, tenant default: {rest * 1000:.0f} ms)")
        await gateway.stop()
        await quill.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.console")
    parser.add_argument("--files", type=int, default=size.FILES)
    parser.add_argument("--events", type=int, default=size.EVENTS)
    args = parser.parse_args()
    asyncio.run(main(args.files, args.events))
