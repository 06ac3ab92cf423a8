"""A hot workspace and contention on one file (``python -m bench hot``, issue 29 item 4).

Each figure next to its baseline, measured in the same run, alternating (``interleaved``):

* **hot workspace**: 64 clients writing to one workspace, against 64 clients each on its own
  workspace (goal: at least 0.9x), both also against the bare CAS publish (``bench core``'s
  baseline);
* **appends**: 64 clients appending lines to one file (``write`` mode ``append``), against one
  client doing the same (goal: at least 0.5x, no client-side retry, no ``CONFLICT``);
* **edits**: 64 clients each replacing its own unique ``old_string`` in one file with ``edit``
  and no ``if_match``, against one client doing the same (goal: at least 0.5x);
* **if_match**: 64 clients reading the file's etag and editing with ``if_match``, retrying a
  ``CONFLICT`` (``Quill.retry_conflicts``, jittered backoff), against one client: the price of
  asking for a conflict on purpose (no goal; shown so that the difference is visible).

``--history N`` (``sustained``) also writes N events to one workspace with 64 clients and
prints the write rate of the last tenth against the first: what a workspace's long life costs
a hot writer.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.core import CLIENTS, bare_publish, fmt, lat, quill_writes
from bench.harness import Load, closed_loop, interleaved, quill_up, row, settle
from quill.client import Quill, Workspace

LINES_PER_FILE = 1_000
"""Appends per file before the next file is started (a file's whole content is in each of its
events: without a bound, the later appends would cost more than the first)."""


OneFile = Callable[[Workspace, int, float, str], Awaitable[Load]]
"""``(ws, clients, seconds, tag)``: clients working on one file for ``seconds`` (``appends``,
``edits``)."""


async def appends(ws: Workspace, clients: int, seconds: float, tag: str) -> Load:
    """``clients`` appending a line each to one file at a time (every ``LINES_PER_FILE``
    appends, the next file), checked at the end: every acknowledged line is there once."""
    counter = itertools.count()
    done: dict[str, set[str]] = {}

    async def op(n: int, i: int) -> None:
        k = next(counter)
        path = f"append/{tag}-{k // LINES_PER_FILE}.log"
        line = f"{n:02} {i:06} {'x' * 28}\n"
        await ws.write(path, line, mode="append")
        done.setdefault(path, set()).add(line)

    load = await closed_loop(clients, op, seconds)
    for path, lines in done.items():
        text = await ws.read_text(path)
        held = text.splitlines(keepends=True)
        assert set(held) >= lines and len(held) == len(set(held)), f"{path}: lines lost"
    return load


async def edits(ws: Workspace, clients: int, seconds: float, tag: str) -> Load:
    """``clients`` each replacing its own line's unique token in one file of 64 lines
    (``edit`` without ``if_match``): none conflicts with another."""
    path = f"edit/{tag}.txt"
    await ws.write(path, "".join(f"line {n:02} v0 {'y' * 40}\n" for n in range(CLIENTS)))
    at = [0] * clients

    async def op(n: int, i: int) -> None:
        await ws.edit(path, f"line {n:02} v{at[n]} ", f"line {n:02} v{at[n] + 1} ")
        at[n] += 1

    load = await closed_loop(clients, op, seconds)
    text = await ws.read_text(path)
    for n in range(clients):
        assert f"line {n:02} v{at[n]} " in text, f"client {n}'s edits lost"
    return load


async def if_match_edits(quill: Quill, ws: Workspace, clients: int, seconds: float) -> Load:
    """``clients`` each reading the file and its etag, then editing its own line with
    ``if_match``, again on ``CONFLICT`` (``retry_conflicts``)."""
    path = f"match/{clients}.txt"
    await ws.write(path, "".join(f"line {n:02} v0\n" for n in range(CLIENTS)))
    at = [0] * clients

    async def op(n: int, i: int) -> None:
        async def attempt() -> None:
            etag = (await ws.stat(path)).etag
            old, new = f"line {n:02} v{at[n]}\n", f"line {n:02} v{at[n] + 1}\n"
            await ws.edit(path, old, new, if_match=etag)

        await quill.retry_conflicts(attempt, retries=1_000)
        at[n] += 1

    return await closed_loop(clients, op, seconds)


async def sustained(quill: Quill, events: int) -> tuple[float, float]:
    """64 clients writing ``events`` writes to one workspace: the rate of the first and of
    the last tenth."""
    ws = quill.workspace("bench/sustained")
    await ws.create(exist_ok=True)
    stamps: list[float] = []
    counter = itertools.count()

    async def client(n: int) -> None:
        while (k := next(counter)) < events:
            await ws.write(f"c{n}/f{k % 50}.txt", f"{k:>12} {'z' * 186}\n")
            stamps.append(time.perf_counter())

    await asyncio.gather(*[client(n) for n in range(CLIENTS)])
    tenth = events // 10
    first = tenth / (stamps[tenth] - stamps[0])
    last = tenth / (stamps[-1] - stamps[-tenth - 1])
    return first, last


async def main(seconds: float = 4.0, rounds: int = 3, history: int = 0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        up, url = quill_up(Path(tmp) / "quill")
        try:
            quill = await Quill.connect(url, timeout=30)
            ws = quill.workspace("bench/contention")
            await ws.create(exist_ok=True)
            print(
                f"Quill hot workspace and contention: {CLIENTS} closed-loop clients; each figure "
                f"measured in {rounds} rounds of {seconds:.0f}s, alternating with its baseline "
                "(median round shown)\n"
            )
            print(f"{'figure':<44} {'quill':>16} {'baseline':>16} {'ratio':>8}  goal")

            async def bare() -> Load:
                load = await bare_publish(url, seconds)
                await settle(url)
                return load

            async def spread() -> Load:
                return await quill_writes(quill, 64, seconds)

            async def hot() -> Load:
                return await quill_writes(quill, 1, seconds)

            base, wide, one = await interleaved(rounds, bare, spread, hot)
            print(row("write: 64 clients, 1 workspace", fmt(one), fmt(wide), one.rate / wide.rate,
                      ">= 0.9x 64 clients on 64 workspaces"))  # fmt: skip
            print(row("  against the bare CAS publish", fmt(one), fmt(base), one.rate / base.rate,
                      "(hot / bare)"))  # fmt: skip
            print(row("  64 workspaces against it", fmt(wide), fmt(base), wide.rate / base.rate,
                      "(spread / bare)"))  # fmt: skip
            print(row("  p50/p99 latency (1 workspace)", lat(one), lat(wide),
                      one.pct(0.5) / wide.pct(0.5), "(latency ratio)"))  # fmt: skip
            await settle(url)
            rounds_done = itertools.count()

            async def many_and_one(op: OneFile) -> list[Load]:
                """``op`` by 64 clients and by one, interleaved (each round its own tag)."""

                async def many() -> Load:
                    return await op(ws, CLIENTS, seconds, f"m{next(rounds_done)}")

                async def one() -> Load:
                    return await op(ws, 1, seconds, f"o{next(rounds_done)}")

                return await interleaved(rounds, many, one)

            many, single = await many_and_one(appends)
            print(row("append: 64 clients, 1 file", fmt(many), fmt(single),
                      many.rate / single.rate, ">= 0.5x 1 client"))  # fmt: skip
            many, single = await many_and_one(edits)
            print(row("edit (unique old_string): 64 clients, 1 file", fmt(many), fmt(single),
                      many.rate / single.rate, ">= 0.5x 1 client"))  # fmt: skip
            print(row("  p50/p99 latency (64 clients)", lat(many), lat(single),
                      many.pct(0.5) / single.pct(0.5), "(latency ratio)"))  # fmt: skip

            async def match_many() -> Load:
                return await if_match_edits(quill, ws, CLIENTS, seconds)

            async def match_one() -> Load:
                return await if_match_edits(quill, ws, 1, seconds)

            many, single = await interleaved(1, match_many, match_one)
            print(row("edit with if_match + retry: 64 clients", fmt(many), fmt(single),
                      many.rate / single.rate, "(no goal: conflicts asked for)"))  # fmt: skip
            if history:
                first, last = await sustained(quill, history)
                print(row(f"write: 64 clients, 1 workspace, {history:,} writes",
                          f"{last:,.0f}/s", f"{first:,.0f}/s", last / first,
                          "(last tenth / first tenth)"))  # fmt: skip
            await quill.close()
        finally:
            up.stop()
