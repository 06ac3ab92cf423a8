"""The writer's memory budgets (issue 17): it holds at most ``max_workspaces`` workspaces and
``WRITER_RECENT_RESULTS`` results of each; what it drops answers as before, from the
projection (a retried request id gets its first reply, evicted or not)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from contracts.subjects import Subjects
from services.writer import lifecycle, results
from services.writer.app import Writer
from services.writer.config import WriterConfig
from tests.helpers import writer_on

S = Subjects()
BUDGET = 4


@pytest_asyncio.fixture
async def writer(nats_url: str, tmp_path: Path) -> AsyncIterator[Writer]:
    async with writer_on(nats_url, tmp_path, WriterConfig(max_workspaces=BUDGET)) as w:
        yield w


async def cmd(nc: NATS, name: str, op: str, body: dict[str, Any], request_id: str) -> Any:
    msg = await nc.request(
        S.cmd("acme", name, op),
        json.dumps(body).encode(),
        timeout=10,
        headers={"Ws-Request-Id": request_id},
    )
    return json.loads(msg.data)


async def held(nc: NATS) -> tuple[int, int]:
    pong = json.loads((await nc.request("ws.sys.ping.writer", b"", timeout=5)).data)
    return pong["workspaces"], pong["budget"]


async def test_the_writer_holds_its_budget_and_evicted_workspaces_answer_retries(
    writer: Writer, nc: NATS
) -> None:
    first: dict[str, Any] = {}
    for i in range(3 * BUDGET):
        name = f"b{i}"
        first[f"{name}/create"] = await cmd(nc, name, "create", {}, f"{name}-create")
        body = {"path": "f", "content": f"{i}\n"}
        first[f"{name}/write"] = await cmd(nc, name, "write", body, f"{name}-write")
        assert first[f"{name}/write"]["version"] == 2
        count, budget = await held(nc)
        assert budget == BUDGET and count <= BUDGET
    # every workspace but the last few was dropped: the same requests again get their
    # first replies (not ALREADY_EXISTS, not a new version)
    for key, reply in first.items():
        name, op = key.split("/")
        body = {} if op == "create" else {"path": "f", "content": "another\n"}
        assert await cmd(nc, name, op, body, f"{name}-{op}") == reply
        assert (await held(nc))[0] <= BUDGET
    again = await cmd(nc, "b0", "write", {"path": "f", "content": "new\n"}, "b0-new")
    assert again["ok"] and again["version"] == 3  # a cold write commits after what was there


async def test_results_past_the_memory_budget_come_from_the_projection(
    writer: Writer, nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (results, lifecycle):  # what the actor keeps, what a load reads
        monkeypatch.setattr(module, "WRITER_RECENT_RESULTS", 3)
    created = await cmd(nc, "long", "create", {}, "long-create")
    assert created["ok"]
    replies = [
        await cmd(nc, "long", "write", {"path": "f", "content": f"{i}\n"}, f"long-{i}")
        for i in range(10)
    ]
    assert len(writer.actors.get("acme", "long").results.recent) <= 3
    # held (warm), then dropped and loaded again (cold): the oldest request ids still get
    # their first replies (a write decided again would commit version 12, or answer 11)
    for _ in range(2):
        assert await cmd(nc, "long", "create", {}, "long-create") == created
        for i, reply in enumerate(replies):
            body = {"path": "f", "content": "x\n"}
            assert await cmd(nc, "long", "write", body, f"long-{i}") == reply
        writer.actors._held.pop(("acme", "long"))  # as if evicted: the next command loads it
    last = await cmd(nc, "long", "write", {"path": "f", "content": "last\n"}, "long-last")
    assert last["version"] == 12


class Busy:
    """A held workspace as eviction sees it."""

    def __init__(self, idle: bool) -> None:
        self.idle = idle


async def test_eviction_drops_the_oldest_idle_never_a_busy_one(writer: Writer) -> None:
    actors: Any = writer.actors._held
    real = dict(actors)
    actors.clear()
    try:
        for i in range(BUDGET):  # oldest first: idle, busy, idle, busy
            actors[("acme", f"held{i}")] = Busy(idle=i % 2 == 0)
        writer.actors.get("acme", "new1")
        assert list(actors) == [("acme", f"held{i}") for i in (1, 2, 3)] + [("acme", "new1")]
        writer.actors.get("acme", "new2")  # held1 is busy: held2 goes
        assert list(actors)[:2] == [("acme", "held1"), ("acme", "held3")]
        for i in range(3):
            writer.actors.get("acme", f"more{i}")
        assert len(actors) == BUDGET
        assert [k for k, a in actors.items() if isinstance(a, Busy)] == [
            ("acme", "held1"),
            ("acme", "held3"),
        ]
        for key in list(actors):
            actors[key] = Busy(idle=False)
        writer.actors.get("acme", "over")  # all busy: over the budget rather than drop one
        assert len(actors) == BUDGET + 1 and ("acme", "over") in actors
    finally:
        actors.clear()
        actors.update(real)
