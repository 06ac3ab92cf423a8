"""A restricted workspace: every mutation and command waits for someone's decision, and every
step is in the log."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from services.executor.app import ExecutorConfig
from tests.conftest import StartReader
from tests.helpers import start_executor


async def pending(ws: object, n: int) -> list[str]:
    """Wait until ``n`` approvals are pending; their ids."""
    async with asyncio.timeout(10):
        while True:
            found = (await ws.approvals()).pending  # type: ignore[attr-defined]
            if len(found) == n:
                return [a.approval_id for a in found]
            await asyncio.sleep(0.02)


async def test_mutations_wait_for_approval(services: StartReader, nats_url: str) -> None:
    await services("r1")
    agent = await Quill.connect(nats_url, actor="agent-7", session="s-agent", retries=0)
    human = await Quill.connect(nats_url, actor="alice", session="s-alice")
    try:
        ws, desk = agent.workspace("acme/careful"), human.workspace("acme/careful")
        await ws.create(trust="restricted")
        assert (await ws.info()).trust == "restricted"

        # Not waiting: APPROVAL_REQUIRED at once, with the id to approve.
        with pytest.raises(QuillError) as info:
            await ws.write("plan.md", "the plan\n")
        assert info.value.code == ErrorCode.APPROVAL_REQUIRED
        approval_id = info.value.details["approval_id"]
        await pending(desk, 1)
        [listed] = (await desk.approvals()).pending
        assert (listed.approval_id, listed.op, listed.summary) == (
            approval_id,
            "cmd.write",
            "write plan.md",
        )
        assert listed.requested_by == "agent-7"

        # Waiting: the real result once approved.
        agent.wait_ms = 30_000
        waiting = asyncio.create_task(ws.write("notes.md", "notes\n"))
        [_, second] = await pending(desk, 2)
        done = await desk.approve(second)
        assert done.approved
        written = await asyncio.wait_for(waiting, 30)
        assert written.path == "notes.md" and written.created

        # Denied: DENIED, with who and why.
        refused = asyncio.create_task(ws.delete("notes.md"))
        [_, third] = await pending(desk, 2)
        await desk.deny(third, reason="keep it")
        with pytest.raises(QuillError) as info:
            await asyncio.wait_for(refused, 30)
        assert info.value.code == ErrorCode.DENIED
        assert info.value.message == "Denied by alice: keep it"
        with pytest.raises(QuillError) as info:
            await desk.approve(third)  # decided already
        assert info.value.code == ErrorCode.CONFLICT

        await desk.deny(approval_id)
        assert (await desk.approvals()).pending == []
        types = [e.type for e in (await desk.events()).events]
        assert types.count("approval_requested") == 3 and types.count("approval_decided") == 3
        assert await desk.read_text("notes.md") == "notes\n"  # the denied delete did nothing

        await desk.set_trust("full")  # an operator's decision, also an event
        agent.wait_ms = 0
        await ws.write("free.md", "no approval needed\n")
    finally:
        await agent.close()
        await human.close()


async def test_commands_on_a_restricted_workspace(
    services: StartReader, nats_url: str, tmp_path: Path
) -> None:
    await services("r1")
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "x", ExecutorConfig(sandbox="local"))
        agent = await Quill.connect(nats_url, actor="agent-7", retries=0)
        human = await Quill.connect(nats_url, actor="alice")
        stack.push_async_callback(agent.close)
        stack.push_async_callback(human.close)
        ws, desk = agent.workspace("acme/shell"), human.workspace("acme/shell")
        await ws.create()
        await desk.set_trust("restricted")
        with pytest.raises(QuillError) as info:
            await ws.exec("echo hi")
        assert info.value.code == ErrorCode.DENIED
        assert info.value.message.startswith("Commands are not offered on restricted workspace")

        await desk.set_trust("restricted", commands=True)
        agent.wait_ms = 30_000
        running = asyncio.create_task(ws.exec("echo approved > out.txt; echo ran"))
        [approval_id] = await pending(desk, 1)
        [waiting] = (await desk.approvals()).pending
        assert waiting.op == "exec.run" and waiting.summary.endswith("echo ran")
        await desk.approve(approval_id)
        result = await asyncio.wait_for(running, 60)
        assert result.stdout == "ran\n" and result.changes.committed
        record = json.loads(
            (await agent.nc.jetstream().get_last_msg("WS_AUDIT", "ws.audit.acme.shell")).data
        )
        assert (record["op"], record["outcome"]) == ("run", "ok")
