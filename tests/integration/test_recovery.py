"""Restarts and lost databases: the log is the truth."""

from __future__ import annotations

import json
import shutil
from contextlib import AsyncExitStack
from pathlib import Path

from nats.aio.client import Client as NATS

from contracts.subjects import STREAM_EVENTS, Subjects
from quill.client import Quill
from tests.helpers import start_reader, start_writer

S = Subjects()


async def write(nc: NATS, ws: str, body: dict[str, object], request_id: str) -> dict:
    tenant, name = ws.split("/")
    msg = await nc.request(
        S.cmd(tenant, name, "write"),
        json.dumps(body).encode(),
        timeout=10,
        headers={"Ws-Request-Id": request_id},
    )
    return json.loads(msg.data)


async def events_on(nc: NATS, ws: str) -> int:
    subject = S.evt(*ws.split("/"))
    info = await nc.jetstream().stream_info(STREAM_EVENTS, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


async def test_retry_after_writer_restart_and_lost_database(
    nats_url: str, tmp_path: Path, nc: NATS
) -> None:
    data = tmp_path / "writer"
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, data)
        await Quill(nc).workspace("acme/restart").create()
        first = await write(nc, "acme/restart", {"path": "a.txt", "content": "1"}, "req-1")
    # a new writer process on the same data directory remembers the request
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, data)
        assert await write(nc, "acme/restart", {"path": "a.txt", "content": "1"}, "req-1") == first
        second = await write(nc, "acme/restart", {"path": "b.txt", "content": "2"}, "req-2")
        assert second["version"] == 3
    # and one whose database is gone rebuilds the workspace from the log
    shutil.rmtree(data)
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, data)
        assert await write(nc, "acme/restart", {"path": "b.txt", "content": "2"}, "req-2") == second
        third = await write(
            nc, "acme/restart", {"path": "a.txt", "content": "x", "if_match": "v1"}, "req-3"
        )
        assert third["ok"] and third["version"] == 4 and third["result"]["file_version"] == 2
    assert await events_on(nc, "acme/restart") == 4


async def test_a_writer_applies_what_its_projection_missed_before_it_trusts_it(
    nats_url: str, tmp_path: Path, nc: NATS
) -> None:
    """A writer's projection that lacks the log's last events of a workspace it holds (a
    crash between the append and the apply; here, another writer on another data directory
    appended them) is brought up to the log at start: an edit of what only the log holds
    (answered without an append, so no condition on the log would catch a stale state), a
    retry of the missed command and the next write all follow the log."""
    ws = Quill(nc).workspace("acme/missed")
    mine, other = tmp_path / "mine", tmp_path / "other"
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, mine)
        await ws.create()
        await write(nc, "acme/missed", {"path": "a.txt", "content": "1"}, "req-1")
    async with AsyncExitStack() as stack:  # mine never applies these two
        await start_writer(stack, nats_url, other)
        missed = await write(nc, "acme/missed", {"path": "a.txt", "content": "2"}, "req-2")
        await write(nc, "acme/missed", {"path": "b.txt", "content": "3"}, "req-3")
    assert missed["version"] == 3
    async with AsyncExitStack() as stack:
        writer = await start_writer(stack, nats_url, mine)
        assert writer.deps.projection.complete
        await ws.edit("a.txt", "2", "5")  # "2" is a.txt's text in the log alone
        assert ws.last_version == 5
        assert await write(nc, "acme/missed", {"path": "a.txt", "content": "2"}, "req-2") == missed
        after = await write(
            nc, "acme/missed", {"path": "a.txt", "content": "6", "if_match": "v3"}, "req-6"
        )
        assert after["ok"] and after["version"] == 6 and after["result"]["file_version"] == 4
    assert await events_on(nc, "acme/missed") == 6


async def test_reader_resumes_from_its_position(nats_url: str, tmp_path: Path, nc: NATS) -> None:
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "w")
        quill = Quill(nc)
        ws = quill.workspace("acme/resume")
        async with AsyncExitStack() as readers:
            first = await start_reader(readers, nats_url, tmp_path / "r")
            await ws.create()
            await ws.write("a.txt", "1")
            await ws.read("a.txt")
            position = first.follower.position
        await ws.write("b.txt", "2")  # while no reader runs
        second = await start_reader(stack, nats_url, tmp_path / "r")
        assert second.follower.position >= position  # resumed, not rebuilt from zero
        assert (await ws.read("b.txt")).content == "2"
        assert second.store.version_of("acme", "resume") == 3
