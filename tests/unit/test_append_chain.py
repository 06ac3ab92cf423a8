"""Chained groups (``Group.after``, issue 29): a workspace's group decided while its previous
group is in flight goes only once that one is acknowledged, with that one's last sequence as
its expected one (the workspace's CAS, chained), and never if that one fails."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from services.writer.append import AppendError, Group
from tests.unit.appending import FakeAppend


class Log(FakeAppend):
    """An appender whose sends wait for ``release`` and record what they carried; the first
    send fails (refused) when ``refuse``."""

    def __init__(self) -> None:
        super().__init__(seq=100)
        self.sent: list[tuple[str, int, int]] = []
        """(subject, expected sequence, events) of each group sent."""
        self.refuse = False

    async def send(self, groups: list[Group]) -> list[list[int]]:
        self.entered.set()
        await self.release.wait()
        if self.refuse:
            self.refuse = False
            raise AppendError("refused", uncertain=False, code=10071)
        self.sent += [(g.subject, g.expected_seq, len(g.payloads)) for g in groups]
        return await super().send(groups)


def group(n: int, after: Group | None = None, expected: int = 0) -> Group:
    return Group("ws.evt.t.w", expected, [b"{}"] * n, ["id"] * n, ["h"] * n, after=after)


@pytest_asyncio.fixture
async def log() -> AsyncIterator[Log]:
    async with Log().running() as f:
        yield f


async def test_a_chained_group_goes_after_the_first_with_its_last_sequence(log: Log) -> None:
    first = group(2, expected=7)
    second = group(3, after=first)
    log.appender.submit(first)
    log.appender.submit(second)
    await asyncio.wait_for(log.entered.wait(), 10)  # the first is being sent, alone
    assert log.appender._queue == [second] and second.expected_seq == 0
    log.release.set()
    assert await asyncio.wait_for(second.future, 10) == [103, 104, 105]
    assert log.sent == [("ws.evt.t.w", 7, 2), ("ws.evt.t.w", 102, 3)]
    assert log.appender.chained == 1


async def test_a_chained_group_is_never_sent_when_the_first_fails(log: Log) -> None:
    log.refuse = True
    first = group(1, expected=7)
    second = group(1, after=first)
    third = group(1, after=second)
    for g in (first, second, third):
        log.appender.submit(g)
    log.release.set()
    for g in (first, second, third):
        with pytest.raises(AppendError) as failed:
            await asyncio.wait_for(g.future, 10)
        assert not failed.value.uncertain  # not sent: certainly not in the log
    assert log.sent == [] and log.appender._queue == []
