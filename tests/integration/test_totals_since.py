"""A workspace's totals as of an older version (``info``'s files, directories and bytes) are
its live totals less what the events since made plus the rows ended since
(``infra.sql.TOTALS_SINCE``): they cost what changed since that version, not the tree
(``tests/integration/test_rows_touched.py`` counts it). Here: they are what a plain walk of
the tree at that version counts, at every version, through every kind of change, after a
compaction (its manifest carries the events' counts), and for events whose counts are
unknown (a compaction manifest made before they were kept: the old count of every live row).
"""

from __future__ import annotations

import sqlite3

from contracts.limits import LimitsPatch
from quill.client import Quill, Workspace
from services.reader.app import Reader
from tests.conftest import StartReader
from tests.integration.test_compaction import KEEP, WRITES, compacted
from tests.integration.test_forks import walked


async def changed_every_way(ws: Workspace) -> None:
    await ws.write("a.txt", "a1\n")
    await ws.write("d/b.txt", "b1\n")  # a file and its directory
    await ws.write("d/e/c.txt", "c" * 500)
    await ws.write("a.txt", "a longer second revision\n")  # a change of size
    await ws.mkdir("empty/deeper")
    await ws.move("d/b.txt", "moved.txt")
    await ws.move("d/e", "e2")  # a directory with a file: rows ended and made below it
    await ws.delete("d", recursive=True)
    await ws.write("d/b.txt", "back again\n")  # a re-add after the delete
    await ws.delete("a.txt")
    await ws.write("x.bin", b"\x00\x01" * 300)


async def totals_are_walks(reader: Reader, ws: Workspace, first: int) -> None:
    assert await reader.follower.wait_for(ws.tenant, ws.name, ws.last_version, 10)
    for version in range(first, ws.last_version + 1):
        files, dirs, size, _ = await walked(ws, version)
        info = await ws.info(version=version)
        got = (info.files, info.directories, info.total_bytes)
        assert got == (files, dirs, size), f"{ws.name}@{version}: {got}"


async def test_totals_at_every_version_are_the_walks(services: StartReader, quill: Quill) -> None:
    reader = await services("r1")
    ws = quill.workspace("since/every")
    await ws.create()
    await changed_every_way(ws)
    await totals_are_walks(reader, ws, 1)


async def test_totals_after_a_compaction_are_the_walks(services: StartReader, quill: Quill) -> None:
    """A compaction replaces the workspace's rows in the reader by its manifest's: the kept
    events carry their counts, so the versions it keeps are counted as before."""
    reader = await services("r1")
    ws = quill.workspace("since/trimmed")
    await ws.create(limits=LimitsPatch(max_versions=KEEP))
    await changed_every_way(ws)
    event = await compacted(ws, WRITES)
    await ws.write("after.txt", "after the compaction\n")
    await totals_are_walks(reader, ws, event.floor)
    with sqlite3.connect(reader.store.path) as db:
        unknown = db.execute(
            "SELECT count(*) FROM events e JOIN workspaces w ON w.id = e.ws "
            "WHERE w.name = 'trimmed' AND e.born_files IS NULL"
        ).fetchone()[0]
    assert unknown == 0


async def test_events_with_unknown_counts_are_counted_the_old_way(
    services: StartReader, quill: Quill
) -> None:
    """Events without counts (a manifest made before they were kept leaves them NULL) send
    the totals to a count of the rows valid at the version: the same answer."""
    reader = await services("r1")
    ws = quill.workspace("since/unknown")
    await ws.create()
    await changed_every_way(ws)
    assert await reader.follower.wait_for(ws.tenant, ws.name, ws.last_version, 10)
    with sqlite3.connect(reader.store.path) as db:
        forgotten = db.execute(
            "UPDATE events SET born_files = NULL, born_dirs = NULL, born_bytes = NULL "
            "WHERE ws = (SELECT id FROM workspaces WHERE name = 'unknown') AND version % 2 = 0"
        ).rowcount
    assert forgotten > 3
    await totals_are_walks(reader, ws, 1)
