"""Load generation and reporting shared by the benchmarks."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


def payload(i: int, size: int = 200) -> str:
    """``size`` bytes of text that differ for each ``i``: a write of the same content as the
    file holds is answered without a commit, so a write benchmark must never repeat one."""
    head = f"{i:>12} "
    return head + "x" * (size - len(head) - 1) + "\n"


@dataclass
class Load:
    ops: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.ops / self.seconds

    def pct(self, q: float) -> float:
        data = sorted(self.latencies)
        return data[min(len(data) - 1, int(q * len(data)))] * 1000 if data else float("nan")


async def closed_loop(
    clients: int, op: Callable[[int, int], Awaitable[object]], seconds: float, warmup: float = 1.0
) -> Load:
    """``clients`` loops each calling ``op(client, i)`` back to back; measured after warm-up."""
    start = time.perf_counter()
    measure_from, stop_at = start + warmup, start + warmup + seconds
    latencies: list[float] = []
    counted = 0

    async def client(n: int) -> None:
        nonlocal counted
        i = 0
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            await op(n, i)
            t1 = time.perf_counter()
            if t0 >= measure_from:
                latencies.append(t1 - t0)
                counted += 1
            i += 1

    await asyncio.gather(*[client(n) for n in range(clients)])
    return Load(counted, seconds, latencies)


def merge(loads: list[Load]) -> Load:
    """Rounds of one figure as one load: throughput is the median round's, latencies pooled."""
    ordered = sorted(loads, key=lambda load: load.rate)
    middle = ordered[len(ordered) // 2]
    return Load(middle.ops, middle.seconds, [x for load in loads for x in load.latencies])


async def interleaved(rounds: int, *figures: Callable[[], Awaitable[Load]]) -> list[Load]:
    """Measure each figure ``rounds`` times, alternating between them, so that drift of the
    machine (other load, caches, disk) falls on all of them alike."""
    results: list[list[Load]] = [[] for _ in figures]
    for _ in range(rounds):
        for i, figure in enumerate(figures):
            results[i].append(await figure())
    return [merge(r) for r in results]


def serial(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


class Process:
    """A child process that prints a ready line; killed with its process group."""

    def __init__(self, argv: list[str], ready: str, cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.line = ""
        deadline = time.monotonic() + 60
        for line in self.proc.stdout:
            if re.search(ready, line):
                self.line = line
                break
            if time.monotonic() > deadline:
                break
        if not self.line:
            self.stop()
            raise RuntimeError(f"{argv} did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def quill_up(data: Path, *extra: str) -> tuple[Process, str]:
    """``quill up`` on free ports (``extra``: more of its options): the process and its NATS
    URL (``proc.line`` has the rest)."""
    proc = Process(
        [
            sys.executable,
            "-m",
            "quill",
            "--log-level",
            "warning",
            "up",
            "--data",
            str(data),
            "--nats-port",
            "0",
            "--http-port",
            "0",
            *extra,
        ],
        r"quill ready",
    )
    url = re.search(r"nats=(\S+)", proc.line)
    assert url is not None
    return proc, url.group(1)


async def settle(url: str, *, indexed: bool = False) -> None:
    """Wait until the reader has applied the whole log (and, with ``indexed``, indexed it)."""
    import json

    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        while True:
            last = (await js.stream_info("WS_EVENTS")).state.last_seq
            pong = json.loads((await nc.request("ws.sys.ping.reader", b"", timeout=5)).data)
            if pong["position"] >= last and not (indexed and pong["indexing"]):
                return
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


def row(label: str, ours: str, base: str, ratio: float, goal: str) -> str:
    return f"{label:<44} {ours:>16} {base:>16} {ratio:>7.2f}x  {goal}"


Row = tuple[str, str, str, float, str]
"""A figure: its label, ours, the baseline's, the ratio, and the goal (or a note)."""


def table(title: str, rows: Sequence[Row], last: str = "goal") -> None:
    """Print ``title``, the columns' header (``last`` names the last column) and ``rows``."""
    print(f"{title}\n")
    print(f"{'figure':<44} {'quill':>16} {'baseline':>16} {'ratio':>8}  {last}")
    for r in rows:
        print(row(*r))
