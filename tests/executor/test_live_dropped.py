"""Issue 32, item 7: a live command's cursor older than what is kept gets a clear note, not an
empty answer that never moves: ``exec.poll``'s ``dropped`` (the bytes skipped, the cursor past
them), for output past the executor's ``keep_bytes`` and for the oldest output the stream's
limits dropped (here: purged from ``WS_OUTPUT`` by hand, as its ``max_bytes`` would)."""

from __future__ import annotations

import nats

from contracts.subjects import STREAM_OUTPUT, Subjects
from quill.client import Quill
from services.executor.output import CHUNK, OutputConfig
from tests.executor.conftest import StartExecutor


async def test_output_past_keep_bytes_is_said_dropped(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    await stack(output=OutputConfig(keep_bytes=CHUNK))
    ws = quill.workspace(name)
    await ws.create()
    live = await ws.exec("head -c 200000 /dev/zero | tr '\\0' x", yield_ms=0)
    command = ws.command(live.command_id)
    seen, dropped = 0, 0
    for _ in range(50):
        status = await command.poll(wait_ms=5000, max_bytes=CHUNK)
        seen += len(status.stdout)
        dropped += status.dropped
        if not status.running and not status.more:
            break
    assert not status.running
    assert (seen, dropped) == (CHUNK, 200_000 - CHUNK)
    again = await ws.command(live.command_id, status.cursor).poll()
    assert again.dropped == 0 and again.stdout == ""  # said once


async def test_a_cursor_older_than_the_kept_output_skips_to_it(
    stack: StartExecutor, quill: Quill, name: str, nats_url: str
) -> None:
    await stack()
    ws = quill.workspace(name)
    await ws.create()
    ran = await ws.exec("head -c 150000 /dev/zero | tr '\\0' y", yield_ms=0)
    command = ws.command(ran.command_id)
    ended = await command.poll(wait_ms=30_000, max_bytes=1)
    while ended.running:
        ended = await ws.command(ran.command_id, ended.cursor).poll(wait_ms=30_000, max_bytes=1)
    tenant, workspace = name.split("/")
    nc = await nats.connect(nats_url)
    try:
        subject = Subjects().cmdout(tenant, workspace, ran.command_id, "stdout.0")
        await nc.jetstream().purge_stream(STREAM_OUTPUT, subject=subject)
    finally:
        await nc.close()
    status = await ws.command(ran.command_id).poll(max_bytes=1024 * 1024)
    assert status.dropped == CHUNK
    assert len(status.stdout) == 150_000 - CHUNK
