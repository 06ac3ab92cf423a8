"""Issue 30: ``qry.history`` follows a file across its moves. An agent that moves a file back
and forth (``a → b → a → ...``, 400 times) must not make a followed history loop, nor read
the chain whole: a page is at most ``limit`` steps, one seek each (the walk goes strictly
down the versions), whatever the chain. A real writer and reader on a real nats-server, the
SDK; the reader's seeks counted."""

from __future__ import annotations

from typing import Any

import pytest

from quill.client import Quill
from services.reader.readmodel import ReadModel
from tests.helpers import new_workspace
from tests.integration.conftest import StartReader

MOVES = 400
BATCH = 16
"""Rows one seek of the walk reads at most (``services.reader.history.FIRST_BATCH``)."""


async def test_a_move_cycle_is_walked_a_page_at_a_time(
    services: StartReader, quill: Quill, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = await new_workspace(services, quill, "acme/cycles")
    await ws.write("a", "x\n")
    names = ("a", "b")
    for n in range(MOVES):  # a → b → a ...: each move its own event
        await ws.move(names[n % 2], names[(n + 1) % 2])
    last = names[MOVES % 2]
    seeks: list[int] = []
    real = ReadModel.path_history

    async def counted(self: ReadModel, ws_id: int, path: str, upto: int, limit: int) -> list[Any]:
        rows = await real(self, ws_id, path, upto, limit)
        seeks.append(len(rows))
        return rows

    monkeypatch.setattr(ReadModel, "path_history", counted)
    page = await ws.history(last, limit=50, follow=True)
    assert len(page.revisions) == 50 and page.truncated
    assert [r.change for r in page.revisions] == ["moved"] * 50
    assert page.next_path in names
    assert len(seeks) == 50  # one seek a move shown
    assert sum(seeks) <= 50 * BATCH  # each a batch at most
    # The whole chain, page by page, ends at the file's creation.
    seen, before, path = 0, None, last
    while True:
        page = await ws.history(path, limit=1000, before=before, follow=True)
        seen += len(page.revisions)
        if not page.truncated:
            break
        path, before = page.next_path or path, page.revisions[-1].version
    assert seen == MOVES + 1 and page.revisions[-1].change == "created"
