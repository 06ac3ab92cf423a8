"""A fork's pages against its whole layered tree (issue 33): random writes, deletes, mkdirs and
moves on a source, a fork of it and a fork of the fork (deletes of inherited paths leave
whiteouts), through a real writer and reader on a real nats-server (the SDK).

A fork's listing, glob and grep merge its layers' index ranges and stop at their page
(``infra/store/merged.py``). Here, at each workspace's newest version and at an older one,
their answers are those computed from the whole layered tree (``Store.entries_at``: each
layer's entries, less what a nearer layer decides; itself checked against the fold by
test_fork_property.py): the children of each directory page by page (two a page), each
directory's subtree page by page (three a page), each page's ``total`` and a count of the
files below each directory, ``info``'s totals (files, directories, bytes), a glob of
everything (all of it, and the newest two), a glob under each directory, a grep of every file
and a grep of one content (the trigram index's candidates).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from core.rows import Node
from quill.client import Workspace
from quill_cli.natsserver import NatsServer
from services.reader.app import Reader
from tests.helpers import eventually
from tests.integration.forking import TENANT, play, served
from tests.integration.real_writer import REAL_WRITER

PATHS = ["a", "b", "d/x", "d/y", "d/w", "d/e/z", "d/e/q", "e/z", "e/f/g"]
WHERE = st.sampled_from(["src", "src", "one", "two"])
OPS = st.one_of(
    st.tuples(st.just("write"), WHERE, st.sampled_from(PATHS), st.sampled_from("xyz")),
    st.tuples(st.just("delete"), WHERE, st.sampled_from([*PATHS, "d", "e", "d/e"])),
    st.tuples(st.just("mkdir"), WHERE, st.sampled_from(["d", "e/f", "k"])),
    st.tuples(st.just("move"), WHERE, st.sampled_from(["d", "e", *PATHS]), st.sampled_from(PATHS)),
)
_names = iter(range(1_000_000))


def newest_first(n: Any) -> tuple[float, str]:
    return (-n.modified.timestamp(), n.path)


async def listed(ws: Workspace, path: str, version: int, recursive: bool) -> list[str]:
    """Every entry of a listing, page after page (small pages), each page's ``total`` (a
    count as of ``version``: a fork's, its source's as of the fork point moved by what it
    changed) checked against them all."""
    out: list[str] = []
    totals: list[int] = []
    after: str | None = None
    while True:
        page = await ws.list(
            path or ".", recursive=recursive, after=after, limit=3 if recursive else 2,
            version=version,
        )  # fmt: skip
        out += [e.path for e in page.entries]
        totals.append(page.total)
        if page.next is None:
            assert set(totals) == {len(out)}, (ws.name, version, path, recursive, totals)
            return out
        after = page.next


async def check(ws: Workspace, reader: Reader, version: int) -> None:
    """``ws``'s pages as of ``version`` against its whole tree then."""
    ws_id = reader.store.workspace_id(ws.tenant, ws.name)
    assert ws_id is not None
    tree: list[Node] = await reader.store.entries_at(ws_id, version)
    nodes = [n for n in tree if n.path]
    dirs = [""] + [n.path for n in nodes if n.kind == "d"]
    where = f"{ws.name}@{version}"
    info = await ws.info(version=version)
    files = [n for n in tree if n.kind == "f"]
    totals = (len(files), len([n for n in tree if n.kind == "d"]), sum(n.size for n in files))
    assert (info.files, info.directories, info.total_bytes) == totals, where
    for d in dirs:
        below = [n for n in nodes if n.path.startswith(f"{d}/" if d else "")]
        children = [n for n in below if n.path.rpartition("/")[0] == d]
        want = [n.path for n in sorted(children, key=lambda n: (n.kind == "f", n.path))]
        assert await listed(ws, d, version, False) == want, (where, d)
        assert await listed(ws, d, version, True) == [n.path for n in below], (where, d)
        of_files = await ws.list(d or ".", recursive=True, kind="file", limit=1, version=version)
        assert of_files.total == len([n for n in below if n.kind == "f"]), (where, d)
        found = await ws.glob("*", d or ".", max_results=1000, exclude=[], version=version)
        assert sorted(e.path for e in found.entries) == sorted(n.path for n in children)
    everything = sorted(nodes, key=newest_first)
    found = await ws.glob("**", max_results=1000, exclude=[], version=version)
    assert [e.path for e in found.entries] == [n.path for n in everything], where
    assert found.total == len(everything) and found.total_exact, where
    found = await ws.glob("**", max_results=2, exclude=[], version=version)
    assert [e.path for e in found.entries] == [n.path for n in everything[:2]], where
    assert found.total == len(everything), where
    files = [n for n in nodes if n.kind == "f"]
    grepped = await ws.grep("[a-z]", max_results=1000, exclude=[], version=version)
    assert sorted({m.path for m in grepped.matches}) == [n.path for n in files], where
    for one in files[:1]:
        text = (await ws.read(one.path, version=version)).content.strip()
        grepped = await ws.grep(text, literal=True, exclude=[], version=version)
        holding = [n.path for n in files if n.sha256 == one.sha256]
        assert sorted({m.path for m in grepped.matches}) == holding, (where, text)


async def run(url: str, data: Path, script: list[tuple[Any, ...]]) -> None:
    async with served(url, data, f"g{next(_names)}") as (names, reader, quill):
        first: dict[str, int] = {}

        async def noted(where: str, w: Workspace) -> None:
            first.setdefault(where, (await w.info()).version)

        ws, made = await play(quill, names, script, lambda t, n: f"{t}{n:03}\n", noted)
        for k in made:
            newest = (await ws[k].info()).version

            async def caught_up(k: str = k, newest: int = newest) -> bool:
                return reader.store.version_of(TENANT, names[k]) >= newest

            await eventually(caught_up, what=f"{k} read")
            for version in sorted({first[k], newest}):
                await check(ws[k], reader, version)


@REAL_WRITER
@given(script=st.lists(OPS, min_size=6, max_size=24))
@example(
    script=[("write", "src", "d/x", "x"), ("write", "src", "d/e/z", "z"),
            ("write", "one", "d/y", "y"), ("delete", "one", "d"), ("write", "src", "d/w", "w"),
            ("write", "one", "d/e/q", "x"), ("move", "two", "a", "b"),
            ("write", "two", "e/f/g", "y"), ("delete", "two", "e"), ("write", "src", "e/z", "y"),
            ("delete", "src", "d/x"), ("write", "two", "d/x", "z")],
)  # fmt: skip
def test_a_forks_pages_are_its_whole_trees(
    nats_server: NatsServer, tmp_path: Path, script: list[tuple[Any, ...]]
) -> None:
    asyncio.run(run(nats_server.url, tmp_path / f"d{next(_names)}", script))
