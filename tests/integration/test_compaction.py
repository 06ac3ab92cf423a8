"""``max_versions`` (RFC 0059): snapshot-and-trim keeps the last N revisions of every path,
purges the log before the snapshot, and every replica (old or new), the executor and a
writer that lost its projection agree on what is kept and refuse what is not, alike."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from contracts import codec
from contracts.errors import ErrorCode, QuillError
from contracts.events import HistoryCompacted, WorkspaceUpdated
from contracts.limits import LimitsPatch
from contracts.subjects import Subjects
from infra import log as eventlog
from infra.compaction import slack
from infra.store import Store
from quill.client import Quill, Workspace
from services.executor.app import ExecutorConfig
from tests.helpers import eventually, start_executor, start_reader, start_writer

KEEP = 2
WRITES = KEEP + slack(KEEP) + 1
"""Revisions of one path that make compaction due."""


async def compacted(ws: Workspace, writes: int) -> HistoryCompacted:
    """Write ``hot.md`` ``writes`` times; the compaction event that follows."""
    subjects, nc = Subjects(), ws.client.nc
    subject, js = subjects.evt(ws.tenant, ws.name), nc.jetstream()
    updates = await nc.subscribe(subjects.updated(ws.tenant, ws.name))
    async with asyncio.timeout(20):
        for i in range(1, writes + 1):
            await ws.write("hot.md", f"hot {i}\n")
        async for msg in updates.messages:
            if codec.decode(msg.data, WorkspaceUpdated).op == "compact":
                break
    await updates.unsubscribe()
    first = await eventlog.read(js, subject, 0, await eventlog.last_seq(js, subject))
    event = first[0].event
    assert isinstance(event, HistoryCompacted), "the log starts at the compaction"
    # seen (its notification): reads wait for a replica that has applied it, rather than
    # for the writer's applier to linger (it no longer does when someone waits on it)
    ws.last_version = max(ws.last_version, event.version)
    return event


async def rows(store: Store, tenant: str, name: str) -> dict[str, list[Any]]:
    """What a projection holds for a workspace, without its local ids."""
    ws = store.workspace_id(tenant, name)
    out = {}
    for table, order in (("revisions", "path, version"), ("events", "version")):
        found = await store.reads.execute_fetchall(
            f"SELECT * FROM {table} WHERE ws=? ORDER BY {order}", (ws,)
        )
        out[table] = [tuple(r)[1:] for r in found]
    return out


async def trimmed(call: Any) -> QuillError:
    with pytest.raises(QuillError) as info:
        await call
    assert info.value.code == ErrorCode.VERSION_TRIMMED
    return info.value


async def test_history_beyond_max_versions_is_compacted_and_replay_starts_there(
    nats_url: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "w1")
        old = await start_reader(stack, nats_url, tmp_path / "r1", instance="r1")
        quill = await Quill.connect(nats_url, actor="tester", timeout=5)
        stack.push_async_callback(quill.close)
        ws = quill.workspace("acme/memory")
        await ws.create(limits=LimitsPatch(max_versions=KEEP))
        await ws.write("cold.md", "cold\n")  # v2: one revision, kept below the floor
        event = await compacted(ws, WRITES)

        assert event.version == 2 + WRITES + 1 and event.max_versions == KEEP
        assert event.revisions_dropped == WRITES - KEEP
        history = await ws.history("hot.md")
        assert [r.version for r in history.revisions] == [2 + WRITES, 1 + WRITES]
        assert await ws.read_text("hot.md") == f"hot {WRITES}\n"
        assert await ws.read_text("hot.md", version=1 + WRITES) == f"hot {WRITES - 1}\n"
        error = await trimmed(ws.read_text("hot.md", version=3))
        assert error.details["floor"] == event.floor == 1 + WRITES
        assert await ws.read_text("cold.md", version=2) == "cold\n"  # its revision was kept
        await trimmed(ws.list(version=2))  # the whole tree at v2 is not known any more
        await trimmed(ws.diff(3))
        assert [e.name for e in (await ws.list(version=event.floor)).entries] == [
            "cold.md",
            "hot.md",
        ]
        with pytest.raises(QuillError) as info:
            await ws.restore(3, "hot.md")
        assert info.value.code == ErrorCode.VERSION_TRIMMED

        # A replica started after the compaction holds exactly what the old one kept.
        new = await start_reader(stack, nats_url, tmp_path / "r2", instance="r2")
        await eventually(lambda: new.store.version_of("acme", "memory") >= event.version)
        assert await rows(new.store, "acme", "memory") == await rows(old.store, "acme", "memory")

        # An executor with no checkout materialises the tree from the manifest.
        await start_executor(stack, nats_url, tmp_path / "x", ExecutorConfig(sandbox="local"))
        ran = await ws.exec("cat cold.md hot.md")
        assert ran.stdout == f"cold\nhot {WRITES}\n"
        past = await ws.exec("cat hot.md", version=event.floor)
        assert past.stdout == f"hot {WRITES - 1}\n"
        await trimmed(ws.exec("ls", version=2))

    # A writer that lost its projection starts from the compaction and continues the chain.
    async with AsyncExitStack() as stack:
        writer = await start_writer(stack, nats_url, tmp_path / "w2")
        quill = await Quill.connect(nats_url, actor="tester", timeout=5)
        stack.push_async_callback(quill.close)
        ws = quill.workspace("acme/memory")
        await ws.write("after.md", "after\n")
        assert ws.last_version == event.version + 1
        row = writer.store.workspace("acme", "memory")
        assert row is not None and row.floor == event.floor
        js, subject = quill.nc.jetstream(), Subjects().evt("acme", "memory")
        log = await eventlog.read(js, subject, 0, await eventlog.last_seq(js, subject))
        assert [c.event.version for c in log] == [event.version, event.version + 1]
        assert log[1].event.prev_hash == log[0].hash  # the chain goes on from the snapshot
        await start_reader(stack, nats_url, tmp_path / "r3", instance="r3")
        history = await ws.history("hot.md")
        assert len(history.revisions) == KEEP


async def test_workspaces_without_max_versions_keep_everything(
    nats_url: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "w")
        await start_reader(stack, nats_url, tmp_path / "r", instance="r")
        quill = await Quill.connect(nats_url, actor="tester", timeout=5)
        stack.push_async_callback(quill.close)
        ws = quill.workspace("acme/all")
        await ws.create()
        for i in range(1, WRITES + 2):
            await ws.write("hot.md", f"hot {i}\n")
        history = await ws.history("hot.md", limit=100)
        assert len(history.revisions) == WRITES + 1
        assert await ws.read_text("hot.md", version=2) == "hot 1\n"
