"""Approved requests are carried out by Quill, whether their client waited or went away; a
retry never parks twice; the outcome is kept under the approval id (``qry.approval``)."""

from __future__ import annotations

import asyncio
import re
import textwrap
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from tests.conftest import StartReader
from tests.helpers import (
    agent_and_human,
    approvals_pending,
    parked,
    quill_of,
    restricted_for_commands,
    start_reader,
    start_writer,
)


async def test_an_approved_change_is_made_without_its_client(
    services: StartReader, nats_url: str
) -> None:
    await services("r1")
    async with AsyncExitStack() as stack:
        ws, desk = await agent_and_human(stack, nats_url, "acme/away", human_session="s-alice")
        await ws.create(trust="restricted")
        approval_id = await parked(ws.write("plan.md", "the plan\n"))
        # a retry (a new request id, same session, same body) is the same approval
        assert await parked(ws.write("plan.md", "the plan\n")) == approval_id
        assert len((await ws.approvals()).pending) == 1
        # another body is another request
        other = await parked(ws.write("plan.md", "another plan\n"))
        assert other != approval_id
        status = await ws.approval(approval_id)
        assert (status.state, status.done, status.op) == ("pending", False, "cmd.write")
        assert status.expires is not None and status.expires > status.requested

        await desk.approve(approval_id)  # nobody waits for it: Quill makes the change
        done = await ws.wait_approval(approval_id, timeout=30)
        assert (done.state, done.done) == ("approved", True), done
        assert done.outcome is not None and done.outcome.error is None
        assert done.outcome.version is not None and done.outcome.result is not None
        assert done.outcome.result["path"] == "plan.md"
        assert await desk.read_text("plan.md") == "the plan\n"
        history = (await desk.history("plan.md")).revisions
        assert [h.version for h in history] == [done.outcome.version]

        await desk.deny(other, reason="one plan is enough")
        denied = await ws.wait_approval(other, timeout=30)
        assert (denied.state, denied.done, denied.reason) == ("denied", True, "one plan is enough")
        assert denied.outcome is None
        with pytest.raises(QuillError) as info:
            await ws.approval("no-such-approval")
        assert info.value.code == ErrorCode.FILE_NOT_FOUND


async def test_an_approved_change_keeps_its_conditions(
    services: StartReader, nats_url: str
) -> None:
    """Carried out against the workspace as it is then: an ``if_match`` no longer met is
    refused, and the refusal is the outcome."""
    await services("r1")
    async with AsyncExitStack() as stack:
        ws, desk = await agent_and_human(stack, nats_url, "acme/cond", human_session="s-alice")
        await ws.create()
        first = await ws.write("a.txt", "one\n")
        await desk.set_trust("restricted")
        late = await parked(ws.write("a.txt", "two\n", if_match=first.etag))
        sooner = await parked(desk.write("a.txt", "three\n"))
        await desk.approve(sooner)
        assert (await ws.wait_approval(sooner, timeout=30)).outcome.error is None  # type: ignore[union-attr]
        await desk.approve(late)
        status = await ws.wait_approval(late, timeout=30)
        assert status.state == "approved" and status.outcome is not None
        assert status.outcome.error is not None and status.outcome.error.code == "CONFLICT"
        assert await desk.read_text("a.txt") == "three\n"


async def test_an_approved_command_runs_without_its_client(
    local_exec: AsyncExitStack, nats_url: str
) -> None:
    ws, desk = await restricted_for_commands(local_exec, nats_url, "acme/runs")
    command = "echo approved > out.txt; echo ran; exit 3"
    approval_id = await parked(ws.exec(command))
    assert await parked(ws.exec(command)) == approval_id  # a retry: the same approval
    await desk.approve(approval_id)
    done = await ws.wait_approval(approval_id, timeout=60)
    assert (done.state, done.done) == ("approved", True), done
    assert done.outcome is not None and done.outcome.result is not None
    result = done.outcome.result
    assert (result["exit_code"], result["stdout"]) == (3, "ran\n")
    assert result["command_id"] == approval_id
    assert await desk.read_text("out.txt") == "approved\n"
    # sent again once approved: it ran once, and is answered with what it gave
    body = rq.RunCommand(command=command)
    _, again = await ws.client.request(
        "exec", "acme", "runs", "run", body, rp.CommandResult, request_id=approval_id
    )
    assert (again.exit_code, again.stdout, again.command_id) == (3, "ran\n", approval_id)
    assert len((await desk.history("out.txt")).revisions) == 1


async def test_an_approval_expires_at_its_deadline(services: StartReader, nats_url: str) -> None:
    """Past the workspace's ``approval_ttl_s`` a parked request is refused (``DENIED``,
    reason expired), its waiting client is told, and it can no longer be decided."""
    await services("r1")
    async with AsyncExitStack() as stack:
        ws, desk = await agent_and_human(stack, nats_url, "acme/brief", human_session="s-alice")
        agent = quill_of(ws)
        await ws.create(trust="restricted", limits=LimitsPatch(approval_ttl_s=1))
        gone = await parked(ws.write("a.md", "a\n"))
        agent.wait_ms = 60_000  # this one waits: it is told when its approval expires
        with pytest.raises(QuillError) as info:
            await ws.write("b.md", "b\n")
        assert info.value.code == ErrorCode.DENIED
        assert info.value.details["reason"] == "expired"
        status = await ws.wait_approval(gone, timeout=30)
        assert (status.state, status.done, status.reason) == ("expired", True, "expired")
        assert status.outcome is None
        with pytest.raises(QuillError) as info:
            await desk.approve(gone)
        assert info.value.code == ErrorCode.CONFLICT and info.value.details["expired"]
        assert (await ws.approvals()).pending == []
        assert (await desk.list(".")).entries == []
        agent.wait_ms = 0
        again = await parked(ws.write("a.md", "a\n"))  # asked again: a new approval
        assert again != gone


async def test_a_parked_change_survives_a_writer_restart(nats_url: str, tmp_path: Path) -> None:
    """The parked request is kept outside the writer (``WS_APPROVALS``): a writer started
    after it was parked carries it out once approved, and its outcome survives another."""
    async with AsyncExitStack() as stack:
        await start_reader(stack, nats_url, tmp_path / "reader")
        ws, desk = await agent_and_human(stack, nats_url, "acme/restart")
        async with AsyncExitStack() as first:
            await start_writer(first, nats_url, tmp_path / "w1")
            await ws.create(trust="restricted")
            approval_id = await parked(ws.write("kept.md", "kept\n"))
        async with AsyncExitStack() as second:  # the first writer is gone
            await start_writer(second, nats_url, tmp_path / "w2")
            await desk.approve(approval_id)
            done = await ws.wait_approval(approval_id, timeout=30)
            assert done.outcome is not None and done.outcome.error is None, done
        async with AsyncExitStack() as third:
            await start_writer(third, nats_url, tmp_path / "w3")
            again = await ws.approval(approval_id)
            assert again.outcome == done.outcome
            assert await desk.read_text("kept.md") == "kept\n"


async def test_the_sdk_guide_example_runs(
    services: StartReader, nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/sdk.md's example of a client that does not wait, as written."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "sdk.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", guide, re.S) if "wait_approval" in b)
    source = "async def example(ws):\n" + textwrap.indent(block, "    ")
    scope: dict[str, object] = {"QuillError": QuillError, "ErrorCode": ErrorCode}
    exec(compile(source, "docs/sdk.md", "exec"), scope)
    await services("r1")
    async with AsyncExitStack() as stack:
        ws, desk = await agent_and_human(stack, nats_url, "acme/guide")
        await ws.create(trust="restricted")
        example = asyncio.create_task(scope["example"](ws))  # type: ignore[operator]
        [waiting] = await approvals_pending(desk)
        await desk.approve(waiting)
        await asyncio.wait_for(example, 30)
        assert capsys.readouterr().out.startswith("committed at version ")
