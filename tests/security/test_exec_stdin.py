"""An agent's standard input for a command (``exec.run``'s ``stdin``, issue 30), under both
sandbox providers: more than ``EXEC_STDIN_MAX_BYTES`` is refused with ``SIZE_LIMIT_EXCEEDED``,
by the SDK before sending and by the executor for a client that sends it anyway (before, there
was no ``stdin`` at all: a client could not give one); what it holds never reaches the audit
trail (its size does)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from contracts import codec
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import EXEC_STDIN_MAX_BYTES
from contracts.subjects import HEADER_REQUEST_ID, STREAM_AUDIT, Subjects
from infra.exec.sandbox import probe_bwrap
from quill.client import Quill, Workspace
from services.executor.app import ExecutorConfig
from tests.helpers import start_executor, start_writer_and_reader

MARK = b"fed-through-stdin-7f3a"


@pytest_asyncio.fixture(params=["bwrap", "local"])
async def ws(
    request: pytest.FixtureRequest, nats_url: str, tmp_path: Path, quill: Quill
) -> AsyncIterator[Workspace]:
    """A workspace served by a writer, a reader and an executor with the provider named."""
    if request.param == "bwrap" and (why := probe_bwrap()) is not None:
        pytest.skip(f"bwrap cannot run here: {why}")
    async with AsyncExitStack() as es:
        await start_writer_and_reader(es, nats_url, tmp_path)
        config = ExecutorConfig(sandbox=request.param)
        await start_executor(es, nats_url, tmp_path / "executor", config)
        workspace = quill.workspace(f"acme/stdin-{request.param}-{uuid.uuid4().hex[:8]}")
        await workspace.create()
        yield workspace


async def test_stdin_over_the_limit_is_refused(ws: Workspace, nc: NATS) -> None:
    over = b"y" * (EXEC_STDIN_MAX_BYTES + 1)
    with pytest.raises(QuillError) as info:
        await ws.exec("wc -c", stdin=over)
    assert info.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
    assert info.value.details["max_stdin_bytes"] == EXEC_STDIN_MAX_BYTES
    tenant, workspace = ws.tenant, ws.name
    body = codec.encode(rq.RunCommand(command="wc -c", stdin=over))  # past the SDK's check
    reply = await nc.request(
        Subjects().exec(tenant, workspace, "run"),
        body,
        timeout=30,
        headers={HEADER_REQUEST_ID: uuid.uuid4().hex},
    )
    answer = json.loads(reply.data)
    assert not answer["ok"] and answer["error"]["code"] == "SIZE_LIMIT_EXCEEDED"
    assert answer["error"]["details"]["stdin_bytes"] == EXEC_STDIN_MAX_BYTES + 1


async def test_audit_has_its_size_not_its_bytes(ws: Workspace, nc: NATS) -> None:
    r = await ws.exec("cat > /dev/null", stdin=MARK)
    tenant, workspace = ws.tenant, ws.name
    sub = await nc.jetstream().subscribe(
        Subjects().audit(tenant, workspace), stream=STREAM_AUDIT, ordered_consumer=True
    )
    try:
        while True:
            msg = await asyncio.wait_for(sub.next_msg(), 10)
            record = json.loads(msg.data)
            assert MARK not in msg.data
            if record["op"] == "run" and record["request_id"] == r.command_id:
                break
    finally:
        await sub.unsubscribe()
    assert record["details"]["stdin_bytes"] == len(MARK)
    assert record["summary"] == f"$ cat > /dev/null < stdin ({len(MARK)} bytes)"
