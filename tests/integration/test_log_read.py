"""Reading a workspace's log (``infra.log.read``) against a real server: batched
direct gets, no consumer left behind, and the stream leader's consumer when a batch falls
short."""

from __future__ import annotations

import asyncio
import logging

import pytest
from nats.aio.client import Client as NATS

from contracts.subjects import STREAM_EVENTS, Subjects
from infra import log as eventlog
from quill.client import Quill
from tests.conftest import StartReader


async def test_reads_leave_no_consumer_and_never_reach_the_servers_limit(
    services: StartReader, quill: Quill, nc: NATS
) -> None:
    """Each read used to create an ordered consumer that outlived it on the server; 1,000 of
    them within seconds (a busy executor's syncs, a writer loading cold workspaces) and the
    server refused the next: ``maximum consumers limit reached``."""
    ws = quill.workspace("acme/reads")
    await ws.create()
    for i in range(3):
        await ws.write(f"f{i}.txt", f"{i}\n")
    js = nc.jetstream()
    subject = Subjects().evt("acme", "reads")
    last = await eventlog.last_seq(js, subject)
    whole = await eventlog.read(js, subject, 0, last)
    assert [c.event.version for c in whole] == [1, 2, 3, 4]
    for _ in range(1500):
        assert await eventlog.read(js, subject, whole[1].seq, last) == whole[2:]
    assert (await js.stream_info(STREAM_EVENTS)).state.consumer_count == 0


async def test_a_read_longer_than_a_batch_comes_whole_and_in_order(
    services: StartReader, quill: Quill, nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = quill.workspace("acme/long")
    await ws.create()
    other = quill.workspace("acme/other")
    await other.create()
    for i in range(20):
        await ws.write("f.txt", f"{i}\n")
        await other.write("g.txt", f"{i}\n")  # interleaved: the reads skip them
    js = nc.jetstream()
    subject = Subjects().evt("acme", "long")
    last = await eventlog.last_seq(js, subject)
    monkeypatch.setattr(eventlog, "DIRECT_BATCH", 3)
    events = await eventlog.read(js, subject, 0, last)
    assert [c.event.version for c in events] == list(range(1, 22))
    assert all(c.event.workspace == "long" for c in events)

    # a replica behind the leader answers the direct gets: the rest comes from the leader
    real = eventlog._read_direct

    async def behind(*args: object) -> list[eventlog.Committed]:
        # the replica has the first five events; from the sixth on it has nothing
        found = await real(*args)  # type: ignore[arg-type]
        return [c for c in found if c.event.version <= 5]

    monkeypatch.setattr(eventlog, "_read_direct", behind)
    assert await eventlog.read(js, subject, 0, last) == events

    # read a chunk at a time (a long log in bounded memory), the leader's part too
    parts = [chunk async for chunk in eventlog.chunks(js, subject, 0, last, size=4)]
    assert [len(p) for p in parts] == [4, 1, 4, 4, 4, 4]
    assert [c for part in parts for c in part] == events


async def test_a_follower_far_behind_reads_by_direct_gets_and_misses_nothing(
    services: StartReader,
    quill: Quill,
    nc: NATS,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A replica catching up on a long log used to have it all pushed at once: a million
    events queued in memory (2.6 GiB), and a bounded queue lost events to nats-py's pending
    limit (a gap the replica then stopped at). Far behind, it now reads by direct gets a batch
    at a time; pushed events piling up past the bound send it back to direct gets."""
    ws = quill.workspace("acme/follow")
    await ws.create()
    for i in range(300):
        await ws.write("f.txt", f"{i}\n")
    js, subjects = nc.jetstream(), Subjects()
    gets = 0
    real_messages = eventlog.direct.messages

    async def counted(*args: object, **kwargs: object) -> object:
        nonlocal gets
        gets += 1
        return await real_messages(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(eventlog.direct, "messages", counted)
    seen: list[int] = []
    gate = asyncio.Event()
    gate.set()
    done = asyncio.Event()
    target = 301

    async def on_batch(batch: list[eventlog.Committed], pending: int) -> None:
        await gate.wait()
        seen.extend(c.event.version for c in batch if c.event.workspace == "follow")
        if seen and seen[-1] >= target:
            done.set()

    caplog.set_level(logging.INFO, logger="quill.log")
    stop = await eventlog.follow(js, subjects.all_evt, 0, on_batch, max_batch=8)
    try:
        async with asyncio.timeout(30):
            await done.wait()
        assert seen == list(range(1, 302))
        assert gets >= (300 - 8 * 8) // 8  # far behind: a batch a direct get
        gets = 0
        # the follower held while 200 more events are pushed: past 8 batches it goes back
        gate.clear()
        for i in range(200):
            await ws.write("f.txt", f"more {i}\n")
        gate.set()
        done.clear()
        target = 501
        async with asyncio.timeout(30):
            await done.wait()
        assert seen == list(range(1, 502))
        assert "catching up by direct gets" in caplog.text
        assert gets > 0
    finally:
        await stop()
