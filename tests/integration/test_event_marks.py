"""What the ``events`` query says each change did, as git marks it (the console's timeline
shows A, M, R, D from it), and the message an event carries (a command's commit line)."""

from __future__ import annotations

from contracts.requests import PutChange
from quill.client import Quill
from tests.helpers import new_workspace
from tests.integration.conftest import StartReader


async def test_each_change_says_what_it_did(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/marks")
    await ws.write("a.txt", "one\n")  # v2: added
    await ws.write("a.txt", "two\n")  # v3: modified
    await ws.mkdir("d")  # v4: a directory added
    await ws.move("a.txt", "d/b.txt")  # v5: moved here, and a.txt gone
    await ws.delete("d", recursive=True)  # v6
    await ws.apply([PutChange(path="c.txt", content="x\n")], message="$ make c")  # v7
    page = await ws.events(after=1, limit=10)
    marks = {e.version: sorted((c.kind, c.path, c.change) for c in e.changes) for e in page.events}
    assert marks[2] == [("put", "a.txt", "added")]
    assert marks[3] == [("put", "a.txt", "modified")]
    assert marks[4] == [("mkdir", "d", "added")]
    assert marks[5] == [("delete", "a.txt", "deleted"), ("put", "d/b.txt", "moved")]
    assert ("delete", "d", "deleted") in marks[6]
    assert marks[7] == [("put", "c.txt", "added")]
    messages = {e.version: e.message for e in page.events}
    assert messages[7] == "$ make c" and messages[2] is None
