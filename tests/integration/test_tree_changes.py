"""``qry.tree`` with ``changed_from`` (issue 33, item 3: what an executor takes from a reader
when it links the rest of a fork's first checkout from its source's, ``infra.exec.builds``):
the paths changed between two versions, either order, and the entries at and below them as
of the version asked, checked against the whole trees at both versions; through a fork's
layers; paged; and "cannot tell" beyond the cap. A real nats-server, writer, reader, the SDK.
"""

from __future__ import annotations

import itertools

import pytest

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from contracts.limits import TREE_CHANGED_MOST
from contracts.paths import ancestors
from contracts.requests import LimitsPatch, PutChange
from quill.client import Quill, Workspace
from tests.conftest import StartReader
from tests.helpers import tree_items
from tests.integration.test_forks import seeded, wait

Entry = tuple[str, str, str | None, bool]


def entry(item: rp.TreeItem) -> Entry:
    return (item.path, item.kind, item.sha256, item.executable)


async def whole(ws: Workspace, version: int) -> dict[str, Entry]:
    """Every entry of the tree as of ``version``, by path."""
    return {item.path: entry(item) async for item, _ in tree_items(ws, version)}


async def changed(ws: Workspace, version: int, since: int) -> tuple[list[str], list[Entry]]:
    """``qry.tree`` of what changed, every page (2 entries a page)."""
    first = await ws.tree(version=version, changed_from=since, limit=2, contents=False)
    assert first.changed is not None and first.head is not None
    assert first.head.version == version
    entries, page = [], first
    while True:
        assert page.changed is None or page is first
        entries += [entry(item) for item in page.entries]
        if page.next is None:
            return first.changed, entries
        page = await ws.tree(
            version=version, changed_from=since, after=page.next, limit=2, contents=False
        )


def under(path: str, paths: set[str]) -> bool:
    return path in paths or any(a in paths for a in ancestors(path))


async def check(ws: Workspace, versions: list[int]) -> None:
    """For each pair: every path whose entry differs is named, and the entries are the whole
    tree's at and below what is named."""
    trees = {v: await whole(ws, v) for v in versions}
    for a, b in itertools.product(versions, versions):
        named, entries = await changed(ws, a, b)
        assert named == sorted(set(named)), named
        differ = {
            p for p in trees[a].keys() | trees[b].keys() if trees[a].get(p) != trees[b].get(p)
        }
        assert all(under(p, set(named)) for p in differ), (a, b, named, differ)
        want = [e for p, e in sorted(trees[a].items()) if under(p, set(named))]
        assert entries == want, (a, b, named)
        if a == b:
            assert named == [] and entries == []


async def test_the_tree_of_what_changed_between_two_versions(
    services: StartReader, quill: Quill
) -> None:
    reader = await services("r1")
    src = await seeded(quill, "tc/src")  # writes, a directory deleted, a file made and deleted
    await src.apply([PutChange(path="d/b.txt", content="b1\n", executable=True)])  # v10: mode
    await wait(reader, src)
    named, entries = await changed(src, 4, 10)
    assert named == ["a.txt", "big.txt", "d/b.txt", "d/e", "d/e/c.txt", "gone.txt"], named
    assert [e[0] for e in entries] == ["a.txt", "d/b.txt", "d/e", "d/e/c.txt"]
    await check(src, list(range(2, 11)))

    # a fork: what changed through its layers, either side of the fork point
    await quill.fork("tc/src", "fork", version=6)
    fork = quill.workspace("tc/fork")
    await fork.delete("d", recursive=True)  # v7: a whiteout of an inherited directory
    await fork.write("d", "now a file\n")  # v8
    await fork.write("a.txt", "fork\n")  # v9
    await wait(reader, fork)
    await check(fork, [3, 5, 6, 7, 8, 9])

    with pytest.raises(QuillError) as refused:
        await src.tree(version=4, changed_from=src.last_version + 5)
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT


async def test_beyond_the_cap_the_reader_says_it_cannot_tell(
    services: StartReader, quill: Quill
) -> None:
    reader = await services("r1")
    ws = quill.workspace("tc/many")
    await ws.create(limits=LimitsPatch(max_files=3 * TREE_CHANGED_MOST))
    await ws.write("one.txt", "1\n")
    before = ws.last_version
    count = TREE_CHANGED_MOST + 1
    await ws.apply([PutChange(path=f"m/f{n}.txt", content=f"{n}\n") for n in range(count)])
    await wait(reader, ws)
    page = await ws.tree(version=before, changed_from=ws.last_version)
    assert page.changed is None and page.entries == [] and page.head is not None
    fewer = await ws.tree(version=before, changed_from=before - 1)  # one path: told
    assert fewer.changed == ["one.txt"] and [e.path for e in fewer.entries] == ["one.txt"]
