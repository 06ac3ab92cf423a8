"""Audit records for every operation, failures included; limits; the SDK's retries."""

from __future__ import annotations

import asyncio
import json

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from contracts.subjects import Subjects
from quill.client import Quill
from tests.integration.conftest import StartReader


async def test_every_operation_is_audited_without_contents(services: StartReader, nc: NATS) -> None:
    await services("r1")
    quill = Quill(nc, actor="auditor-test", session="s-1")
    ws = quill.workspace("acme/audited")
    records: list[dict] = []
    six = asyncio.Event()

    async def collect(msg: Msg) -> None:
        records.append(json.loads(msg.data))
        if len(records) == 6:
            six.set()

    sub = await nc.subscribe("ws.audit.acme.audited", cb=collect)
    await ws.create()
    await ws.write("secret.txt", "the password is hunter2")
    await ws.read("secret.txt")
    with pytest.raises(QuillError):
        await ws.read("missing.txt")
    with pytest.raises(QuillError):
        await ws.write("../escape", "x")
    await ws.list(".")
    await asyncio.wait_for(six.wait(), 10)
    await sub.unsubscribe()
    ops = [(r["kind"], r["op"], r["outcome"], r["error_code"]) for r in records]
    assert ops == [
        ("cmd", "create", "ok", None),
        ("cmd", "write", "ok", None),
        ("qry", "read", "ok", None),
        ("qry", "read", "error", "FILE_NOT_FOUND"),
        ("cmd", "write", "error", "ACCESS_DENIED"),
        ("qry", "list", "ok", None),
    ]
    assert all(r["actor"] == "auditor-test" and r["session"] == "s-1" for r in records)
    assert records[1]["paths"] == ["secret.txt"] and records[1]["version"] == 2
    assert all("hunter2" not in json.dumps(r) for r in records)
    assert all(r["duration_ms"] >= 0 for r in records)


async def test_size_limits(services: StartReader, quill: Quill) -> None:
    await services("r1")
    ws = quill.workspace("acme/small")
    await ws.create(limits=LimitsPatch(max_file_bytes=100, max_files=2))
    with pytest.raises(QuillError) as info:
        await ws.write("big.txt", "x" * 101)
    assert info.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
    await ws.write("a", "1")
    await ws.write("b", "2")
    with pytest.raises(QuillError) as info:
        await ws.write("c", "3")
    assert info.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
    assert (await ws.info()).limits.max_file_bytes == 100
    huge = quill.workspace("acme/huge")
    await huge.create()
    with pytest.raises(QuillError) as info:
        await huge.write("huge.bin", b"\0" * (9 * 1024 * 1024))  # over the NATS message size
    assert info.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED


async def test_sdk_retries_a_timed_out_command_with_the_same_request_id(nc: NATS) -> None:
    """A responder that loses the first attempt: the retry carries the same id and wins."""
    seen: list[str] = []

    async def flaky(msg: Msg) -> None:
        seen.append((msg.headers or {})["Ws-Request-Id"])
        if len(seen) > 1:
            await msg.respond(b'{"ok":true,"version":9,"result":{"path":"x","created":[]}}')

    sub = await nc.subscribe(Subjects().cmd("acme", "flaky", "mkdir"), cb=flaky)
    quill = Quill(nc, timeout=0.3, retries=2)
    made = await quill.workspace("acme/flaky").mkdir("x")
    await sub.unsubscribe()
    assert made.path == "x" and quill.workspace("acme/flaky").last_version == 9
    assert len(seen) == 2 and seen[0] == seen[1]


async def test_no_service_is_a_clear_error(nc: NATS) -> None:
    quill = Quill(nc, timeout=0.5, retries=1, failover_s=1.0)  # not the 15 s of a failover
    with pytest.raises(QuillError) as info:
        await quill.workspace("nobody/home").read("x")
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert info.value.message == "No Quill reader is running"


async def test_views_name_their_actor_and_share_read_your_writes(
    services: StartReader, nc: NATS
) -> None:
    await services("r1")
    quill = Quill(nc, actor="service")
    alice = quill.as_actor("alice", session="s-a")
    await quill.workspace("acme/views").create()
    await alice.workspace("acme/views").write("a.txt", "from alice")
    assert quill.workspace("acme/views").last_version == 2  # shared: reads see alice's write
    assert await quill.workspace("acme/views").read_text("a.txt") == "from alice"
    revisions = (await quill.workspace("acme/views").history()).revisions
    assert [(r.version, r.actor) for r in revisions] == [(2, "alice"), (1, "service")]
