"""glob and explore answer as they did when they read the whole tree (issue 29).

A glob now walks only what it needs: the subtree its pattern names before the first wildcard,
or (a pattern of the whole workspace, at its newest version) the live entries newest first
until it has what it returns; explore and the subtree walks skip an excluded directory's range.
Each answer here is checked against the one computed the old way, from every entry of the
tree (``Store.entries_at``) through the same pure functions: the same entries in the same
order, the same ``total`` where it is exact, and a lower bound flagged where it is not.
"""

from __future__ import annotations

import itertools

from contracts import replies as rp
from contracts import requests as rq
from core.finding import exclusions, explore_result, glob_matcher, glob_result, without_excluded
from quill.client import Quill, Workspace
from services.reader.app import Reader
from services.reader.search import GLOB_COUNTED
from tests.integration.conftest import StartReader

MANY = 1_200
"""Files of one event (one ``modified``: ties broken by path), past ``GLOB_COUNTED``."""


async def tree(quill: Quill, name: str) -> tuple[Workspace, int]:
    """A tree with excluded directories at several depths, siblings that sort inside their
    ranges (``node_modules-x``, ``node_modules0``), files written at different versions, and
    one event of ``MANY`` files; and the version before its last few changes."""
    ws = quill.workspace(f"acme/{name}")
    await ws.create()
    await ws.apply(
        [rq.PutChange(path=f"gen/d{n % 40:02}/f{n:04}.py", content=f"g {n}\n") for n in range(MANY)]
    )
    await ws.apply(
        [
            rq.PutChange(path=p, content=f"{p}\n")
            for p in (
                "src/a.py",
                "src/a/b.py",
                "src/a/node_modules/m.py",
                "src/node_modules/x/y.py",
                "src/node_modules-x/z.py",
                "src/node_modules0/w.py",
                "src/__pycache__/c.pyc",
                "lib/deep/e/f/g.txt",
                "lib/build/out.txt",
                "node_modules/dep/index.py",
                "node_modules-x/keep.py",
                "README.md",
            )
        ]
    )
    older = (await ws.info()).version
    for p in ("src/a/b.py", "lib/deep/e/f/g.txt", "gen/d03/f0003.py", "new.py"):
        await ws.write(p, f"{p} again\n")
    await ws.delete("src/node_modules0", recursive=True)
    return ws, older


async def reference_glob(
    reader: Reader, ws: Workspace, version: int, req: rq.GlobQuery
) -> rp.Matches:
    """The answer as computed before issue 29: every entry below the path, then the pure
    functions."""
    row = reader.store.workspace(ws.tenant, ws.name)
    assert row is not None
    scope = req.path
    nodes = await reader.store.entries_at(row.id, version, scope)
    kept = without_excluded(nodes, scope, exclusions(req.exclude))
    return glob_result(scope, req, glob_matcher(req.pattern), kept, row.limits)


PATTERNS = (
    "**",
    "**/*.py",
    "*",
    "*.md",
    "src/**",
    "src/*.py",
    "src/a/*.py",
    "src/a",
    "src/node_modules/**",
    "node_modules-x/*",
    "src/**/*.py",
    "{src,lib}/*.py",
    "lib/deep/**/*.txt",
    "gen/d07/*.py",
    "missing/*.py",
    "src/a.py/*",
)


async def test_glob_answers_as_the_whole_tree_did(services: StartReader, quill: Quill) -> None:
    reader = await services("r1")
    ws, older = await tree(quill, "globs")
    newest = (await ws.info()).version
    stopped = 0
    cases = itertools.product(
        PATTERNS,
        (None, [], ["**/a/**", "*.md"]),
        ("", "src"),
        (("any", 100), ("file", 5), ("directory", 1)),
        (newest, older),
    )
    for pattern, exclude, path, (kind, most), version in cases:
        req = rq.GlobQuery(pattern=pattern, path=path, kind=kind, max_results=most, exclude=exclude)
        got = await ws.glob(
            pattern, path, kind=kind, max_results=most, exclude=exclude, version=version
        )
        want = await reference_glob(reader, ws, version, req)
        case = (pattern, exclude, path, kind, most, version)
        assert got.entries == want.entries, case
        assert got.truncated == want.truncated, case
        if got.total_exact:
            assert got.total == want.total, case
        else:  # stopped early: newest version, the whole workspace, more than it returns
            stopped += 1
            assert (version, path) == (newest, ""), case
            assert most < got.total <= want.total, case
    assert stopped  # the early stop was exercised


async def test_a_glob_of_the_whole_workspace_stops(services: StartReader, quill: Quill) -> None:
    """``**`` with ``max_results`` 100 stops once it has looked at ``GLOB_COUNTED`` entries:
    its total says so; smaller trees and subtrees count every match."""
    await services("r1")
    ws, _ = await tree(quill, "stops")
    every = await ws.glob("**", max_results=100)
    assert every.truncated and not every.total_exact and len(every.entries) == 100
    assert 100 < every.total <= GLOB_COUNTED + 100
    times = [e.modified for e in every.entries]
    assert times == sorted(times, reverse=True)  # newest first
    subtree = await ws.glob("gen/**/*.py", max_results=100)
    assert subtree.total_exact and subtree.total == MANY and subtree.truncated
    few = await ws.glob("src/**", max_results=100)
    assert few.total_exact and not few.truncated


async def test_explore_answers_as_the_whole_tree_did(services: StartReader, quill: Quill) -> None:
    reader = await services("r1")
    ws, older = await tree(quill, "explores")
    row = reader.store.workspace(ws.tenant, ws.name)
    assert row is not None
    newest = (await ws.info()).version
    for path, exclude, version in itertools.product(
        ("", "src", "lib"), (None, [], ["deep"]), (newest, older)
    ):
        req = rq.ExploreQuery(
            path=path, recursive=True, exclude=exclude, max_depth=5, max_results=2000
        )
        got = await ws.explore(
            path, recursive=True, exclude=exclude, max_depth=5, max_results=2000, version=version
        )
        nodes = await reader.store.entries_at(row.id, version, path)
        kept = without_excluded(nodes, path, exclusions(exclude))
        want = explore_result(path, req, kept, row.limits)
        assert (got.entries, got.total) == (want.entries, want.total), (path, exclude, version)
