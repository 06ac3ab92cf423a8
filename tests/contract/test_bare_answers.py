"""Every request from a bare client gets one clear answer (issue 11, "Wrong or missing
answers"): bare nats-py, no SDK, no ``Ws-Request-Id``, against a real nats-server with the
writer, a reader and an executor in process."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from contracts import requests as rq
from contracts.subjects import HEADER_REQUEST_ID, HEADER_RUN, STREAM_AUDIT
from core.plan import Committed
from services.executor.app import ExecutorConfig
from services.reader.app import Reader
from services.writer import workspace as writer_workspace
from services.writer.app import Writer
from tests.bare import code
from tests.helpers import eventually, start_executor, start_reader, start_writer

REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")
ANSWER_S = 5.0
"""Every request must be answered within this (the fuzzing suite's bound)."""


@dataclass
class Stack:
    nc: NATS
    writer: Writer
    reader: Reader
    stack: AsyncExitStack
    nats_url: str
    tmp: Path

    async def executor(self) -> None:
        config = ExecutorConfig(sandbox="local")
        await start_executor(self.stack, self.nats_url, self.tmp / "executor", config)

    async def call(
        self,
        kind: str,
        ws: str,
        op: str,
        body: object = None,
        *,
        raw: bytes | None = None,
        timeout: float = ANSWER_S,
        **headers: str,
    ) -> dict[str, Any]:
        """One request as any client sends it: JSON (or ``raw`` bytes), the headers given."""
        data = raw if raw is not None else json.dumps(body or {}).encode()
        msg = await self.nc.request(
            f"ws.{kind}.acme.{ws}.{op}", data, timeout=timeout, headers=headers or None
        )
        reply: dict[str, Any] = json.loads(msg.data)
        return reply


@pytest_asyncio.fixture
async def bare(nats_url: str, tmp_path: Path) -> AsyncIterator[Stack]:
    async with AsyncExitStack() as stack:
        writer = await start_writer(stack, nats_url, tmp_path / "writer")
        reader = await start_reader(stack, nats_url, tmp_path / "reader")
        nc = await nats.connect(nats_url)
        stack.push_async_callback(nc.close)
        yield Stack(nc, writer, reader, stack, nats_url, tmp_path)


async def audit_records(nc: NATS, ws: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` audit records of ``acme/<ws>`` (waiting for them, bounded)."""
    js = nc.jetstream()
    sub = await js.subscribe(f"ws.audit.acme.{ws}", stream=STREAM_AUDIT, ordered_consumer=True)
    try:
        return [json.loads((await sub.next_msg(timeout=10)).data) for _ in range(count)]
    finally:
        await sub.unsubscribe()


# ------------------------------------------------------------------ 1. no Ws-Request-Id


async def test_exec_without_request_id_commits_its_changes(bare: Stack) -> None:
    await bare.executor()
    assert (await bare.call("cmd", "noid", "create"))["ok"]
    run = await bare.call(
        "exec", "noid", "run", {"command": "echo hi > a.txt"}, timeout=60
    )  # no Ws-Request-Id
    assert run["ok"], run
    assert run["result"]["changes"]["error"] is None, run["result"]["changes"]
    assert run["result"]["changes"]["committed"]
    version = run["result"]["changes"]["version"]
    read = await bare.call("qry", "noid", "read", {"path": "a.txt", "min_version": version})
    assert read["ok"] and read["result"]["content"] == "hi\n", read

    records = await audit_records(bare.nc, "noid", 4)  # create, apply, exec run, read
    ids = {r["kind"] + "." + r["op"]: r["request_id"] for r in records}
    for op in ("cmd.create", "exec.run", "cmd.apply"):
        assert REQUEST_ID.match(ids[op] or ""), ids
    assert ids["cmd.apply"] == ids["exec.run"] + ":changes"


async def test_command_without_request_id_works_like_one_with_it(bare: Stack) -> None:
    assert (await bare.call("cmd", "noid2", "create"))["ok"]
    bare_write = await bare.call("cmd", "noid2", "write", {"path": "a.txt", "content": "x"})
    named = await bare.call(
        "cmd", "noid2", "write", {"path": "b.txt", "content": "x"}, **{HEADER_REQUEST_ID: "b-1"}
    )
    assert bare_write["ok"] and named["ok"]
    records = await audit_records(bare.nc, "noid2", 3)
    assert [r["outcome"] for r in records] == ["ok", "ok", "ok"]
    assert all(REQUEST_ID.match(r["request_id"]) for r in records), records
    assert records[2]["request_id"] == "b-1"


# ------------------------------------------------------------------ 2. runs


async def test_a_query_in_an_unknown_run_is_refused(bare: Stack) -> None:
    assert (await bare.call("cmd", "runs", "create"))["ok"]
    await bare.call("cmd", "runs", "write", {"path": "a.txt", "content": "a"})
    reply = await bare.call("qry", "runs", "read", {"path": "a.txt"}, **{HEADER_RUN: "no-such"})
    assert code(reply) == "RUN_NOT_FOUND", reply
    assert reply["error"]["details"] == {"run": "no-such"}
    listing = await bare.call("qry", "runs", "list", {}, **{HEADER_RUN: "no-such"})
    assert code(listing) == "RUN_NOT_FOUND", listing


class Gate:
    """Holds a replica's log follower before it applies a version of a workspace."""

    def __init__(self, reader: Reader, workspace: str, version: int) -> None:
        self.open = asyncio.Event()
        self.held = asyncio.Event()
        apply = reader.store.apply

        async def gated(batch: list[Committed], **kw: Any) -> Any:
            if any(c.event.workspace == workspace and c.event.version >= version for c in batch):
                self.held.set()
                await self.open.wait()
            return await apply(batch, **kw)

        reader.store.apply = gated  # type: ignore[method-assign]


async def test_a_query_in_a_run_waits_for_the_replica_to_know_it(bare: Stack) -> None:
    """Right after ``run_start``, a replica that has not applied the file it pins nor the run
    waits for them and answers at the run's version (it used to answer at its own latest)."""
    assert (await bare.call("cmd", "lag", "create"))["ok"]
    gate = Gate(bare.reader, "lag", 2)
    write = await bare.call("cmd", "lag", "write", {"path": "a.txt", "content": "in the run"})
    started = await bare.call("cmd", "lag", "run_start", {"run": "r1"})
    assert started["ok"] and started["result"]["version"] == write["version"] == 2
    await asyncio.wait_for(gate.held.wait(), 10)  # the replica is at version 1
    read = asyncio.create_task(
        bare.call("qry", "lag", "read", {"path": "a.txt"}, **{HEADER_RUN: "r1"})
    )
    waiters = bare.reader.follower._waiters
    # the query waits for the replica (or, wrongly, answers)
    await eventually(lambda: read.done() or waiters.get(("acme", "lag")))
    gate.open.set()
    reply = await read
    assert reply["ok"], reply
    assert reply["version"] == 2 and reply["result"]["content"] == "in the run"
    # a version other than the run's is refused, never answered
    await bare.call("cmd", "lag", "write", {"path": "a.txt", "content": "later"})
    other = await bare.call(
        "qry", "lag", "read", {"path": "a.txt", "version": 3}, **{HEADER_RUN: "r1"}
    )
    assert code(other) == "INVALID_ARGUMENT", other
    same = await bare.call(
        "qry", "lag", "read", {"path": "a.txt", "version": 2}, **{HEADER_RUN: "r1"}
    )
    assert same["ok"] and same["result"]["content"] == "in the run", same


# ------------------------------------------------------------------ 3. one command's failure


async def test_restore_outside_the_workspace_is_access_denied(bare: Stack) -> None:
    assert (await bare.call("cmd", "rest", "create"))["ok"]
    for path in ("../etc", "/etc/passwd"):
        reply = await bare.call("cmd", "rest", "restore", {"version": 1, "path": path})
        assert code(reply) == "ACCESS_DENIED", reply


async def test_one_commands_failure_never_fails_anothers(
    bare: Stack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Many clients write at once, among them a restore outside the workspace and a command
    whose decision raises: those two alone fail, every write commits."""
    assert (await bare.call("cmd", "group", "create"))["ok"]
    decide = writer_workspace.decide

    def exploding(state: Any, cmd: rq.Request, ctx: Any) -> Any:
        if isinstance(cmd, rq.WriteFile) and cmd.path == "boom.txt":
            raise RuntimeError("forced")
        return decide(state, cmd, ctx)

    monkeypatch.setattr(writer_workspace, "decide", exploding)
    clients = [await nats.connect(bare.nats_url) for _ in range(10)]
    try:

        async def write(i: int) -> dict[str, Any]:
            body = {"path": f"f{i}.txt", "content": str(i)}
            msg = await clients[i % 10].request(
                "ws.cmd.acme.group.write", json.dumps(body).encode(), timeout=30
            )
            return dict(json.loads(msg.data))

        async def odd(op: str, body: object, rid: str) -> dict[str, Any]:
            msg = await clients[0].request(
                f"ws.cmd.acme.group.{op}",
                json.dumps(body).encode(),
                timeout=30,
                headers={HEADER_REQUEST_ID: rid},
            )
            return dict(json.loads(msg.data))

        n = 200
        with caplog.at_level(logging.ERROR):
            replies = await asyncio.gather(
                *[write(i) for i in range(n // 2)],
                odd("restore", {"version": 1, "path": "../outside"}, "bad-restore"),
                odd("write", {"path": "boom.txt", "content": "x"}, "forced-boom"),
                *[write(i) for i in range(n // 2, n)],
            )
    finally:
        for c in clients:
            await c.close()
    writes = replies[: n // 2] + replies[n // 2 + 2 :]
    restore, boom = replies[n // 2], replies[n // 2 + 1]
    assert [w for w in writes if not w["ok"]] == []
    assert sorted(w["version"] for w in writes) == list(range(2, n + 2))
    assert code(restore) == "ACCESS_DENIED", restore
    assert code(boom) == "INTERNAL", boom
    assert any("forced-boom" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------ 4. malformed input


@pytest.mark.parametrize(
    ("kind", "op", "raw"),
    [
        ("cmd", "write", b'{"path": "a\xff.txt", "content": "x"}'),
        ("cmd", "write", b'{"path": "a.txt", "content": "\xed\xa0\x80"}'),
        ("qry", "read", b'{"path": "a\xfe.txt"}'),
        ("exec", "run", b'{"command": "echo \xc3"}'),
    ],
    ids=["writer-path", "writer-surrogate", "reader", "executor"],
)
async def test_invalid_utf8_is_invalid_argument(
    bare: Stack, kind: str, op: str, raw: bytes
) -> None:
    if kind == "exec":
        await bare.executor()
    await bare.call("cmd", "utf", "create")  # the first case creates it
    reply = await bare.call(kind, "utf", op, raw=raw)
    assert code(reply) == "INVALID_ARGUMENT", reply
    assert "UTF-8" in reply["error"]["message"], reply


async def test_nul_in_a_grep_pattern_is_invalid_argument(bare: Stack) -> None:
    assert (await bare.call("cmd", "nul", "create"))["ok"]
    w = await bare.call("cmd", "nul", "write", {"path": "a.txt", "content": "abc\nplain\n"})
    for body in (
        {"pattern": "ab\x00c"},
        {"pattern": "ab\x00c", "literal": True},
        {"pattern": "\x00"},
    ):
        reply = await bare.call("qry", "nul", "grep", {**body, "min_version": w["version"]})
        assert code(reply) == "INVALID_ARGUMENT", reply
        assert "NUL" in reply["error"]["message"], reply
    # a regex escape for NUL is a valid pattern: it matches nothing (text files hold none)
    escaped = {"pattern": "abc\\x00def", "min_version": w["version"]}
    reply = await bare.call("qry", "nul", "grep", escaped)
    assert reply["ok"] and reply["result"]["total"] == 0, reply


async def test_a_command_of_another_session_on_a_locked_workspace_is_refused_before_it_runs(
    bare: Stack,
) -> None:
    """Before: the command ran, answered ``ok``, and its changes were dropped
    (``changes.error: LOCKED``). Now it is refused before it runs; the holder's command runs."""
    await bare.executor()
    assert (await bare.call("cmd", "locked", "create"))["ok"]
    lock = await bare.call("cmd", "locked", "lock", {"ttl_ms": 60_000}, **{"Ws-Session": "s1"})
    assert lock["ok"], lock
    other = await bare.call("exec", "locked", "run", {"command": "touch out.txt"}, timeout=60)
    assert code(other) == "LOCKED" and other["error"]["details"]["holder"] == "s1", other
    for session in ({}, {"Ws-Session": "s2"}):
        refused = await bare.call("exec", "locked", "run", {"command": "true"}, **session)
        assert code(refused) == "LOCKED", refused
    mine = await bare.call(
        "exec", "locked", "run", {"command": "touch mine.txt"}, timeout=60, **{"Ws-Session": "s1"}
    )
    assert mine["ok"] and mine["result"]["changes"]["committed"], mine
    listed = await bare.call("qry", "locked", "list", {"path": "", "min_version": 3})
    assert [e["path"] for e in listed["result"]["entries"]] == ["mine.txt"], listed
