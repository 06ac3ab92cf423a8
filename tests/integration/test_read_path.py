"""The read path's shortcuts keep what a read answers and audits: a read answered without a
task (``handlers.eagerly``), the audit record built from a per-address template, the
origin of a request without headers shared."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts.errors import ErrorCode, QuillError
from contracts.paths import normalize_existing
from quill.client import Quill
from services.reader.handlers import eagerly
from services.reader.queries import existing
from tests.helpers import new_workspace
from tests.integration.conftest import StartReader


async def test_each_read_audits_its_own_version_paths_and_origin(
    services: StartReader, nc: NATS
) -> None:
    await services("r1")
    plain, named = Quill(nc), Quill(nc, actor="ada", session="s-9")
    ws, ws_named = plain.workspace("acme/tpl"), named.workspace("acme/tpl")
    await ws.create()
    await ws.write("a.txt", "one\n")
    await ws.write("b.txt", "two\n")
    records: list[dict] = []
    done = asyncio.Event()

    async def collect(msg: Msg) -> None:
        record = json.loads(msg.data)
        if record["kind"] == "qry":
            records.append(record)
            if len(records) == 6:
                done.set()

    sub = await nc.subscribe("ws.audit.acme.tpl", cb=collect)
    await ws.read("a.txt")
    await ws.read("a.txt", version=2)
    await ws.read("b.txt")
    await ws_named.read("a.txt")
    with pytest.raises(QuillError):
        await ws.read("missing.txt")
    await ws.read("a.txt")
    await asyncio.wait_for(done.wait(), 10)
    await sub.unsubscribe()
    seen = [
        (r["paths"], r["version"], r["actor"], r["session"], r["outcome"], r["error_code"])
        for r in records
    ]
    assert seen == [
        (["a.txt"], 3, None, None, "ok", None),
        (["a.txt"], 2, None, None, "ok", None),
        (["b.txt"], 3, None, None, "ok", None),
        (["a.txt"], 3, "ada", "s-9", "ok", None),
        ([], None, None, None, "error", "FILE_NOT_FOUND"),
        (["a.txt"], 3, None, None, "ok", None),
    ]
    assert len({r["at"] for r in records}) == 6
    # a query sent without an id has none, but a failed one is given one (its reply's
    # Ws-Request-Id and its log line name it: docs/operations.md#logs)
    assert [r["request_id"] is None for r in records] == [True] * 4 + [False, True]
    assert re.fullmatch(r"[0-9a-f]{32}", records[4]["request_id"])
    assert all(r["run"] is None for r in records)
    assert all(r["service"] == "reader" and r["details"] is None for r in records)


async def test_eagerly_runs_to_the_first_suspension_then_hands_on() -> None:
    log: list[str] = []

    async def at_once() -> None:
        log.append("at once")

    assert eagerly(at_once()) is None
    assert log == ["at once"]

    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def waits() -> None:
        log.append("started")
        log.append(await gate)
        await asyncio.sleep(0)
        log.append("after a bare yield")

    task = eagerly(waits())
    assert task is not None and log[-1] == "started"
    gate.set_result("resumed")
    await task
    assert log[-2:] == ["resumed", "after a bare yield"]


async def test_eagerly_passes_failures_and_cancellation_to_the_coroutine() -> None:
    failing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    caught: list[BaseException] = []

    async def catches() -> None:
        try:
            await failing
        except ValueError as exc:
            caught.append(exc)

    task = eagerly(catches())
    assert task is not None
    failing.set_exception(ValueError("boom"))
    await task
    assert [str(e) for e in caught] == ["boom"]

    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    cleaned = asyncio.Event()

    async def cancelled() -> None:
        try:
            await never
        finally:
            cleaned.set()

    task = eagerly(cancelled())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set() and never.cancelled()

    async def raises() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("after a yield")

    task = eagerly(raises())
    assert task is not None
    with pytest.raises(RuntimeError, match="after a yield"):
        await task


async def test_remembered_paths_are_normal_and_refusals_are_not_remembered(
    services: StartReader, quill: Quill
) -> None:
    ws = await new_workspace(services, quill, "acme/paths")
    await ws.write("d/a.txt", "a\n")
    for _ in range(2):
        assert (await ws.read("./d//a.txt")).path == "d/a.txt"
        assert (await ws.read("/workspace/d/a.txt")).path == "d/a.txt"
        for hostile, code in [
            ("../etc/passwd", ErrorCode.ACCESS_DENIED),
            ("/etc/passwd", ErrorCode.ACCESS_DENIED),
            ("d\\a.txt", ErrorCode.INVALID_ARGUMENT),
            ("d/" + "../" * 100 + "a", ErrorCode.ACCESS_DENIED),  # past what is remembered
            ("x" * 300, ErrorCode.INVALID_ARGUMENT),
        ]:
            with pytest.raises(QuillError) as refused:
                await ws.read(hostile)
            assert refused.value.code == code
    # the same answer as the rule, remembered or not, refusal or legacy name
    for path in ["a/./b", "e\u0301.txt", "../x", "a\\b", "a" * 300, "/workspace", "x/" * 200]:
        for _ in range(2):
            try:
                expected: str | ErrorCode = normalize_existing(path)
            except QuillError as exc:
                expected = exc.code
            try:
                got: str | ErrorCode = existing(path)
            except QuillError as exc:
                got = exc.code
            assert got == expected
