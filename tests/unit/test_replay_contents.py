"""``quill_cli.tools.replay.Contents``: inline contents a replay keeps, in memory up to its
budget (bookkeeping counted), the rest in a temporary SQLite file that ``close`` removes."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from contracts.events import PutFile
from quill_cli.tools.replay import Contents


def put(n: int) -> PutFile:
    text = f"content {n}\n" * (1 + n % 3)
    sha = hashlib.sha256(text.encode()).hexdigest()
    return PutFile(
        path=f"f{n}", sha256=sha, size=len(text), file_version=1, created=datetime.now(UTC),
        text=text if n % 2 else None, data=None if n % 2 else text.encode(),
    )  # fmt: skip


def test_contents_past_the_budget_go_to_disk_and_come_back() -> None:
    contents = Contents(budget=10 * Contents.ENTRY_COST)
    puts = [put(n) for n in range(2_000)]
    for item in puts:
        contents.add(item)
        contents.add(item)  # named again: kept once
    assert len(contents._mem) < 10 and contents._spill is not None
    spill = contents._spill
    for item in puts:
        data = contents.get(item.sha256)
        assert data is not None and hashlib.sha256(data).hexdigest() == item.sha256
    assert contents.get("0" * 64) is None
    contents.close()
    assert not spill.exists()


def test_a_content_without_inline_bytes_is_not_kept() -> None:
    contents = Contents()
    item = PutFile(
        path="a", sha256="1" * 64, size=5, file_version=1, created=datetime.now(UTC), blob=True
    )
    contents.add(item)
    assert contents.get("1" * 64) is None
    contents.close()
