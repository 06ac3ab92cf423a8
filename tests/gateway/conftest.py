"""The gateway over real HTTP: a nats-server per test, an in-process writer and reader, and
``start_gateway`` served by uvicorn on a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from quill.client import Quill
from quill_cli.natsserver import NatsServer
from services.gateway.access import Principal, Tokens
from services.gateway.server import Gateway, GatewayConfig, start_gateway
from tests.helpers import start_writer_and_reader

StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """One server per test (it starts in milliseconds): no workspace outlives its test."""
    server = NatsServer(tmp_path / "nats").start()
    yield server
    server.stop()


@pytest_asyncio.fixture
async def start(nats_url: str, tmp_path: Path) -> AsyncIterator[StartGateway]:
    """A writer and a reader, and a function that starts a gateway (with ``tokens``:
    ``{token: "tenant/workspace"}``, or ``Tokens`` as loaded from a file; ``options``: more
    ``GatewayConfig`` fields)."""
    async with AsyncExitStack() as stack:
        await start_writer_and_reader(stack, nats_url, tmp_path)

        async def gateway(
            tokens: dict[str, str] | Tokens | None = None,
            host: str = "127.0.0.1",
            **options: Any,
        ) -> Gateway:
            table = tokens
            if isinstance(tokens, dict):
                table = Tokens({t: Principal(*name.split("/")) for t, name in tokens.items()})
            config = GatewayConfig(nats_url, host=host, port=0, tokens=table, **options)
            running = await start_gateway(config)
            stack.push_async_callback(running.stop)
            return running

        yield gateway


@pytest_asyncio.fixture
async def gateway(start: StartGateway, request: pytest.FixtureRequest) -> Gateway:
    """A gateway without tokens (everyone is default/default). A module gives it more
    ``GatewayConfig`` fields by parametrizing it: ``pytestmark = pytest.mark.parametrize(
    "gateway", [{"header_timeout": 120.0}], indirect=True, ids=["..."])``."""
    return await start(**getattr(request, "param", {}))


@pytest_asyncio.fixture
async def http(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        yield client


@pytest.fixture
def sdk(gateway: Gateway) -> Quill:
    """The gateway's own SDK client, to set up and check what the gateway did: its workspace
    handles are the gateway's, so each side reads the other's writes."""
    return gateway.quill
