"""A restricted workspace: every mutation and command waits for someone's decision, and every
step is in the log."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from contracts.errors import ErrorCode, QuillError
from tests.conftest import StartReader
from tests.helpers import (
    agent_and_human,
    approvals_pending,
    quill_of,
    start_reader,
    start_writer,
)


async def test_mutations_wait_for_approval(services: StartReader, nats_url: str) -> None:
    await services("r1")
    async with AsyncExitStack() as stack:
        ws, desk = await agent_and_human(
            stack, nats_url, "acme/careful", session="s-agent", human_session="s-alice"
        )
        agent = quill_of(ws)
        await ws.create(trust="restricted")
        assert (await ws.info()).trust == "restricted"

        # Not waiting: APPROVAL_REQUIRED at once, with the id to approve.
        with pytest.raises(QuillError) as info:
            await ws.write("plan.md", "the plan\n")
        assert info.value.code == ErrorCode.APPROVAL_REQUIRED
        approval_id = info.value.details["approval_id"]
        await approvals_pending(desk, 1)
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
        [_, second] = await approvals_pending(desk, 2)
        done = await desk.approve(second)
        assert done.approved
        written = await asyncio.wait_for(waiting, 30)
        assert written.path == "notes.md" and written.created

        # Denied: DENIED, with who and why.
        refused = asyncio.create_task(ws.delete("notes.md"))
        [_, third] = await approvals_pending(desk, 2)
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


async def test_commands_on_a_restricted_workspace(
    local_exec: AsyncExitStack, nats_url: str
) -> None:
    ws, desk = await agent_and_human(local_exec, nats_url, "acme/shell", session=None)
    agent = quill_of(ws)
    await ws.create()
    await desk.set_trust("restricted")
    with pytest.raises(QuillError) as info:
        await ws.exec("echo hi")
    assert info.value.code == ErrorCode.DENIED
    assert info.value.message.startswith("Commands are not offered on restricted workspace")

    await desk.set_trust("restricted", commands=True)
    agent.wait_ms = 30_000
    running = asyncio.create_task(ws.exec("echo approved > out.txt; echo ran"))
    [approval_id] = await approvals_pending(desk, 1)
    [waiting] = (await desk.approvals()).pending
    assert waiting.op == "exec.run" and waiting.summary.endswith("echo ran")
    assert waiting.preview is None  # what a command changes is known once it has run
    await desk.approve(approval_id)
    result = await asyncio.wait_for(running, 60)
    assert result.stdout == "ran\n" and result.changes.committed
    record = json.loads(
        (await agent.nc.jetstream().get_last_msg("WS_AUDIT", "ws.audit.acme.shell")).data
    )
    assert (record["op"], record["outcome"]) == ("run", "ok")


async def test_an_approval_shows_the_change_it_would_make(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The approver sees a diff of each parked mutation, decided against the state it was
    asked at: contents as they would be committed (a registered secret redacted, in the
    listing and in the log), a file it cannot show named, a refusal said as such."""
    secret = "sk-live-approval-0123456789"
    registry = tmp_path / "secrets.toml"
    registry.write_text(f'[secrets]\napi_key = "{secret}"\n')
    monkeypatch.setenv("QUILL_SECRETS", str(registry))
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "writer")
        await start_reader(stack, nats_url, tmp_path / "reader", instance="r1")
        ws, desk = await agent_and_human(stack, nats_url, "acme/review", session=None)
        await desk.create()
        await desk.write("app.py", "a = 1\nb = 2\nc = 3\n")
        await desk.write("old.txt", "gone soon\n")
        await desk.write("logo.bin", b"\x89PNG\x00\x01")
        await desk.set_trust("restricted")

        asked: list[str] = []
        for change in (
            ws.edit("app.py", "b = 2", f"b = '{secret}'"),
            ws.delete("old.txt"),
            ws.write("logo.bin", b"\x89PNG\x00\x02"),
            ws.edit("app.py", "no such line", "x"),
        ):
            with pytest.raises(QuillError) as info:
                await change
            assert info.value.code == ErrorCode.APPROVAL_REQUIRED
            asked.append(info.value.details["approval_id"])
        await approvals_pending(desk, 4)
        shown = {a.approval_id: a.preview for a in (await desk.approvals()).pending}
        edit, delete, binary, refused = (shown[i] or "" for i in asked)

        assert edit.splitlines() == [
            "--- a/app.py",
            "+++ b/app.py",
            "@@ -1,3 +1,3 @@",
            " a = 1",
            "-b = 2",
            "+b = '[REDACTED:api_key]'",
            " c = 3",
        ]
        assert delete == "--- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-gone soon\n"
        assert binary == "modified logo.bin (6 bytes -> 6 bytes, binary)\n"
        assert refused.startswith("As it stands it would be refused: NO_MATCH: oldString not found")

        # The previews are in the log (each approval_requested event), redacted like contents.
        js = ws.client.nc.jetstream()
        stream = await js.stream_info("WS_EVENTS")
        logged = b"".join(
            [
                (await js.get_msg("WS_EVENTS", seq)).data or b""
                for seq in range(stream.state.first_seq, (stream.state.last_seq or 0) + 1)
            ]
        )
        assert b"b = '[REDACTED:api_key]'" in logged and secret.encode() not in logged
