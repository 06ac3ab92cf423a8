"""A fork's first load by the writer (issue 33), counted, not timed: its tree is its source's at
the fork point, as large, so it is read where a large workspace's is, on the loading thread's
own connection, in the load's one read transaction; the event loop's connections (aiosqlite's
``read``, the ``lookup`` seeks) only seek.

``python -m bench fork`` measured the fork's first write at 1.6x a workspace's first write
after a writer's restart, its 100,000 rows read through aiosqlite and placed on the event
loop's thread, which every other workspace of the writer waited on meanwhile."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

from contracts import requests as rq
from infra.store import Store
from infra.store.base import Steps
from quill.client import Quill
from tests.helpers import start_reader, start_writer

FILES = 300
"""More than ``infra.store.load.SMALL_LOAD`` rows: a load apart from the loop."""
ON_LOOP = 2_000
"""Steps the loop's connections may take for the first write (before: 12,480 at 300 files,
about 40 a file; now some 700, the same at any size)."""


async def counted(store: Store, op: Callable[[], Awaitable[object]]) -> Steps:
    steps = Steps()
    await store.count_steps(steps)
    try:
        await op()
    finally:
        await store.count_steps(None)
    return steps


async def test_a_forks_first_load_reads_its_layers_on_the_loading_thread(
    nats_url: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        writer = await start_writer(stack, nats_url, tmp_path / "writer")
        await start_reader(stack, nats_url, tmp_path / "r1", instance="r1")
        quill = await Quill.connect(nats_url, actor="tester", timeout=10)
        stack.push_async_callback(quill.close)
        src = quill.workspace("load/src")
        await src.create()
        await src.apply([rq.PutChange(path=f"d/f{n}.txt", content=f"{n}\n") for n in range(FILES)])
        await quill.fork("load/src", "fork")
        fork = quill.workspace("load/fork")
        first = await counted(writer.store, lambda: fork.write("w.txt", "1\n"))
        assert first.counts["loader"] > 10 * FILES, first.counts  # the source's rows, there
        # on the loop: seeks (the fork's row, its layers, the probes of their sizes), not rows
        assert first.counts["read"] + first.counts["lookup"] < ON_LOOP, first.counts
        assert (await fork.read("d/f7.txt")).content == "7\n"
        assert (await fork.glob("**/*.txt")).total == FILES + 1
