"""``Workspace.call``: any op of the registry, sent from its request alone, through the real
writer, reader and executor; what ``quill call`` and generic clients use."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from services.executor.app import ExecutorConfig
from tests.conftest import StartReader
from tests.helpers import start_executor


async def test_every_kind_of_op_goes_by_its_request(
    services: StartReader, quill: Quill, nats_url: str, tmp_path: Path
) -> None:
    await services("r1")
    ws = quill.workspace("acme/call")
    created = await ws.call(rq.CreateWorkspace())
    assert isinstance(created, rp.WorkspaceCreatedResult) and created.created
    written = await ws.call(rq.WriteFile(path="a.txt", content="one\n"))
    assert isinstance(written, rp.FileWritten) and written.committed
    assert ws.last_version == 2
    read = await ws.call(rq.ReadFile(path="a.txt"))  # reads its own write (min_version)
    assert isinstance(read, rp.FileContent) and "one" in read.content
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "x", ExecutorConfig(sandbox="local"))
        ran = await ws.call(rq.RunCommand(command="echo two >> a.txt"))
        assert isinstance(ran, rp.CommandResult) and ran.exit_code == 0
        output = await ws.call(rq.CommandOutputQuery(command_id=ran.command_id))
        assert isinstance(output, rp.CommandOutput)
    assert await ws.read_text("a.txt") == "one\ntwo\n"


async def test_what_is_no_op_request_is_refused_before_sending(quill: Quill) -> None:
    with pytest.raises(QuillError) as info:
        await quill.workspace("acme/call").call(rq.Request())
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
