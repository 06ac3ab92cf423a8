"""Forks through the real path (nats-server, a writer, reader replicas, the SDK): a fork
copies nothing, reads the same as its source up to the fork point on every op, and goes its
own way after it; a fork of a fork; deletes of inherited paths (whiteouts); history, events
and diffs across the fork point and between workspaces (issue 33)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from contracts.errors import ErrorCode, QuillError
from contracts.hashing import content_sha256
from contracts.subjects import Subjects
from infra.blobs import Blobs
from quill.client import Quill, Workspace
from quill_cli.tools import replay as rpl
from services.reader.app import Reader
from tests.conftest import StartReader
from tests.helpers import start_reader, start_writer, tree_items

BIG = "y" * 70_000 + "\n"
"""Over ``INLINE_MAX``: in the source's namespace of WS_BLOBS, which the fork reads."""


async def tree_of(ws: Workspace, version: int) -> dict[str, str | None]:
    """Every entry as of ``version``: a file's text, a directory's None."""
    out: dict[str, str | None] = {}
    async for item, _ in tree_items(ws, version):
        if item.kind == "directory":
            out[item.path] = None
        else:
            out[item.path] = (await ws.read(item.path, version=version)).content
    return out


async def seeded(quill: Quill, name: str) -> Workspace:
    src = quill.workspace(name)
    await src.create()
    await src.write("a.txt", "a1\n")  # v2
    await src.write("d/b.txt", "b1\n")  # v3
    await src.write("d/e/c.txt", "c1\n")  # v4
    await src.write("big.txt", BIG)  # v5
    await src.write("a.txt", "a2\n")  # v6
    await src.delete("d/e", recursive=True)  # v7
    await src.write("gone.txt", "g\n")  # v8
    await src.delete("gone.txt")  # v9
    return src


async def wait(reader: Reader, ws: Workspace) -> None:
    assert await reader.follower.wait_for(ws.tenant, ws.name, ws.last_version, 10)


async def test_a_fork_reads_as_its_source_up_to_the_fork_point(
    services: StartReader, quill: Quill
) -> None:
    reader = await services("r1")
    src = await seeded(quill, "f1/src")
    forked = await quill.fork("f1/src", "fork", version=6)
    assert (forked.workspace, forked.version) == ("f1/fork", 6)
    fork = quill.workspace("f1/fork")
    await src.write("a.txt", "a3 after the fork\n")  # v10 on the source only
    await wait(reader, src)
    for v in range(1, 7):
        assert await tree_of(fork, v) == await tree_of(src, v), v
    assert (await fork.read("big.txt")).content == BIG
    assert (await fork.read("a.txt")).content == "a2\n"

    await fork.write("a.txt", "a in the fork\n")
    assert fork.last_version == 7  # the fork's first change is the fork point's next
    await fork.delete("d", recursive=True)  # an inherited directory: whited out
    await fork.write("d/new.txt", "n\n")
    assert (await fork.read("a.txt")).content == "a in the fork\n"
    assert (await src.read("a.txt")).content == "a3 after the fork\n"
    assert sorted((await tree_of(fork, 9)).keys()) == ["a.txt", "big.txt", "d", "d/new.txt"]
    assert "d/b.txt" in await tree_of(src, 10)
    listing = await fork.list("d")
    assert [e.name for e in listing.entries] == ["new.txt"]
    with pytest.raises(QuillError) as missing:
        await fork.read("d/b.txt")
    assert missing.value.code == ErrorCode.FILE_NOT_FOUND
    assert (await fork.read("d/b.txt", version=7)).content == "b1\n"  # before its delete


async def test_history_events_search_and_diff_read_across_the_fork_point(
    services: StartReader, quill: Quill
) -> None:
    reader = await services("r1")
    src = await seeded(quill, "f2/src")
    await quill.fork("f2/src", "fork")  # at its latest, 9
    fork = quill.workspace("f2/fork")
    await fork.write("a.txt", "a in the fork\n")  # 10
    await fork.delete("big.txt")  # 11: an inherited file, whited out
    await src.write("a.txt", "a on the source\n")  # 10 on the source
    await wait(reader, src)

    # a path's history: the fork's revisions, then the source's up to the fork point
    history = await fork.history("a.txt")
    assert [(r.version, r.change) for r in history.revisions] == [
        (10, "modified"),
        (6, "modified"),
        (2, "created"),
    ]
    gone = await fork.history("big.txt")
    assert [(r.version, r.change) for r in gone.revisions] == [(11, "deleted"), (5, "created")]
    # the events: the source's up to the fork point, then the fork's
    events = await fork.events(limit=1000)
    assert [e.version for e in events.events] == list(range(1, 12))
    source_events = (await src.events(limit=9)).events
    assert [e.hash for e in events.events[:8]] == [e.hash for e in source_events[:8]]
    forked = events.events[8]  # version 9 of the fork: its first event, the source's tree
    assert (forked.type, forked.prev_hash) == ("workspace_forked", source_events[8].hash)
    assert forked.tree_hash == source_events[8].tree_hash
    assert events.events[9].prev_hash == forked.hash  # the fork's chain goes on from it
    workspace_history = await fork.history(limit=3)
    assert [r.version for r in workspace_history.revisions] == [11, 10, 9]

    # glob and grep see the fork's tree, as of any version
    names = sorted(e.path for e in (await fork.glob("**/*.txt")).entries)
    assert names == ["a.txt", "d/b.txt"]
    old = sorted(e.path for e in (await fork.glob("**/*.txt", version=5)).entries)
    assert old == ["a.txt", "big.txt", "d/b.txt", "d/e/c.txt"]
    found = await fork.grep("fork")
    assert [(m.path, m.text) for m in found.matches] == [("a.txt", "a in the fork")]
    assert not (await fork.grep("on the source")).matches

    # diff across the fork point, and between the two workspaces
    diff = await fork.diff(6, 11)
    assert {(f.path, f.change) for f in diff.files} == {
        ("a.txt", "modified"),
        ("big.txt", "deleted"),
        ("d/e/c.txt", "deleted"),  # by the source at 7, before the fork point
    }
    between = await fork.diff(10, from_workspace="src")
    assert {(f.path, f.change) for f in between.files} == {
        ("a.txt", "modified"),
        ("big.txt", "deleted"),
    }
    assert "-a on the source" in between.diff and "+a in the fork" in between.diff
    # a workspace that shares no history with the fork: every file of each side differs
    other = quill.workspace("f2/other")
    await other.create()
    await other.write("a.txt", "a on the source\n")  # 2
    await wait(reader, other)
    apart = await fork.diff(2, from_workspace="other")
    assert {(f.path, f.change) for f in apart.files} == {
        ("a.txt", "modified"),
        ("d/b.txt", "added"),
    }
    back = await other.diff(11, from_workspace="fork")
    assert {(f.path, f.change) for f in back.files} == {
        ("a.txt", "modified"),
        ("d/b.txt", "deleted"),
    }
    info = await fork.info()
    assert (info.version, info.files) == (11, 2)


async def test_a_fork_of_a_fork_and_the_forks_listed(services: StartReader, quill: Quill) -> None:
    reader = await services("r1")
    src = await seeded(quill, "f3/src")
    await quill.fork("f3/src", "one", version=4)
    one = quill.workspace("f3/one")
    await one.write("one.txt", "1\n")  # 5
    await one.delete("d/e", recursive=True)  # 6
    await quill.fork("f3/one", "two")  # at 6
    two = quill.workspace("f3/two")
    await two.write("two.txt", "2\n")  # 7
    await one.write("later.txt", "not in two\n")  # 7 on one
    await wait(reader, one)
    assert await tree_of(two, 6) == await tree_of(one, 6)
    assert await tree_of(two, 4) == await tree_of(src, 4)
    assert sorted(await tree_of(two, 7)) == ["a.txt", "d", "d/b.txt", "one.txt", "two.txt"]
    with pytest.raises(QuillError) as gone:
        await two.read("d/e/c.txt", version=6)
    assert gone.value.code == ErrorCode.FILE_NOT_FOUND
    assert (await two.read("d/e/c.txt", version=4)).content == "c1\n"

    listed = await src.forks()
    assert [(f.workspace, f.version, f.ahead, f.behind) for f in listed.forks] == [("one", 4, 3, 5)]
    assert [(f.workspace, f.version) for f in (await one.forks()).forks] == [("two", 6)]

    with pytest.raises(QuillError) as refused:  # its forks read its history
        await src.purge()
    assert refused.value.code == ErrorCode.CONFLICT
    assert refused.value.details["forks"] == ["one"]
    await two.purge()
    await one.purge()
    await src.purge()  # no forks left


async def test_a_fork_is_refused_clearly(services: StartReader, quill: Quill) -> None:
    await services("r1")
    await seeded(quill, "f4/src")
    await quill.workspace("f4/taken").create()
    cases = [
        (("f4/src", "src", None), ErrorCode.ALREADY_EXISTS),  # named like its source
        (("f4/src", "taken", None), ErrorCode.ALREADY_EXISTS),  # an existing workspace
        (("f4/nothing", "new", None), ErrorCode.WORKSPACE_NOT_FOUND),
        (("f4/src", "new", 99), ErrorCode.INVALID_ARGUMENT),  # no such version
        (("f4/src", "other/new", None), ErrorCode.INVALID_ARGUMENT),  # another tenant
    ]
    for (source, new, version), code in cases:
        with pytest.raises(QuillError) as refused:
            await quill.fork(source, new, version=version)
        assert refused.value.code == code, (source, new, version)
    with pytest.raises(QuillError):
        await quill.workspace("f4/new").info()


async def test_replay_and_verify_fold_the_source_then_the_fork(
    services: StartReader, quill: Quill, tmp_path: Path
) -> None:
    """``quill replay``/``verify``'s fold: the source's log up to the fork point, the fork's
    first event continuing its chain, then the fork's events, each tree hash checked (so the
    writer's tree of the fork, its source's plus its own, hashed right)."""
    reader = await services("r1")
    src = await seeded(quill, "f5/src")
    await quill.fork("f5/src", "fork", version=7)
    fork = quill.workspace("f5/fork")
    await fork.write("d/b.txt", "b in the fork\n")
    await fork.delete("a.txt")
    await fork.move("big.txt", "moved/big.txt")
    await src.write("after.txt", "the source goes on\n")
    await wait(reader, fork)
    js = quill.nc.jetstream()
    contents = rpl.Contents()
    folded = await rpl.replay(js, Subjects(), "f5", "fork", contents=contents)
    info = await fork.info()
    assert (folded.version, folded.summary().tree_hash) == (10, info.tree_hash)
    assert folded.summary().files == info.files
    below = await rpl.replay(js, Subjects(), "f5", "fork", to_version=5)
    assert below.summary().tree_hash == (await src.info(version=5)).tree_hash
    out = tmp_path / "out"
    await rpl.write_tree(folded, Blobs(js), out, contents)
    contents.close()
    assert (out / "moved" / "big.txt").read_text() == BIG  # from the source's namespace
    assert not (out / "a.txt").exists()


async def test_a_command_in_a_fork_sees_the_forks_tree(
    local_exec: AsyncExitStack, quill: Quill
) -> None:
    """An executor's first checkout of a fork is its tree (the source's at the fork point,
    then the fork's changes), inherited large contents included; what a command changes is
    the fork's alone."""
    src = await seeded(quill, "f6/src")
    await quill.fork("f6/src", "fork", version=6)
    fork = quill.workspace("f6/fork")
    await fork.write("own.txt", "the fork's\n")
    await src.write("later.txt", "the source's, after the fork\n")
    ran = await fork.exec("find . -type f | sort && cat a.txt && wc -c < big.txt")
    assert ran.stdout.split() == [
        "./a.txt", "./big.txt", "./d/b.txt", "./d/e/c.txt", "./own.txt", "a2", str(len(BIG)),
    ]  # fmt: skip
    await fork.exec("echo made > made.txt && rm a.txt")
    assert (await fork.read("made.txt")).content == "made\n"
    assert (await src.read("a.txt")).content == "a2\n"
    with pytest.raises(QuillError):
        await src.read("made.txt")


async def test_purging_a_fork_deletes_only_what_no_other_workspace_holds(
    nats_url: str, tmp_path: Path, quill: Quill
) -> None:
    """A fork's purge (issue 33, item 5: it costs what the fork added, a seek per content of
    its own, ``sql.CONTENTS_KEPT``) takes from the writer's and a reader's projection the
    contents the fork alone held, and nothing its source holds (in its tree or only in its
    history) nor what a third workspace holds: the source reads the same after."""
    async with AsyncExitStack() as stack:
        writer = await start_writer(stack, nats_url, tmp_path / "writer")
        reader = await start_reader(stack, nats_url, tmp_path / "r1", instance="r1")
        src = await seeded(quill, "f7/src")
        other = quill.workspace("f7/other")
        await other.create()
        shared, own = "held by the fork and by another workspace\n", "the fork's alone\n"
        await other.write("shared.txt", shared)
        await quill.fork("f7/src", "fork")
        fork = quill.workspace("f7/fork")
        await fork.write("own.txt", own)
        await fork.write("a.txt", shared)  # an inherited file changed
        await fork.write("again.txt", "a1\n")  # what the source holds in its history only
        await fork.delete("d", recursive=True)  # a whiteout
        await writer.deps.appender.applied()
        await wait(reader, fork)
        stores = {"writer": writer.store, "reader": reader.store}
        for role, store in stores.items():
            assert await store.blob(content_sha256(own.encode())) == own.encode(), role
        tree = await tree_of(src, src.last_version)
        old = (await src.read("a.txt", version=2)).content

        await fork.purge()
        await other.write("after.txt", "after the purge\n")  # the reader applies in log order
        await writer.deps.appender.applied()
        await wait(reader, other)
        for role, store in stores.items():
            assert await store.blob(content_sha256(own.encode())) is None, role
            for kept in (shared, "a1\n", "a2\n", "b1\n", "c1\n"):
                assert await store.blob(content_sha256(kept.encode())) == kept.encode(), role
        assert await tree_of(src, src.last_version) == tree
        assert (await src.read("a.txt", version=2)).content == old == "a1\n"
        assert (await other.read("shared.txt")).content == shared
        with pytest.raises(QuillError) as gone:
            await fork.info()
        assert gone.value.code == ErrorCode.WORKSPACE_NOT_FOUND


async def walked(ws: Workspace, version: int) -> tuple[int, int, int, int]:
    """``(files, directories, total bytes, entries)`` of a plain walk of ``ws``'s whole tree
    as of ``version`` (``qry.tree`` page after page)."""
    files = dirs = size = 0
    async for item, _ in tree_items(ws, version, limit=3):
        if item.kind == "directory":
            dirs += 1
        else:
            files, size = files + 1, size + (item.size or 0)
    return files, dirs, size, files + dirs


async def check_totals(ws: Workspace, version: int) -> None:
    """``info``'s totals and a recursive listing's ``total`` (of everything, of files, of a
    subtree) as of ``version`` are those of a plain walk of the tree."""
    files, dirs, size, entries = await walked(ws, version)
    info = await ws.info(version=version)
    where = f"{ws.name}@{version}"
    assert (info.files, info.directories, info.total_bytes) == (files, dirs, size), where
    everything = await ws.list(".", recursive=True, limit=1, version=version)
    assert everything.total == entries, where
    only_files = await ws.list(".", recursive=True, kind="file", limit=1, version=version)
    assert only_files.total == files, where
    with_prefix = await ws.list(".", recursive=True, prefix="d", limit=1, version=version)
    assert with_prefix.total == len([e for e in await tree_of(ws, version) if e[:1] == "d"])
    try:
        below = await ws.list("d", recursive=True, limit=1, version=version)
    except QuillError as exc:
        assert exc.code == ErrorCode.FILE_NOT_FOUND, exc
    else:
        want = len([e for e in await tree_of(ws, version) if e.startswith("d/")])
        assert below.total == want, where


async def test_a_forks_totals_are_its_trees_at_every_version(
    services: StartReader, quill: Quill
) -> None:
    """A fork's ``info`` totals and listing totals are its source's as of the fork point
    (held by the reader) moved by what it changed (issue 33): after adds, changes of size,
    deletes of an inherited file and directory (whiteouts), a re-add after a delete, on a
    fork of a fork, at every version (those before the fork points too), they are a plain
    walk's."""
    reader = await services("r1")
    src = await seeded(quill, "f8/src")  # 9 versions
    await quill.fork("f8/src", "one", version=6)
    one = quill.workspace("f8/one")
    await one.write("a.txt", "a in the fork, longer than before\n")  # 7: a change of size
    await one.write("d/new.txt", "n\n")  # 8: an add in an inherited directory
    await one.delete("big.txt")  # 9: an inherited file: a whiteout
    await one.delete("d", recursive=True)  # 10: an inherited directory, and its own add
    await one.write("d/b.txt", "b again\n")  # 11: a re-add after the delete
    await one.mkdir("e/f")  # 12
    await quill.fork("f8/one", "two", version=10)
    two = quill.workspace("f8/two")
    await two.write("big.txt", "small now\n")  # 11: a re-add of what one deleted
    await two.write("two.txt", "2\n")  # 12
    await two.delete("a.txt")  # 13: inherited from one, which changed src's
    await src.write("a.txt", "the source goes on\n")  # 10 on the source only
    await src.delete("d", recursive=True)  # 11 on the source only
    await wait(reader, src)
    await wait(reader, one)
    await wait(reader, two)
    for ws in (src, one, two):
        for version in range(1, ws.last_version + 1):
            await check_totals(ws, version)
    assert (await two.info()).files == 2  # big.txt, two.txt
