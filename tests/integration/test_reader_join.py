"""A reader replica that starts late (or comes back after a while) answers for the others once
it is near the log's end, before it has caught up: nothing it says is older than the log when
asked (a workspace it has not reached yet is applied first)."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path

from contracts.subjects import Subjects
from infra import bus
from quill.client import Quill
from tests.helpers import start_reader, start_writer


async def test_a_reader_coming_back_answers_nothing_older_than_the_log(
    nats_url: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "writer")
        quill = await Quill.connect(nats_url, timeout=5)
        stack.push_async_callback(quill.close)
        ws = quill.workspace("acme/late")
        await ws.create()
        async with AsyncExitStack() as first_life:
            await start_reader(first_life, nats_url, tmp_path / "reader", instance="r")
            for i in range(50):
                await ws.write("f.txt", f"v{i}")
            assert await ws.read_text("f.txt") == "v49"
        for i in range(50, 400):  # while the only reader is away
            await ws.write("f.txt", f"v{i}")

        # It comes back with its old projection: its first answers must not be from it.
        reader = await start_reader(
            stack, nats_url, tmp_path / "reader", instance="r", caught_up=False
        )
        fresh = await Quill.connect(nats_url, timeout=5)  # has seen no version: no min_version
        stack.push_async_callback(fresh.close)
        assert await fresh.workspace("acme/late").read_text("f.txt") == "v399"
        assert await fresh.workspace("acme/late").read_text("f.txt", version=51) == "v49"
        await asyncio.wait_for(reader.follower.ready.wait(), 30)
        (pong,) = await bus.ping_all(quill.nc, Subjects(), "reader")
        assert pong["caught_up"] is True and pong["serving"] is True
