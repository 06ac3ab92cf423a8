"""Who an MCP call is from (issue 30): without tokens, the client's ``clientInfo.name`` and its
session, not ``local``, for a handshake-era client (the name in ``initialize`` only) and a
2026-07-28 one (the name in every request); with a token, the token's actor. And a command's
id, which a model copies: no ``.`` in it, and an old id with one still reads. The official MCP
client over real HTTP, a real gateway, writer, reader and executor."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
from mcp.types import Implementation
from nats.aio.client import Client as NATS

from contracts import codec
from contracts import requests as rq
from contracts.subjects import HEADER_REQUEST_ID, Subjects
from quill.client import Quill
from services.executor.app import ExecutorConfig
from services.gateway.access import Principal, Tokens
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway
from tests.gateway.support import call, mcp_client, ok
from tests.helpers import start_executor


@pytest_asyncio.fixture
async def executor(start: StartGateway, nats_url: str, tmp_path: Path) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        yield


def named(name: str) -> Implementation:
    return Implementation(name=name, version="1.0")


async def last_event(sdk: Quill) -> tuple[str | None, str | None]:
    events = (await sdk.workspace("default/default").events(after=0, limit=1000)).events
    return events[-1].actor, events[-1].session


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_client_without_a_token_acts_as_its_name(
    gateway: Gateway, sdk: Quill, mode: str
) -> None:
    async with mcp_client(gateway.url, client_info=named("claude-code"), mode=mode) as mcp:
        await ok(mcp, "write_file", path="a.txt", content="a\n")
        actor, session = await last_event(sdk)
        await ok(mcp, "write_file", path="b.txt", content="b\n")
        again = await last_event(sdk)
    assert actor == "claude-code"
    if mode == "legacy":  # a handshake-era client: a session of its own, the same each call
        assert session is not None and session.startswith("mcp-") and again == (actor, session)
    async with mcp_client(gateway.url, client_info=named("other-agent"), mode=mode) as mcp:
        await ok(mcp, "write_file", path="c.txt", content="c\n")
        other = await last_event(sdk)
    assert other[0] == "other-agent"
    if mode == "legacy":
        assert other[1] != session  # another session


async def test_a_token_keeps_its_actor(start: StartGateway) -> None:
    gateway = await start(Tokens({"token-acme-0001": Principal("acme", "one", actor="ann")}))
    async with mcp_client(
        gateway.url, token="token-acme-0001", client_info=named("forged"), mode="legacy"
    ) as mcp:
        await ok(mcp, "write_file", path="a.txt", content="a\n")
    events = (await gateway.quill.workspace("acme/one").events(after=0, limit=100)).events
    assert events[-1].actor == "ann"  # the token's, not what the client calls itself
    assert events[-1].session is not None and events[-1].session.startswith("mcp-")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_command_id_is_one_token_and_old_ids_still_read(
    gateway: Gateway, executor: None, nats_url: str, mode: str
) -> None:
    async with mcp_client(gateway.url, mode=mode) as mcp:
        result = await call(mcp, "execute_command", command="echo hello")
        data = result.structured_content
        assert isinstance(data, dict) and not result.is_error
        command_id = data["command_id"]
        assert "." not in command_id and command_id.strip("_:-") == command_id
        page = await ok(mcp, "read_command_output", command_id=command_id)
        assert "hello" in page
    # A command named the old way (``<http id>.<unique>``, as gateways made them) still reads,
    # by its id as made and as the console spells it.
    nc = NATS()
    await nc.connect(nats_url)
    try:
        subject = Subjects().exec("default", "default", "run")
        body = codec.encode(rq.RunCommand(command="echo legacy"))
        headers = {HEADER_REQUEST_ID: "3f2a9c.OldStyleId0123"}
        reply = await nc.request(subject, body, timeout=60, headers=headers)
        assert b'"ok":true' in reply.data.replace(b" ", b"")
    finally:
        await nc.close()
    async with mcp_client(gateway.url, mode=mode) as mcp:
        for spelled in ("3f2a9c.OldStyleId0123", "3f2a9c_OldStyleId0123"):
            assert "legacy" in await ok(mcp, "read_command_output", command_id=spelled)
