"""Forks (``python -m bench fork``, issue 33): what a fork costs, beside its baseline.

One stack (a nats-server, a writer and a reader, each its own process) holds ``bench/small``
(10 files) and ``bench/big`` (100,000 files; 1,000,000 events, or with ``--fast`` fewer: its
log is synthesised and appended directly, as ``bench size`` does). Timed, each the median of
``SAMPLES`` (forks under new names), a figure and its baseline taking turns sample by sample
(the machine's load shared alike), and printed with its ratio to the baseline of the run:

* a fork of the big workspace against a fork of the small one (goal: at most 2x: a fork
  copies nothing, whatever the source holds);
* 100 forks of one version (one after another) against one (goal: at most 100x);
* a read in a fork of the big workspace against the same read in the big workspace; and the
  fork's first write (the writer loads the fork's tree: the source's at the fork point, as a
  first write after a restart loads a workspace's) against a write to the big workspace;
* merges (each sample a new fork that changed ``CHANGED`` paths, its source ``CHANGED`` other
  paths since; untimed): the merge of such a fork of the big workspace back into it against
  the same merge at the small one (goal: at most 2x: a merge reads the paths changed on either
  side, by range seeks, never the tree; each right after both sides' writes, so it waits for
  the projection to apply them); a dry run against the real merge of the same fork, both after
  an untimed dry run (goal: at most 1.25x: it decides the same and appends nothing; the margin
  is noise); a merge of a ``LINES``-line file changed on both sides, far apart (merged line by
  line) against a merge that takes one side's changed copy of it (goal: at most 3x: diff3 of
  two versions);
* cold loads: a writer restarted on its projection, its first write to the big workspace
  (it loads the tree of 100,000 files) against a warm write, and a new fork's first write
  against that cold first write (goal: at most 2x: a fork's tree is its source's at the fork
  point, read through its layers, as dear as the source's own).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable

from bench import size
from bench.size import bare_nats, pinged, service
from contracts import requests as rq
from contracts.limits import LimitsPatch
from infra import bus
from quill.client import Quill
from quill.workspace import Workspace

SAMPLES = 9
FANOUT = 100
FILES = 100_000
EVENTS = 1_000_000
FAST_EVENTS = FILES // size.PER_EVENT + 10_000
CHANGED = 10
"""Paths a merge's fork changed, and other paths its source changed since the fork."""
LINES = 5_000
COLD = 3
"""Writer restarts."""
GOALS = {"fork": 2.0, "fanout": float(FANOUT), "merge": 2.0, "dry": 1.25, "text": 3.0, "cold": 2.0}


Op = Callable[[int], Awaitable[object]]


async def in_turn(ops: list[tuple[Op, Op | None]], samples: int, start: int = 0) -> list[float]:
    """Milliseconds: of each ``(op, setup)``, the median of ``samples`` calls ``op(i)`` after
    one unmeasured call, each after ``setup(i)`` (not measured). The ops take turns, sample by
    sample, so that a figure and its baseline share the machine's load (2 shared cores)."""
    took: list[list[float]] = [[] for _ in ops]
    for i in range(start, start + samples + 1):
        for (op, setup), times in zip(ops, took, strict=True):
            if setup is not None:
                await setup(i)
            t0 = time.perf_counter()
            await op(i)
            if i > start:
                times.append(time.perf_counter() - t0)
    return [statistics.median(times) * 1000 for times in took]


async def timed(op: Op, samples: int, start: int = 0, setup: Op | None = None) -> float:
    """``in_turn`` of one op."""
    return (await in_turn([(op, setup)], samples, start))[0]


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
        await small.create(limits=LimitsPatch(max_files=1000))
        for n in range(10):
            await small.write(f"f{n}.txt", f"{n}\n")
        big = quill.workspace("bench/big")
        print(f"Forks: bench/big {files:,} files, {events:,} events (log appended in {made:.0f} s)")
        print(f"{'':<52} {'median':>13} {'ratio':>9}")

        async def fork_small(i: int) -> None:
            await quill.fork("bench/small", f"s{i}")

        async def fork_big(i: int) -> None:
            await quill.fork("bench/big", f"b{i}")

        base, of_big = await in_turn([(fork_small, None), (fork_big, None)], SAMPLES)
        line("fork of a 10-file workspace (baseline)", base, base)
        line(f"fork of {files:,} files, {events:,} events", of_big, base, GOALS["fork"])

        async def one(i: int) -> None:
            await quill.fork("bench/big", f"one{i}", version=events)

        async def hundred(i: int) -> None:
            for k in range(FANOUT):
                await quill.fork("bench/big", f"h{i}-{k}", version=events)

        single, many = await in_turn([(one, None), (hundred, None)], 3)
        line("one fork of a version (baseline)", single, single)
        line(f"{FANOUT} forks of that version", many, single, GOALS["fanout"])

        path = size.path_of(7)
        fork = quill.workspace("bench/b1")
        await big.read(path)
        read_src, read_fork = await in_turn(
            [(lambda i: big.read(path), None), (lambda i: fork.read(path), None)], SAMPLES
        )
        line("read a file of bench/big (baseline)", read_src, read_src)
        line("the same read in its fork", read_fork, read_src)
        write_src = await timed(lambda i: big.write("w.txt", f"{i}\n"), SAMPLES)
        line("write to bench/big (baseline)", write_src, write_src)
        t0 = time.perf_counter()
        await fork.write("w.txt", "first\n")
        first = (time.perf_counter() - t0) * 1000
        line("a fork's first write (the writer loads its tree)", first, write_src)
        line("its next writes", await timed(lambda i: fork.write("w.txt", f"{i}\n"), SAMPLES),
             write_src)  # fmt: skip
        await merges(quill, small, big, files)
        await text_merges(quill)

        async def restarted() -> None:
            writer = procs[0]
            writer.terminate()
            writer.wait()
            procs[0] = service(server.url, "writer", tmp / "writer")
            await pinged(nc, "writer")

        await cold(quill, big, write_src, restarted)
        await quill.close()
        await nc.close()


async def merges(quill: Quill, small: Workspace, big: Workspace, files: int) -> None:
    """A fork that changed ``CHANGED`` paths merged back into its source that changed as many
    others: at 10 files, at ``files``; a dry run against the real merge."""

    def diverge(source: Workspace, name: str) -> Callable[[int], Awaitable[object]]:
        async def setup(i: int) -> None:
            forked = await quill.fork(f"{source.tenant}/{source.name}", f"{name}{i}")
            theirs = quill.workspace(forked.workspace)
            changes = [
                rq.PutChange(path=f"{name}{i}-t{k}.txt", content=f"{k}\n") for k in range(CHANGED)
            ]
            await theirs.apply(changes, base_version=forked.version)
            ours = [
                rq.PutChange(path=f"{name}{i}-o{k}.txt", content=f"{k}\n") for k in range(CHANGED)
            ]
            await source.apply(ours)

        return setup

    async def merged(ws: Workspace, name: str, i: int, dry_run: bool = False) -> None:
        done = await ws.merge(f"{name}{i}", dry_run=dry_run)
        assert len(done.changes) == CHANGED and done.committed != dry_run, done

    print(f"Merges: a fork changed {CHANGED} paths, its source {CHANGED} others")
    base, at_big = await in_turn(
        [
            (lambda i: merged(small, "ms", i), diverge(small, "ms")),
            (lambda i: merged(big, "mb", i), diverge(big, "mb")),
        ],
        SAMPLES,
    )
    line("merge at 10 files (baseline)", base, base)
    line(f"merge at {files:,} files", at_big, base, GOALS["merge"])
    dry, real = [], []
    setup = diverge(big, "md")
    for i in range(SAMPLES + 1):
        await setup(i)
        # untimed: the first merge after both sides' writes waits for the writer's projection
        # to apply them (``appender.applied``), which neither timed one should pay alone
        await merged(big, "md", i, dry_run=True)
        t0 = time.perf_counter()
        await merged(big, "md", i, dry_run=True)
        t1 = time.perf_counter()
        await merged(big, "md", i)
        if i:
            dry.append(t1 - t0)
            real.append(time.perf_counter() - t1)
    real_ms, dry_ms = statistics.median(real) * 1000, statistics.median(dry) * 1000
    line(f"merge at {files:,} files, projected (baseline)", real_ms, real_ms)
    line("its dry run just before", dry_ms, real_ms, GOALS["dry"])


def text(edits: dict[int, str]) -> str:
    """``LINES`` lines, those of ``edits`` replaced."""
    return "".join(edits.get(n, f"line {n:05} of a long text file\n") for n in range(LINES))


async def text_merges(quill: Quill) -> None:
    """A ``LINES``-line file changed on both sides, far apart (merged line by line), against a
    merge that takes one side's copy of it."""
    ws = quill.workspace("bench/text")
    await ws.create()
    await ws.write("long.txt", text({}))
    await ws.write("other.txt", "0\n")
    ours: dict[int, str] = {}

    def diverge(name: str, both: bool) -> Callable[[int], Awaitable[object]]:
        async def setup(i: int) -> None:
            forked = await quill.fork("bench/text", f"{name}{i}")
            theirs = quill.workspace(forked.workspace)
            theirs_line = {100: f"line 100 changed in the fork {name}{i}\n"}
            await theirs.write("long.txt", text(ours | theirs_line))
            if both:
                ours[LINES - 100] = f"line {LINES - 100} changed in the source for {name}{i}\n"
                await ws.write("long.txt", text(ours))
            else:
                await ws.write("other.txt", f"{name}{i}\n")
            ours.update(theirs_line)  # what the merge makes of it

        return setup

    async def merged(name: str, i: int, how: str) -> None:
        done = await ws.merge(f"{name}{i}")
        assert [(c.path, c.source) for c in done.changes] == [("long.txt", how)], done

    print(f"Text: a file of {LINES:,} lines")
    base, both = await in_turn(
        [
            (lambda i: merged("tt", i, "theirs"), diverge("tt", False)),
            (lambda i: merged("tb", i, "merged"), diverge("tb", True)),
        ],
        SAMPLES,
    )
    line("a merge taking the fork's copy (baseline)", base, base)
    line("changed on both sides, merged line by line", both, base, GOALS["text"])
    assert await ws.read_text("long.txt") == text(ours)


async def cold(
    quill: Quill, big: Workspace, warm: float, restarted: Callable[[], Awaitable[None]]
) -> None:
    """A writer restarted on its projection: its first write to the big workspace, and a new
    fork's first write, one after the other, in turn first."""
    firsts: list[float] = []
    forks: list[float] = []

    async def source(i: int) -> None:
        t0 = time.perf_counter()
        await big.write("w.txt", f"cold {i}\n")
        firsts.append(time.perf_counter() - t0)

    async def fork(i: int) -> None:
        forked = await quill.fork("bench/big", f"cold{i}")
        ws = quill.workspace(forked.workspace)
        t0 = time.perf_counter()
        await ws.write("w.txt", f"cold {i}\n")
        forks.append(time.perf_counter() - t0)

    for i in range(COLD):
        await restarted()
        for op in (source, fork) if i % 2 == 0 else (fork, source):
            await op(i)
    first, of_fork = statistics.median(firsts) * 1000, statistics.median(forks) * 1000
    print(f"Cold: a writer restarted, each figure the median of {COLD}")
    line("write to bench/big (baseline, warm: above)", warm, warm)
    line("its first write after a restart (loads its tree)", first, warm)
    line("a new fork's first write (loads the source's tree)", of_fork, first, GOALS["cold"])
