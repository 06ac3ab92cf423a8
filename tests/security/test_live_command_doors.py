"""Issue 32, item 8: a live command's handle through the gateway's doors is its tenant's alone.

Tenant a (token ``TOKEN_A``) starts a command over MCP that waits for input, and so gets its
``command_id``. Tenant b (its own token), given that id, tries every MCP tool that takes one
(``read_command_output`` with a cursor, ``write_stdin``, ``send_signal``) and every REST route
(``GET …/output``, ``POST …/input``, ``POST …/signal``): each answer is the one a made-up id
gets (MCP: the same error text, id aside; REST: a bare ``404 {"error": "not_found"}``), b's
``list_commands`` and ``GET …/commands`` do not name it, and nothing reaches a's command: a
then types its own line and reads back exactly that, and the command ends on its own exit
code (not a signal's)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest_asyncio

from services.executor.app import ExecutorConfig
from services.gateway.rest.commands import COMMANDS
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway
from tests.gateway.support import error, mcp_client, ok
from tests.helpers import start_executor

TOKEN_A, TOKEN_B = "token-of-a-0123456789", "token-of-b-0123456789"
MADE_UP = "c0123456789abMadeUpHandle0"
GO_ON = re.compile(r'command_id="(?P<id>c[0-9a-f]{12}\w+)" and cursor="(?P<cursor>[0-9.]*)"')


@pytest_asyncio.fixture
async def two_tenants(start: StartGateway, nats_url: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    gateway = await start(tokens={TOKEN_A: "acme/w", TOKEN_B: "rival/w"})
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        yield gateway


def blanked(text: str, command_id: str) -> str:
    return text.replace(command_id, "ID")


async def test_another_tenants_handle_is_unknown_at_every_door(two_tenants: Gateway) -> None:
    url = two_tenants.url
    line = 'read name; echo "got $name"; exit 5'
    async with mcp_client(url, token=TOKEN_A) as a:
        first = await ok(a, "execute_command", command=line, yield_ms=500)
        found = GO_ON.search(first)
        assert found, first
        handle, cursor = found["id"], found["cursor"]
        async with mcp_client(url, token=TOKEN_B) as b:
            for tool, extra in (
                ("read_command_output", {"cursor": "", "wait_ms": 0}),
                ("write_stdin", {"text": "rival\n", "eof": True}),
                ("send_signal", {"signal": "KILL"}),
            ):
                theirs = await error(b, tool, command_id=handle, **extra)
                made_up = await error(b, tool, command_id=MADE_UP, **extra)
                assert blanked(theirs, handle) == blanked(made_up, MADE_UP), tool
                assert theirs.startswith(f"Error: No live command {handle} in this workspace")
            assert handle not in await ok(b, "list_commands")
        rest_b = httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN_B}"}, timeout=30
        )
        async with rest_b:
            for method, tail, body in (
                ("GET", "output", None),
                ("POST", "input", {"data": "rival\n", "eof": True}),
                ("POST", "signal", {"signal": "KILL"}),
            ):
                for command_id in (handle, MADE_UP):
                    reply = await rest_b.request(
                        method, f"{COMMANDS}/{command_id}/{tail}", json=body
                    )
                    assert (reply.status_code, reply.json()) == (404, {"error": "not_found"})
            assert (await rest_b.get(COMMANDS)).json() == {"commands": []}
        assert handle in await ok(a, "list_commands")  # still a's, still running
        await ok(a, "write_stdin", command_id=handle, text="Ada\n")
        seen = ""
        for _ in range(20):
            text = await ok(
                a, "read_command_output", command_id=handle, cursor=cursor, wait_ms=5000
            )
            seen += text
            if "has ended" in text:
                break
            found = GO_ON.search(text)
            assert found, text
            cursor = found["cursor"]
        assert "got Ada" in seen and "rival" not in seen
        assert f"Command {handle} has ended. Exit code: 5" in seen  # not killed by b
