"""A bridge's life: the names it may not claim, its audit records, and what answers once it
has stopped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from contracts import codec
from contracts.errors import ErrorCode, QuillError
from contracts.events import AuditRecord, WorkspaceUpdated
from quill.client import Quill
from tests.bridge.conftest import Attach
from tests.helpers import services_see


async def test_a_name_is_served_by_one_bridge_and_never_a_server_workspace(
    servers: None, attach: Attach, client: Quill, nc: NATS, tmp_path: Path
) -> None:
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    first = await attach(tmp_path / "one", "laptop")
    second = await attach(tmp_path / "two", "laptop", ready=False)
    assert await second.exit_code() != 0
    assert "ALREADY_EXISTS" in second.log.read_text()
    assert f"served by another bridge (laptop:{tmp_path / 'one'})" in second.log.read_text()

    await client.workspace("acme/server").create()
    third = await attach(tmp_path / "two", "server", ready=False)
    assert await third.exit_code() != 0
    assert "acme/server is a server workspace" in third.log.read_text()
    assert (await client.workspace("acme/server").info()).version == 1  # still the server's

    (tmp_path / "one" / "a.txt").write_text("local\n")
    ws = client.workspace("acme/laptop")
    assert await ws.read_text("a.txt") == "local\n"
    assert await first.stop() == 0
    assert (await first.line()).startswith("quill attach stopped: acme/laptop released")
    await services_see(nc, 0)
    with pytest.raises(QuillError) as info:  # the servers answer again
        await ws.read_text("a.txt")
    assert info.value.code == ErrorCode.WORKSPACE_NOT_FOUND


async def test_every_operation_is_audited_by_the_bridge(
    servers: None, attach: Attach, client: Quill, nc: NATS, tmp_path: Path
) -> None:
    (tmp_path / "dir").mkdir()
    await attach(tmp_path / "dir", "audited", "--trust", "full")
    ws = client.workspace("acme/audited")
    updates = await nc.subscribe("ws.updated.acme.audited")
    await nc.flush()  # the server has the subscription before the write (another connection's)
    await ws.write("a.txt", "a\n")
    update = codec.decode((await updates.next_msg(timeout=10)).data, WorkspaceUpdated)
    assert (update.version, update.op, update.actor, update.paths) == (
        2,
        "write",
        "tester",
        ["a.txt"],
    )
    await ws.read("a.txt")
    with pytest.raises(QuillError):
        await ws.edit("a.txt", "zzz", "y")
    await ws.exec("cat a.txt")
    with pytest.raises(QuillError):
        await ws.history("a.txt")
    wanted = {
        ("cmd", "write", "ok", None),
        ("qry", "read", "ok", None),
        ("cmd", "edit", "error", "NO_MATCH"),
        ("exec", "run", "ok", None),
        ("qry", "history", "error", "INVALID_ARGUMENT"),
    }
    seen: list[AuditRecord] = []
    async with asyncio.timeout(10):
        async for record in ws.audit(follow=True):
            seen.append(record)
            if len(seen) == len(wanted):
                break
    assert {(r.kind, r.op, r.outcome, r.error_code) for r in seen} == wanted
    assert {r.service for r in seen} == {"bridge"}
    write = next(r for r in seen if r.op == "write")
    assert write.actor == "tester" and write.paths == ["a.txt"] and write.version == 2
    run = next(r for r in seen if r.op == "run")
    assert run.details is not None and run.details["command"] == "cat a.txt"
