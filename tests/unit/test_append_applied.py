"""Waiting on the writer's projection (``Appender.applied``, issue 17): a workspace loaded
cold waits for its own commits alone, and whoever waits cuts the applier's linger short
(before, every cold load waited ~50 ms for the linger, whatever it had committed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from services.writer import append
from services.writer.append import Group
from tests.unit.appending import FakeAppend


class Fake(FakeAppend):
    """An appender whose log acknowledges at once, and whose projection update waits for
    ``release`` (``entered`` is set when one starts)."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: list[str] = []

    async def on_commit(self, batch: list[tuple[Group, list[int]]]) -> None:
        self.entered.set()
        await self.release.wait()
        self.applied += [g.subject for g, _ in batch]

    async def commit(self, subject: str) -> None:
        await self.appender.submit(Group(subject, 0, [b"{}"], ["id"], ["h"]))


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[Fake]:
    async with Fake().running() as f:
        yield f


async def test_a_workspace_waits_for_its_own_commits_alone(fake: Fake) -> None:
    await fake.commit("ws.evt.t.busy")
    await asyncio.wait_for(fake.entered.wait(), 10)  # its projection update is under way
    await asyncio.wait_for(fake.appender.applied("ws.evt.t.cold"), 10)  # nothing of its own
    waiting = asyncio.create_task(fake.appender.applied("ws.evt.t.busy"))
    everything = asyncio.create_task(fake.appender.applied())
    await asyncio.sleep(0)
    assert not waiting.done() and not everything.done()
    fake.release.set()
    await asyncio.wait_for(asyncio.gather(waiting, everything), 10)
    assert fake.applied == ["ws.evt.t.busy"]
    assert not fake.appender._unapplied  # nothing kept for subjects applied


@pytest.mark.parametrize("subject", ["ws.evt.t.w", None])
async def test_a_waiter_does_not_wait_for_the_linger(
    fake: Fake, subject: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(append, "APPLY_LINGER_S", 3600.0)
    fake.release.set()
    await fake.commit("ws.evt.t.w")
    await asyncio.wait_for(fake.appender.applied(subject), 10)  # not an hour
    assert fake.applied == ["ws.evt.t.w"]
