"""The workspace listing's pages (issue 17): the files and bytes it shows (kept in the
reader's rows, not counted per page) are what ``info`` counts, through writes, deletes,
moves, purges and compactions; hostile paging arguments get a clear answer."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client as NATS

from contracts.limits import LimitsPatch
from quill.client import Quill
from tests.conftest import StartReader
from tests.integration.test_compaction import KEEP, WRITES, compacted
from tests.integration.test_listing_scale import build, call, caught_up

TENANT = "pages"


@pytest.mark.parametrize(
    "body",
    [
        {"limit": 0},
        {"limit": 1001},
        {"limit": "10"},
        {"after": "a" * 65},
        {"after": 5},
        {"prefix": "p" * 65},
    ],
)
async def test_bad_paging_arguments_are_refused(
    services: StartReader, nc: NATS, body: dict[str, Any]
) -> None:
    await services("r1")
    reply = await call(nc, f"ws.qry.{TENANT}._.workspaces", body)
    assert not reply["ok"] and reply["error"]["code"] == "INVALID_ARGUMENT"


async def test_a_cursor_that_names_no_workspace_pages_from_where_it_sorts(
    services: StartReader, nc: NATS
) -> None:
    reader = await services("r1")
    await build(nc, ["a", "b", "c"], clients=1, tenant="cursor")
    await caught_up(reader, ["a", "b", "c"], tenant="cursor")
    for after, wanted in (("", ["a", "b", "c"]), ("aa", ["b", "c"]), ("\u00ff\U0010ffff", [])):
        page = await call(nc, "ws.qry.cursor._.workspaces", {"after": after})
        assert [w["workspace"] for w in page["result"]["workspaces"]] == wanted
    other = await call(nc, "ws.qry.another._.workspaces", {})
    assert other["result"]["workspaces"] == []  # another tenant's are not listed


async def test_the_listed_totals_are_what_info_counts(services: StartReader, quill: Quill) -> None:
    reader = await services("r1")
    ws = quill.workspace("totals/totals")
    await ws.create()
    await ws.write("a.txt", "hello\n")
    await ws.write("d/b.txt", "bye\n")
    await ws.write("d/e/c.txt", "x" * 1000)
    await ws.write("a.txt", "longer than before\n")  # a new revision of the same file
    await ws.move("d/b.txt", "moved.txt")
    await ws.mkdir("empty")
    await ws.delete("d", recursive=True)
    other = quill.workspace("totals/gone")
    await other.create()
    await other.write("f", "content\n")
    await other.purge()
    again = quill.workspace("totals/gone")
    await again.create()
    await again.write("g", "new\n")
    trimmed = quill.workspace("totals/trimmed")  # its history compacted: the reader replaces it
    await trimmed.create(limits=LimitsPatch(max_versions=KEEP))
    await trimmed.write("kept.txt", "kept\n")
    event = await compacted(trimmed, WRITES)
    await trimmed.info(version=event.version)  # the reader has it
    for w in (ws, again, trimmed):
        assert await reader.follower.wait_for("totals", w.name, w.last_version, 10)
    listed = {w.workspace: w for w in (await quill.workspaces("totals")).workspaces}
    for w in (ws, again, trimmed):
        info = await w.info()
        assert (listed[w.name].files, listed[w.name].total_bytes) == (
            info.files,
            info.total_bytes,
        )
    assert (listed["totals"].files, listed["totals"].total_bytes) == (2, 19 + 4)
    assert (listed["gone"].files, listed["gone"].total_bytes) == (1, 4)
    assert listed["trimmed"].files == 2
