"""Forks (``python -m bench fork``, issue 33): what a fork costs, beside its baseline.

One stack (a nats-server, a writer and a reader, each its own process) holds ``bench/small``
(10 files) and ``bench/big`` (100,000 files; 1,000,000 events, or with ``--fast`` fewer: its
log is synthesised and appended directly, as ``bench size`` does). Timed, each the median of
``SAMPLES`` forks under new names, and printed with its ratio to the baseline of the same run:

* a fork of the big workspace against a fork of the small one (goal: at most 2x: a fork
  copies nothing, whatever the source holds);
* 100 forks of one version (one after another) against one (goal: at most 100x);
* a read in a fork of the big workspace against the same read in the big workspace; and the
  fork's first write (the writer loads the fork's tree: the source's at the fork point, as a
  first write after a restart loads a workspace's) against a write to the big workspace.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable

from bench import size
from bench.size import bare_nats, pinged, service
from contracts.limits import LimitsPatch
from infra import bus
from quill.client import Quill

SAMPLES = 9
FANOUT = 100
FILES = 100_000
EVENTS = 1_000_000
FAST_EVENTS = FILES // size.PER_EVENT + 10_000
GOALS = {"fork": 2.0, "fanout": float(FANOUT)}


async def timed(op: Callable[[int], Awaitable[object]], samples: int, start: int = 0) -> float:
    """Milliseconds: the median of ``samples`` calls ``op(i)`` after one unmeasured call."""
    await op(start)
    took = []
    for i in range(start + 1, start + samples + 1):
        t0 = time.perf_counter()
        await op(i)
        took.append(time.perf_counter() - t0)
    return statistics.median(took) * 1000


def line(label: str, ms: float, base: float, goal: float | None = None) -> None:
    ratio = ms / base if base else 0.0
    target = f"  (goal <= {goal:g}x)" if goal is not None else ""
    print(f"{label:<52} {ms:>10.2f} ms {ratio:>8.2f}x{target}")


async def main(files: int = FILES, events: int | None = None, fast: bool = False) -> None:
    events = events or (FAST_EVENTS if fast else EVENTS)
    with bare_nats("fork") as (tmp, server, procs):
        nc = await bus.connect(server.url, "bench-fork")
        made = await size.build(nc, files, events, name="bench/big", max_versions=None)
        procs.append(service(server.url, "writer", tmp / "writer"))
        procs.append(service(server.url, "reader", tmp / "reader"))
        await pinged(nc, "writer")
        quill = await Quill.connect(server.url, actor="bench", timeout=3600)
        await size.applied(quill, "bench/big", events)
        small = quill.workspace("bench/small")
        await small.create(limits=LimitsPatch(max_files=100))
        for n in range(10):
            await small.write(f"f{n}.txt", f"{n}\n")
        big = quill.workspace("bench/big")
        print(f"Forks: bench/big {files:,} files, {events:,} events (log appended in {made:.0f} s)")
        print(f"{'':<52} {'median':>13} {'ratio':>9}")

        async def fork_small(i: int) -> None:
            await quill.fork("bench/small", f"s{i}")

        async def fork_big(i: int) -> None:
            await quill.fork("bench/big", f"b{i}")

        base = await timed(fork_small, SAMPLES)
        line("fork of a 10-file workspace (baseline)", base, base)
        line(f"fork of {files:,} files, {events:,} events", await timed(fork_big, SAMPLES), base,
             GOALS["fork"])  # fmt: skip

        async def one(i: int) -> None:
            await quill.fork("bench/big", f"one{i}", version=events)

        async def hundred(i: int) -> None:
            for k in range(FANOUT):
                await quill.fork("bench/big", f"h{i}-{k}", version=events)

        single = await timed(one, 3)
        line("one fork of a version (baseline)", single, single)
        line(f"{FANOUT} forks of that version", await timed(hundred, 1), single, GOALS["fanout"])

        path = size.path_of(7)
        fork = quill.workspace("bench/b1")
        await big.read(path)
        read_src = await timed(lambda i: big.read(path), SAMPLES)
        line("read a file of bench/big (baseline)", read_src, read_src)
        line("the same read in its fork", await timed(lambda i: fork.read(path), SAMPLES), read_src)
        write_src = await timed(lambda i: big.write("w.txt", f"{i}\n"), SAMPLES)
        line("write to bench/big (baseline)", write_src, write_src)
        t0 = time.perf_counter()
        await fork.write("w.txt", "first\n")
        first = (time.perf_counter() - t0) * 1000
        line("a fork's first write (the writer loads its tree)", first, write_src)
        line("its next writes", await timed(lambda i: fork.write("w.txt", f"{i}\n"), SAMPLES),
             write_src)  # fmt: skip
        await quill.close()
        await nc.close()
