"""Forks through the real path (nats-server, a writer, reader replicas, the SDK): a fork
copies nothing, reads the same as its source up to the fork point on every op, and goes its
own way after it; a fork of a fork; deletes of inherited paths (whiteouts); history, events
and diffs across the fork point and between workspaces (issue 33)."""

from __future__ import annotations

import pytest

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill, Workspace
from services.reader.app import Reader
from tests.conftest import StartReader

BIG = "y" * 70_000 + "\n"
"""Over ``INLINE_MAX``: in the source's namespace of WS_BLOBS, which the fork reads."""


async def tree_of(ws: Workspace, version: int) -> dict[str, str | None]:
    """Every entry as of ``version``: a file's text, a directory's None."""
    out: dict[str, str | None] = {}
    after = None
    while True:
        page = await ws.tree(version=version, after=after, contents=True)
        for item in page.entries:
            if item.kind == "directory":
                out[item.path] = None
            else:
                out[item.path] = (await ws.read(item.path, version=version)).content
        if page.next is None:
            return out
        after = page.next


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
