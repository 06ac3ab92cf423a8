"""The agent tool ops end to end: edit, modify, restore, glob, grep, explore, diff."""

from __future__ import annotations

import pytest

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from quill.client import Quill, Workspace
from tests.helpers import new_workspace
from tests.integration.conftest import StartReader


async def project(quill: Quill, name: str) -> Workspace:
    ws = quill.workspace(name)
    await ws.create()
    await ws.apply(
        [
            rq.PutChange(path="src/app.ts", content="import x from 'x'\nconst port = 3000\n"),
            rq.PutChange(
                path="src/util/math.ts", content="export function add(a, b) {\n  return a + b\n}\n"
            ),
            rq.PutChange(path="src/legacy.js", content="// TODO: remove\nfunction oldThing() {}\n"),
            rq.PutChange(path="README.md", content="# Demo\nTODO: write docs\n"),
            rq.PutChange(
                path="node_modules/dep/index.ts", content="import y from 'y'\nTODO: vendored\n"
            ),
            rq.PutChange(path="logo.png", data=b"\x89PNG\x00TODO"),
        ]
    )
    return ws


async def test_edit_and_modify(services: StartReader, quill: Quill) -> None:
    await services("r1")
    ws = await project(quill, "acme/edits")
    r = await ws.edit("src/app.ts", "const port = 3000", "const port = 8080")
    assert (r.replacements, r.lines_changed, r.file_version) == (1, 1, 2)
    with pytest.raises(QuillError) as info:
        await ws.edit("src/app.ts", "const port = 3000", "x")
    assert info.value.code == ErrorCode.NO_MATCH
    assert info.value.message.startswith("oldString not found in content")
    await ws.write("dup.txt", "a $1 a\n")
    with pytest.raises(QuillError) as info:
        await ws.edit("dup.txt", "a", "b")
    assert info.value.code == ErrorCode.MULTIPLE_MATCHES and "replace_all" in info.value.message
    assert (await ws.edit("dup.txt", "a", "$1", replace_all=True)).replacements == 2
    assert await ws.read_text("dup.txt") == "$1 $1 $1\n"
    m = await ws.modify(
        "src/app.ts",
        [
            rq.InsertLines(after_line=0, new_content="// header"),
            rq.RegexReplace(pattern=r"port = (\d+)", replacement="port = Number($1)", flags="g"),
        ],
    )
    assert (m.lines_before, m.lines_after, m.replacements) == (2, 3, 1)
    assert await ws.read_text("src/app.ts") == (
        "// header\nimport x from 'x'\nconst port = Number(8080)\n"
    )
    with pytest.raises(QuillError) as info:
        await ws.modify("src/app.ts", [rq.RegexReplace(pattern="(", replacement="")])
    assert info.value.code == ErrorCode.INVALID_ARGUMENT and "Invalid regex" in info.value.message


async def test_glob(services: StartReader, quill: Quill) -> None:
    await services("r1")
    ws = await project(quill, "acme/globs")
    await ws.write("src/app.ts", "changed\n")  # newest
    m = await ws.glob("**/*.ts")
    assert [e.path for e in m.entries] == ["src/app.ts", "src/util/math.ts"]  # newest first
    assert (m.total, m.truncated) == (2, False)
    assert [e.path for e in (await ws.glob("*.ts", path="src")).entries] == ["src/app.ts"]
    assert (await ws.glob("**/*.{js,md}")).total == 2
    assert (await ws.glob("**/*.ts", exclude=[])).total == 3  # node_modules included
    assert [e.path for e in (await ws.glob("**/util", kind="directory")).entries] == ["src/util"]
    assert (await ws.glob("**/*.nothing")).entries == []
    limited = await ws.glob("**", max_results=2)
    assert limited.truncated and len(limited.entries) == 2 and limited.total == 7
    old = await ws.glob("**/*.ts", version=2)
    assert old.total == 2  # as of version 2, every op
    with pytest.raises(QuillError) as info:
        await ws.glob("*", path="README.md")
    assert info.value.code == ErrorCode.NOT_A_DIRECTORY


async def test_grep(services: StartReader, quill: Quill) -> None:
    await services("r1")
    ws = await project(quill, "acme/greps")
    todo = await ws.grep("TODO", context_lines=1)
    assert [(h.path, h.line) for h in todo.matches] == [("README.md", 2), ("src/legacy.js", 1)]
    assert todo.matches[0].before == ["# Demo"] and todo.matches[1].after == [
        "function oldThing() {}"
    ]
    assert todo.total == 2 and not todo.truncated  # node_modules excluded, logo.png is binary
    assert (await ws.grep("TODO", exclude=[])).total == 3
    assert [h.path for h in (await ws.grep("import", include=["*.ts"])).matches] == ["src/app.ts"]
    regex = await ws.grep(r"function\s+\w+")
    assert {h.path for h in regex.matches} == {"src/util/math.ts", "src/legacy.js"}
    assert (await ws.grep("todo")).total == 0  # case-sensitive by default
    assert (await ws.grep("todo", ignore_case=True)).total == 2
    assert (await ws.grep("a+b", literal=True)).total == 0 and (
        await ws.grep("a + b", literal=True)
    ).total == 1
    assert (await ws.grep(r"\d")).total >= 1  # no 3-character literal: every file is read
    capped = await ws.grep("o", max_results=1)
    assert capped.truncated and len(capped.matches) == 1 and capped.total > 1
    with pytest.raises(QuillError) as info:
        await ws.grep("unclosed(")
    assert info.value.code == ErrorCode.INVALID_ARGUMENT and "Invalid regex" in info.value.message
    one = await ws.grep("TODO", "src/legacy.js", include=["*.ts"])  # a file: searched as named
    assert [(h.path, h.line) for h in one.matches] == [("src/legacy.js", 1)]
    assert (await ws.grep("TODO", "node_modules/dep/index.ts")).total == 1
    assert (await ws.grep("TODO", "logo.png")).total == 0  # binary: no line matches
    await ws.edit("README.md", "TODO: write docs", "Docs written")
    assert (await ws.grep("TODO")).total == 1
    assert (await ws.grep("TODO", version=2)).total == 2  # as of any version
    assert (await ws.grep("TODO", "README.md", version=2)).total == 1


async def test_grep_finds_content_only_in_the_object_store(
    services: StartReader, quill: Quill
) -> None:
    """A large file's content is not in the trigram index until fetched: grep must still find it."""
    ws = await new_workspace(services, quill, "acme/bigfile")
    await ws.write("big.log", "noise line\n" * 10_000 + "needle in the haystack\n")
    found = await ws.grep("needle in the")
    assert [(h.path, h.line) for h in found.matches] == [("big.log", 10_001)]
    assert (await ws.grep("needle in the")).total == 1  # now indexed, same answer


async def test_explore(services: StartReader, quill: Quill) -> None:
    await services("r1")
    ws = await project(quill, "acme/trees")
    top = await ws.explore()
    assert [(e.path, e.kind) for e in top.entries] == [
        ("src", "directory"),
        ("README.md", "file"),
        ("logo.png", "file"),
    ]
    deep = await ws.explore(recursive=True, metadata=True)
    assert [e.path for e in deep.entries] == [
        "src",
        "src/util",
        "src/util/math.ts",
        "src/app.ts",
        "src/legacy.js",
        "README.md",
        "logo.png",
    ]
    assert deep.entries[2].depth == 3 and deep.entries[2].size is not None
    shallow = await ws.explore(recursive=True, max_depth=2)
    assert "src/util/math.ts" not in [e.path for e in shallow.entries]
    assert "node_modules" in [e.path for e in (await ws.explore(exclude=[])).entries]
    cut = await ws.explore(recursive=True, max_results=3)
    assert cut.truncated and cut.total == 7 and len(cut.entries) == 3


async def test_diff_and_restore(services: StartReader, quill: Quill) -> None:
    await services("r1")
    ws = await project(quill, "acme/diffs")  # v2
    await ws.edit("src/app.ts", "3000", "8080")  # v3
    await ws.delete("README.md")  # v4
    await ws.write("new.txt", "hello\n")  # v5
    d = await ws.diff(2)
    assert [(f.path, f.change) for f in d.files] == [
        ("README.md", "deleted"),
        ("new.txt", "added"),
        ("src/app.ts", "modified"),
    ]
    assert "-const port = 3000\n+const port = 8080\n" in d.diff
    assert "--- /dev/null\n+++ b/new.txt\n" in d.diff and (d.from_version, d.to_version) == (2, 5)
    single = await ws.diff(2, 3, path="src/app.ts")
    assert len(single.files) == 1 and single.files[0].diff.startswith("--- a/src/app.ts")
    await ws.write("logo.png", b"\x00other")
    binary = await ws.diff(5, path="logo.png")
    assert binary.files[0].binary and "Binary files a/logo.png and b/logo.png differ" in binary.diff
    r = await ws.restore(2)
    assert r.committed and set(r.changed) >= {"README.md", "new.txt", "src/app.ts", "logo.png"}
    assert (await ws.diff(2)).files == []  # back as it was
    assert (await ws.info()).tree_hash == (await ws.info(version=2)).tree_hash
    again = await ws.restore(2)
    assert not again.committed


async def test_grep_context_stops_at_the_file_edges(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/edges")
    await ws.write("f.txt", "first\nmiddle\nlast\n")
    first = (await ws.grep("first", context_lines=3)).matches[0]
    last = (await ws.grep("last", context_lines=3)).matches[0]
    assert (first.before, first.after) == ([], ["middle", "last"])
    assert (last.before, last.after) == (["first", "middle"], [])


async def test_grep_anchors_match_at_line_edges(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/anchors")
    await ws.write("notes.md", "intro\n# TODO first\n  # TODO indented\nend TODO\n")
    assert [h.line for h in (await ws.grep("^# TODO")).matches] == [2]
    assert [h.line for h in (await ws.grep("TODO$")).matches] == [4]
    assert (await ws.grep("^# TODO", max_results=1)).total == 1
