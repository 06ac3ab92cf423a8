"""A hot workspace (issue 29, item 4): many clients changing one file without conflicting with
each other all commit, with no ``CONFLICT`` and no retry of the client's, because the writer
decides each command against the state it holds, in order; a burst of commands to one
workspace takes fewer appends than it has commands; a group decided while the one before it
is in flight is sent chained to it, and decided again from the log if that one fails."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import HEADER_REQUEST_ID, HEADER_SESSION, HEADER_WAIT, Subjects
from quill import _transport as transport
from quill.client import CONFLICT_BASE_S, CONFLICT_CAP_S, Quill, conflict_backoff
from services.writer.app import Writer
from services.writer.append import AppendError, Group
from tests.conftest import StartReader
from tests.helpers import eventually, new_workspace, writer_on

S = Subjects()
CLIENTS = 64


async def ping(nc: NATS) -> dict[str, Any]:
    reply: dict[str, Any] = json.loads((await nc.request("ws.sys.ping.writer", b"", 5)).data)
    return reply


async def cmd(nc: NATS, ws: str, op: str, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    tenant, name = ws.split("/")
    msg = await nc.request(S.cmd(tenant, name, op), json.dumps(body).encode(), 30, headers=headers)
    reply: dict[str, Any] = json.loads(msg.data)
    return reply


@pytest_asyncio.fixture
async def single(nats_url: str) -> AsyncIterator[Quill]:
    """A client that never sends a request twice (``retries=0``): what commits, committed
    the first time."""
    client = await Quill.connect(nats_url, actor="hot", timeout=30, retries=0)
    yield client
    await client.close()


async def test_sixty_four_clients_appending_to_one_file_all_commit(
    services: StartReader, single: Quill
) -> None:
    ws = await new_workspace(services, single, "hot/append")
    lines = [f"client {n:02}\n" for n in range(CLIENTS)]
    written = await asyncio.gather(*[ws.write("log.txt", line, mode="append") for line in lines])
    assert all(w.committed for w in written)
    assert sorted(w.file_version for w in written) == list(range(1, CLIENTS + 1))
    text = await ws.read_text("log.txt")
    assert sorted(text.splitlines(keepends=True)) == lines  # each once, none lost
    sizes = {w.file_version: w.size for w in written}  # each saw the one before it
    assert [sizes[v] for v in range(1, CLIENTS + 1)] == [10 * v for v in range(1, CLIENTS + 1)]


async def test_sixty_four_unique_edits_of_one_file_all_commit(
    services: StartReader, single: Quill
) -> None:
    ws = await new_workspace(services, single, "hot/edit")
    await ws.write("doc.txt", "".join(f"line {n:02}: old\n" for n in range(CLIENTS)))
    edited = await asyncio.gather(
        *[ws.edit("doc.txt", f"line {n:02}: old", f"line {n:02}: new") for n in range(CLIENTS)]
    )
    assert all(e.committed and e.replacements == 1 for e in edited)
    assert sorted(e.file_version for e in edited) == list(range(2, CLIENTS + 2))
    text = await ws.read_text("doc.txt")
    assert text == "".join(f"line {n:02}: new\n" for n in range(CLIENTS))


async def test_a_burst_to_one_workspace_takes_fewer_appends_than_commands(
    services: StartReader, nc: NATS
) -> None:
    """64 appends held by another session's lock (``Ws-Wait``), then let go at once: they
    are decided in order against one state and appended together."""
    await services("r1")
    assert (await cmd(nc, "hot/burst", "create", {}))["ok"]
    assert (await cmd(nc, "hot/burst", "lock", {}, **{HEADER_SESSION: "a"}))["ok"]
    waits = {HEADER_SESSION: "b", HEADER_WAIT: "30000"}
    burst = [
        asyncio.create_task(
            cmd(
                nc,
                "hot/burst",
                "write",
                {"path": "f.txt", "content": f"{n}\n", "mode": "append"},
                **waits,
                **{HEADER_REQUEST_ID: f"burst-{n}"},
            )
        )  # fmt: skip
        for n in range(CLIENTS)
    ]
    counts: dict[str, Any] = {}

    async def parked() -> bool:
        counts.update(await ping(nc))
        return bool(counts["waiting"] == CLIENTS)

    await eventually(parked)  # polling a ping: nothing to wait on instead
    before = counts["appends"]
    assert (await cmd(nc, "hot/burst", "unlock", {}, **{HEADER_SESSION: "a"}))["ok"]
    replies = await asyncio.gather(*burst)
    assert all(r["ok"] for r in replies), [r for r in replies if not r["ok"]][:3]
    after = (await ping(nc))["appends"]
    events = after["events"] - before["events"]
    sends = after["sends"] - before["sends"]
    assert events == CLIENTS + 1  # the unlock and the 64 appends
    assert sends == 2, after  # the unlock, then the 64 as one group (never one each)
    assert sorted(r["version"] for r in replies) == list(range(4, 4 + CLIENTS))


@pytest_asyncio.fixture
async def writer(nats_url: str, tmp_path: Path) -> AsyncIterator[Writer]:
    async with writer_on(nats_url, tmp_path) as w:
        yield w


class Gate:
    """Holds the writer's first send of ``subject`` until ``opened``; ``fail``: that send
    then fails as refused (nothing of it is in the log)."""

    def __init__(self, writer: Writer, subject: str, fail: bool) -> None:
        self.opened = asyncio.Event()
        self.entered = asyncio.Event()
        self.sent: list[list[int]] = []
        send = writer.appender._send
        held = False

        async def gated(groups: list[Group]) -> list[list[int]]:
            nonlocal held
            if not held and any(g.subject == subject for g in groups):
                held = True
                self.entered.set()
                await self.opened.wait()
                if fail:
                    raise AppendError("refused by the test", uncertain=False)
            out = await send(groups)
            self.sent.append([len(g.payloads) for g in groups])
            return out

        writer.appender._send = gated  # type: ignore[method-assign]


@pytest.mark.parametrize("fail", [False, True])
async def test_the_next_group_is_decided_while_one_is_in_flight(
    writer: Writer, nc: NATS, fail: bool
) -> None:
    """While the first write's append is held, the others are decided against the state it
    leaves and handed over chained to it; they go once it is acknowledged. If it fails,
    none of them is sent: every command is decided again from the log, and each commits
    once."""
    name = f"chain{int(fail)}"
    assert (await cmd(nc, f"hot/{name}", "create", {}))["ok"]
    gate = Gate(writer, S.evt("hot", name), fail)
    chained = writer.appender.chained

    def write(n: int) -> asyncio.Task[dict[str, Any]]:
        body = {"path": "f.txt", "content": f"{n:02}\n", "mode": "append"}
        return asyncio.create_task(cmd(nc, f"hot/{name}", "write", body))

    first = write(0)
    await asyncio.wait_for(gate.entered.wait(), 20)
    rest = [write(n) for n in range(1, 16)]
    await eventually(lambda: any(g.after is not None for g in writer.appender._queue))
    assert not any(t.done() for t in [first, *rest])  # nothing answered before the append
    gate.opened.set()
    replies = await asyncio.gather(first, *rest)
    assert all(r["ok"] for r in replies), replies
    assert sorted(r["version"] for r in replies) == list(range(2, 18))
    assert sorted(r["result"]["size"] for r in replies) == [3 * n for n in range(1, 17)]
    if not fail:
        assert writer.appender.chained > chained
    last = await nc.jetstream().get_last_msg("WS_EVENTS", S.evt("hot", name))
    assert json.loads(last.data or b"{}")["version"] == 17  # no event twice, none lost


async def test_a_conflict_is_retried_only_when_asked(services: StartReader, single: Quill) -> None:
    ws = await new_workspace(services, single, "hot/asked")
    await ws.write("f.txt", "one\n")
    tries = 0

    async def stale() -> object:
        nonlocal tries
        tries += 1
        return await ws.write("f.txt", "two\n", if_match='"v9"')

    with pytest.raises(QuillError) as refused:
        await single.retry_conflicts(stale)  # conflict_retries is 0: not retried
    assert (refused.value.code, tries) == (ErrorCode.CONFLICT, 1)
    tries = 0
    with pytest.raises(QuillError):
        await single.retry_conflicts(stale, retries=3)
    assert tries == 4
    tries = 0
    missing = single.retry_conflicts(lambda: ws.read_text("nothing.txt"), retries=3)
    with pytest.raises(QuillError) as other:
        await missing  # another error is raised at once
    assert other.value.code == ErrorCode.FILE_NOT_FOUND


async def test_update_reads_again_after_a_conflict(services: StartReader, nats_url: str) -> None:
    """Eight clients each adding a line with ``update`` (read, change, ``if_match``): those
    that conflict read again and retry, until every line is in."""
    await services("r1")
    client = await Quill.connect(nats_url, timeout=30, conflict_retries=1_000)
    try:
        ws = client.workspace("hot/update")
        await ws.create()
        await ws.write("list.txt", "")
        await asyncio.gather(
            *[ws.update("list.txt", lambda text, n=n: text + f"item {n}\n") for n in range(8)]
        )
        text = await ws.read_text("list.txt")
        assert sorted(text.splitlines()) == [f"item {n}" for n in range(8)]
        assert (await ws.stat("list.txt")).file_version == 9  # each change once
    finally:
        await client.close()


def test_the_conflict_backoff_is_jittered_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Full jitter: uniform in ``[0, min(cap, base * 2**retry)]``, never more than the cap."""
    drawn: list[tuple[float, float]] = []
    monkeypatch.setattr(transport.random, "uniform", lambda a, b: drawn.append((a, b)) or b)
    pauses = [conflict_backoff(n) for n in (0, 1, 2, 10, 10_000)]
    assert drawn == [(0.0, p) for p in pauses]
    assert pauses[:3] == [CONFLICT_BASE_S, 2 * CONFLICT_BASE_S, 4 * CONFLICT_BASE_S]
    assert pauses[3:] == [CONFLICT_CAP_S, CONFLICT_CAP_S]
