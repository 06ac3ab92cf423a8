"""An ``Appender`` with no JetStream behind it, for the unit tests of its pipeline
(``test_append_applied``, ``test_append_chain``): every group sent is acknowledged with the
stream's next sequences (after ``seq``); what a test holds waits for ``release``, and
``running`` (a fixture's body) sets it at the end before it stops the appender."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Self

from services.writer.append import Appender, Group


class FakeAppend:
    def __init__(self, seq: int = 0) -> None:
        self.seq = seq
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        """Set by a subclass when what it holds has begun."""
        self.appender = Appender(None)  # type: ignore[arg-type]
        self.appender._send = self.send  # type: ignore[method-assign]

    async def send(self, groups: list[Group]) -> list[list[int]]:
        """Each group's sequences, as the stream gives them."""
        out = []
        for g in groups:
            out.append(list(range(self.seq + 1, self.seq + 1 + len(g.payloads))))
            self.seq += len(g.payloads)
        return out

    async def on_commit(self, batch: list[tuple[Group, list[int]]]) -> None:
        """What committed goes nowhere (no projection here)."""

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Self]:
        self.appender.start(self.on_commit)
        try:
            yield self
        finally:
            self.release.set()
            await self.appender.stop()
