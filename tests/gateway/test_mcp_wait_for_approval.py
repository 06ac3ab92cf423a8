"""An MCP client that cannot ask its user (LangChain, the OpenAI Agents SDK, curl) gets the
outcome of a parked call with ``wait_for_approval``: it never sends the call again, and Quill
makes the call once someone approves it. Over real HTTP with the official MCP client."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from quill.client import Quill
from services.executor.app import ExecutorConfig
from services.gateway.server import Gateway
from tests.gateway.support import call, error, mcp_client, ok, text
from tests.helpers import start_executor


async def restricted(sdk: Quill) -> Any:
    ws = sdk.workspace("default/default")
    await ws.set_trust("restricted", commands=True)
    return ws


async def parked(mcp: Any, tool: str, **arguments: Any) -> tuple[str, str]:
    """Call ``tool``; its approval id and the text the model reads."""
    result = await call(mcp, tool, **arguments)
    assert result.is_error and result.structured_content is not None, text(result)
    assert result.structured_content["code"] == "APPROVAL_REQUIRED"
    return result.structured_content["details"]["approval_id"], text(result)


async def test_wait_for_approval_gives_the_calls_result(
    gateway: Gateway, sdk: Quill, nats_url: str, tmp_path: Path
) -> None:
    ws = await restricted(sdk)
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        async with mcp_client(gateway.url) as mcp:  # no elicitation handler
            approval_id, said = await parked(mcp, "write_file", path="plan.md", content="plan\n")
            assert f'call wait_for_approval with approval_id "{approval_id}"' in said
            assert "Do not send this call again" in said
            # a model that sends it again all the same finds the same approval
            again, _ = await parked(mcp, "write_file", path="plan.md", content="plan\n")
            assert again == approval_id
            pending = await ok(mcp, "wait_for_approval", approval_id=approval_id, timeout_ms=0)
            assert pending.startswith(f"Approval {approval_id} is still pending")
            waiting = asyncio.create_task(
                ok(mcp, "wait_for_approval", approval_id=approval_id, timeout_ms=30_000)
            )
            await ws.approve(approval_id)  # quill approve, by a person
            written = await asyncio.wait_for(waiting, 30)
            assert written.startswith("Approved by ") and '"path":"plan.md"' in written
            assert await ws.read_text("plan.md") == "plan\n"

            command_id, _ = await parked(mcp, "execute_command", command="echo ran; exit 2")
            await ws.approve(command_id)
            ran = await ok(mcp, "wait_for_approval", approval_id=command_id, timeout_ms=60_000)
            assert "Exit code: 2" in ran and "ran" in ran

            denied_id, _ = await parked(mcp, "create_directory", path="docs")
            await ws.deny(denied_id, reason="no docs yet")
            refused = await call(mcp, "wait_for_approval", approval_id=denied_id)
            assert refused.is_error and refused.structured_content is not None
            assert refused.structured_content["code"] == "DENIED"
            assert text(refused).endswith("no docs yet")
            missing = await error(mcp, "wait_for_approval", approval_id="no-such-approval")
            assert missing == "Error: No approval no-such-approval on default/default"
    assert (await ws.approvals()).pending == []
