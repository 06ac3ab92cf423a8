"""``qry.history`` with ``follow``: a file's history across its moves (git's ``log --follow``),
against a real nats-server, writer and reader, through the SDK."""

from __future__ import annotations

import pytest

from contracts import replies as rp
from quill.client import Quill
from services.reader import history
from tests.helpers import new_workspace
from tests.integration.conftest import StartReader


def seen(page: rp.HistoryPage) -> list[tuple[int, str, str | None, str | None]]:
    return [(r.version, r.change, r.path, r.moved_from) for r in page.revisions]


async def test_history_follows_a_move(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/follow")  # v1
    await ws.write("b.txt", "an older b\n")  # v2: another file, once named b.txt
    await ws.delete("b.txt")  # v3
    await ws.write("a.txt", "one\n")  # v4
    await ws.write("a.txt", "two\n")  # v5
    await ws.move("a.txt", "b.txt")  # v6
    await ws.write("b.txt", "three\n")  # v7
    followed = await ws.history("b.txt", follow=True)
    assert seen(followed) == [
        (7, "modified", None, None),
        (6, "moved", None, "a.txt"),
        (5, "modified", "a.txt", None),
        (4, "created", "a.txt", None),
    ]
    assert not followed.truncated and followed.next_path is None
    # Without follow, as before: b.txt's own rows, the older file's included.
    plain = await ws.history("b.txt")
    assert [(r.version, r.change) for r in plain.revisions] == [
        (7, "modified"),
        (6, "moved"),
        (3, "deleted"),
        (2, "created"),
    ]
    assert all(r.path is None for r in plain.revisions)


async def test_a_page_goes_on_under_the_earlier_name(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/pages")
    for n in range(3):
        await ws.write("a.txt", f"{n}\n")  # v2, v3, v4
    await ws.move("a.txt", "b.txt")  # v5
    first = await ws.history("b.txt", limit=2, follow=True)
    assert seen(first) == [(5, "moved", None, "a.txt"), (4, "modified", "a.txt", None)]
    assert first.truncated and first.next_path == "a.txt"
    rest = await ws.history(first.next_path, limit=2, before=4, follow=True)
    assert [(r.version, r.change) for r in rest.revisions] == [(3, "modified"), (2, "created")]
    # A page that ends on the move itself goes on under the earlier name.
    one = await ws.history("b.txt", limit=1, follow=True)
    assert seen(one) == [(5, "moved", None, "a.txt")] and one.next_path == "a.txt"


async def test_a_move_cycle_ends(services: StartReader, quill: Quill) -> None:
    """a → b → a → b: the walk goes down the versions, through each name once a move."""
    ws = await new_workspace(services, quill, "acme/cycle")
    await ws.write("a", "x\n")  # v2
    for there, here in (("a", "b"), ("b", "a"), ("a", "b")):  # v3, v4, v5
        await ws.move(there, here)
    page = await ws.history("b", follow=True)
    assert seen(page) == [
        (5, "moved", None, "a"),
        (4, "moved", "a", "b"),
        (3, "moved", None, "a"),  # b again: the asked name, said as such
        (2, "created", "a", None),
    ]
    assert not page.truncated


async def test_a_long_chain_is_read_a_page_at_a_time(
    services: StartReader, quill: Quill, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 moves, a page of 10: ten seeks (one a move), never the chain."""
    ws = await new_workspace(services, quill, "acme/chain")
    await ws.write("f0", "x\n")
    for n in range(100):
        await ws.move(f"f{n}", f"f{n + 1}")
    calls: list[str] = []
    real = history.step

    async def counted(
        model: history.Reads, ws_id: int, path: str, upto: int, want: int
    ) -> history.Step:
        calls.append(path)
        return await real(model, ws_id, path, upto, want)

    monkeypatch.setattr(history, "step", counted)
    page = await ws.history("f100", limit=10, follow=True)
    assert [r.path for r in page.revisions] == [None, *[f"f{n}" for n in range(99, 90, -1)]]
    assert page.truncated and page.next_path == "f90"
    assert calls == ["f100", *[f"f{n}" for n in range(99, 90, -1)]]
