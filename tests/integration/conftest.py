"""In-process services on the module's real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest_asyncio

from quill.client import Quill
from services.reader.app import Reader
from tests.helpers import start_reader, start_writer

StartReader = Callable[[str], Awaitable[Reader]]


@pytest_asyncio.fixture
async def services(nats_url: str, tmp_path: Path) -> AsyncIterator[StartReader]:
    """A writer, and a function that starts reader replicas (by name)."""
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "writer")

        async def reader(name: str) -> Reader:
            return await start_reader(stack, nats_url, tmp_path / name, instance=name)

        yield reader


@pytest_asyncio.fixture
async def quill(nats_url: str) -> AsyncIterator[Quill]:
    client = await Quill.connect(nats_url, actor="tester", timeout=5)
    yield client
    await client.close()
