"""Retention (``max_versions``): what a compaction of a workspace of 1,000 files costs, next to
a client committing the same 1,000 files in one ``apply``; and how much of the log it keeps.

A workspace with ``max_versions = 2`` gets 1,000 files (one apply), then one of them is
rewritten until compaction is due; the figure is the time from the reply of the write that
made it due to the ``workspace.updated`` of the compaction (the manifest built, the contents
and the manifest stored in WS_BLOBS, the event appended and the log purged).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from nats.js import JetStreamContext

from bench.harness import quill_up, table
from contracts import codec
from contracts import requests as rq
from contracts.events import WorkspaceUpdated
from contracts.limits import LimitsPatch
from contracts.subjects import STREAM_EVENTS
from infra.compaction import slack
from quill.client import Quill

FILES = 1000
KEEP = 2
ROUNDS = 5


async def count(js: JetStreamContext, subject: str) -> int:
    """Events the log holds on ``subject``."""
    info = await js.stream_info(STREAM_EVENTS, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def one(quill: Quill, name: str) -> tuple[float, float, int, int]:
    """(compaction seconds, apply seconds, events in the log before, after)."""
    ws = quill.workspace(name)
    await ws.create(limits=LimitsPatch(max_versions=KEEP))
    changes = [
        rq.PutChange(path=f"src/f{i:04}.txt", content=f"file {i}\n" * 20) for i in range(FILES)
    ]
    t0 = time.perf_counter()
    await ws.apply(changes)
    applied = time.perf_counter() - t0
    updates = await quill.nc.subscribe(quill.subjects.updated(ws.tenant, ws.name))
    js = quill.nc.jetstream()
    subject = quill.subjects.evt(ws.tenant, ws.name)
    writes = KEEP + slack(KEEP) + 1
    for i in range(writes - 1):
        await ws.write("hot.md", f"hot {i}\n")
    before = await count(js, subject) + 1
    await ws.write("hot.md", "due\n")
    t0 = time.perf_counter()
    async for msg in updates.messages:
        if codec.decode(msg.data, WorkspaceUpdated).op == "compact":
            break
    compacted = time.perf_counter() - t0
    await updates.unsubscribe()
    after = await count(js, subject)
    return compacted, applied, before, after


async def main(rounds: int = ROUNDS) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        up, url = quill_up(Path(tmp) / "quill")
        try:
            quill = await Quill.connect(url, timeout=60)
            results = [await one(quill, f"bench/retention-{i}") for i in range(rounds)]
            await quill.close()
        finally:
            up.stop()
    ours = statistics.median(r[0] for r in results)
    base = statistics.median(r[1] for r in results)
    before, after = results[-1][2], results[-1][3]
    title = f"Retention: max_versions={KEEP}, {FILES:,} files, median of {rounds}"
    label = f"compact a workspace of {FILES:,} files"
    note = "(ratio; baseline: a client's apply of the same files)"
    times = f"{ours * 1000:.1f} ms", f"{base * 1000:.1f} ms"
    table(title, [(label, *times, ours / base, note)], last="note")
    print(f"log events of the workspace: {before} before the compaction, {after} after")


if __name__ == "__main__":
    asyncio.run(main())
