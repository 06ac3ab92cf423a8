"""A command's standard input (``exec.run``'s ``stdin``), under both sandbox providers: fed
whole to the command (bytes as they are), bounded by ``EXEC_STDIN_MAX_BYTES`` (past it
``SIZE_LIMIT_EXCEEDED``, from the SDK before sending and from the executor for a client that
sends it anyway), its size audited and never its bytes; without it, stdin is closed and a read
of it is told, as before."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from nats.aio.client import Client as NATS

from contracts import codec
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import EXEC_STDIN_MAX_BYTES
from contracts.subjects import HEADER_REQUEST_ID, STREAM_AUDIT, Subjects
from quill.client import Quill
from tests.executor.conftest import StartExecutor

MARK = b"fed-through-stdin-7f3a"


async def test_the_command_reads_what_it_is_given(
    stack: StartExecutor, quill: Quill, name: str
) -> None:
    await stack()
    ws = quill.workspace(name)
    await ws.create()
    r = await ws.exec("tr a-z A-Z", stdin=b"shout\n")
    assert (r.stdout, r.exit_code, r.stdin_read) == ("SHOUT\n", 0, False)
    raw = bytes(range(256)) * 3
    kept = await ws.exec("cat > fed.bin", stdin=raw)  # bytes as they are (base64 on the wire)
    assert kept.changes.committed and await ws.read_bytes("fed.bin") == raw
    whole = await ws.exec("wc -c", stdin=b"x" * EXEC_STDIN_MAX_BYTES)  # the limit itself
    assert whole.stdout.strip() == str(EXEC_STDIN_MAX_BYTES)
    empty = await ws.exec("cat; echo end", stdin=b"")  # given empty: end of file, no note
    assert (empty.stdout, empty.stdin_read) == ("end\n", False)
    closed = await ws.exec('read x; echo "[$x]"')  # none given: closed, and the read told
    assert (closed.stdout, closed.stdin_read) == ("[]\n", True)


async def test_stdin_over_the_limit_is_refused(
    stack: StartExecutor, quill: Quill, nc: NATS, name: str
) -> None:
    await stack()
    ws = quill.workspace(name)
    await ws.create()
    over = b"y" * (EXEC_STDIN_MAX_BYTES + 1)
    with pytest.raises(QuillError) as info:
        await ws.exec("wc -c", stdin=over)
    assert info.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
    assert info.value.details["max_stdin_bytes"] == EXEC_STDIN_MAX_BYTES
    tenant, workspace = name.split("/")
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


async def test_audit_has_its_size_not_its_bytes(
    stack: StartExecutor, quill: Quill, nc: NATS, name: str
) -> None:
    await stack()
    ws = quill.workspace(name)
    await ws.create()
    r = await ws.exec("cat > /dev/null", stdin=MARK)
    tenant, workspace = name.split("/")
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
