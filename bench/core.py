"""The core figures (issue 2): write and read throughput and latency against their
baselines, and a read at an old version against a read at the latest."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import nats
from nats.js.api import StorageType, StreamConfig

from bench.harness import (
    Load,
    Process,
    closed_loop,
    interleaved,
    payload,
    quill_up,
    row,
    serial,
    settle,
)
from quill.client import Quill

CLIENTS = 64
PAYLOAD = "x" * 199 + "\n"


def fmt(load: Load) -> str:
    return f"{load.rate:,.0f}/s"


def lat(load: Load) -> str:
    return f"{load.pct(0.5):.1f}/{load.pct(0.99):.1f} ms"


async def bare_publish(url: str, seconds: float) -> Load:
    """64 clients publishing to JetStream with per-subject CAS, each on its own subject."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(name="BENCH", subjects=["bench.cas.>"], storage=StorageType.FILE)
    )
    last = [0] * CLIENTS

    async def op(n: int, i: int) -> None:
        msg = await nc.request(
            f"bench.cas.{n}",
            PAYLOAD.encode(),
            timeout=10,
            headers={"Nats-Expected-Last-Subject-Sequence": str(last[n])},
        )
        ack = json.loads(msg.data)
        if "error" in ack:
            raise RuntimeError(ack)
        last[n] = ack["seq"]

    load = await closed_loop(CLIENTS, op, seconds)
    await js.delete_stream("BENCH")
    await nc.close()
    return load


async def quill_writes(quill: Quill, workspaces: int, seconds: float) -> Load:
    names = [f"bench/w{n}" for n in range(workspaces)]
    for name in names:
        await quill.workspace(name).create(exist_ok=True)

    async def op(n: int, i: int) -> None:
        name = names[n % workspaces]
        await quill.workspace(name).write(f"c{n}/f{i % 10}.txt", payload(n * 1_000_000 + i))

    return await closed_loop(CLIENTS, op, seconds)


async def echo_reads(url: str, seconds: float) -> Load:
    nc = await nats.connect(url)
    body = PAYLOAD.encode()

    async def op(n: int, i: int) -> None:
        await nc.request("bench.echo", body, timeout=10)

    load = await closed_loop(CLIENTS, op, seconds)
    await nc.close()
    return load


async def quill_reads(quill: Quill, seconds: float) -> Load:
    ws = quill.workspace("bench/reads")
    await ws.create(exist_ok=True)
    await ws.write("doc.txt", PAYLOAD * 5)

    async def op(n: int, i: int) -> None:
        await ws.read("doc.txt")

    return await closed_loop(CLIENTS, op, seconds)


async def old_vs_latest(quill: Quill, versions: int, samples: int) -> tuple[float, float]:
    ws = quill.workspace("bench/versions")
    await ws.create(exist_ok=True)
    first = (await ws.write("f.txt", "version 0\n")).file_version
    first_version = ws.last_version
    queue = list(range(1, versions))

    async def writer() -> None:
        while queue:
            i = queue.pop()
            await ws.write("f.txt", f"version {i}\n")

    await asyncio.gather(*[writer() for _ in range(CLIENTS)])
    assert (await ws.stat("f.txt")).file_version == first + versions - 1
    old, latest = [], []
    for _ in range(samples):
        t0 = time.perf_counter()
        await ws.read("f.txt", version=first_version)
        t1 = time.perf_counter()
        await ws.read("f.txt")
        t2 = time.perf_counter()
        old.append(t1 - t0)
        latest.append(t2 - t1)
    return serial(old), serial(latest)


async def main(seconds: float = 4.0, versions: int = 10_000, rounds: int = 3) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        up, url = quill_up(Path(tmp) / "quill")
        echo = Process([sys.executable, "-m", "bench.echo", url], "echo ready")
        try:
            quill = await Quill.connect(url, timeout=30)
            print(
                f"Quill core benchmark: {CLIENTS} closed-loop clients; each figure measured in "
                f"{rounds} rounds of {seconds:.0f}s, alternating with its baseline (median "
                "round shown); one nats-server with sync_interval: always; 2 cores\n"
            )
            print(f"{'figure':<44} {'quill':>16} {'baseline':>16} {'ratio':>8}  goal")

            async def spread_writes() -> Load:
                return await quill_writes(quill, 64, seconds)

            async def hot_writes() -> Load:
                return await quill_writes(quill, 1, seconds)

            async def bare() -> Load:
                load = await bare_publish(url, seconds)
                await settle(url)
                return load

            base_w, spread, hot = await interleaved(rounds, bare, spread_writes, hot_writes)
            print(
                row(
                    "write: 64 clients on 64 workspaces",
                    fmt(spread),
                    fmt(base_w),
                    spread.rate / base_w.rate,
                    ">= 1.0x bare CAS publish",
                )
            )
            print(
                row(
                    "write: 64 clients on 1 hot workspace",
                    fmt(hot),
                    fmt(base_w),
                    hot.rate / base_w.rate,
                    ">= 1.0x bare CAS publish",
                )
            )
            print(
                row(
                    "  1 hot workspace against 64 workspaces",
                    fmt(hot),
                    fmt(spread),
                    hot.rate / spread.rate,
                    ">= 0.9x (issue 29; bench hot: contention)",
                )
            )
            print(
                row(
                    "  write p50/p99 latency (64 workspaces)",
                    lat(spread),
                    lat(base_w),
                    spread.pct(0.5) / base_w.pct(0.5),
                    "(latency ratio)",
                )
            )
            print(
                row(
                    "  write p50/p99 latency (hot workspace)",
                    lat(hot),
                    lat(base_w),
                    hot.pct(0.5) / base_w.pct(0.5),
                    "(latency ratio)",
                )
            )
            await settle(url)

            async def echo_figure() -> Load:
                return await echo_reads(url, seconds)

            async def read_figure() -> Load:
                return await quill_reads(quill, seconds)

            base_r, reads = await interleaved(rounds, echo_figure, read_figure)
            print(
                row(
                    "read: 64 clients, 1 KB file",
                    fmt(reads),
                    fmt(base_r),
                    reads.rate / base_r.rate,
                    ">= 0.5x bare echo",
                )
            )
            print(
                row(
                    "  read p50/p99 latency",
                    lat(reads),
                    lat(base_r),
                    reads.pct(0.5) / base_r.pct(0.5),
                    "(latency ratio)",
                )
            )
            old, latest = await old_vs_latest(quill, versions, 2000)
            print(
                row(
                    f"read at version 1 of {versions:,} (median, serial)",
                    f"{old:.0f} us",
                    f"{latest:.0f} us",
                    old / latest,
                    "<= 1.2x latest",
                )
            )
            await quill.close()
        finally:
            echo.stop()
            up.stop()


if __name__ == "__main__":
    asyncio.run(main())
