"""A local workspace is confined to its folder: paths that leave it, and links that lead out
of it, are ACCESS_DENIED, and nothing outside is read or touched."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.paths import ACCESS_DENIED_MESSAGE
from quill.client import Quill, Workspace
from tests.bridge.conftest import Attach, folder_with

ESCAPES: list[Callable[[Workspace], Awaitable[Any]]] = [
    lambda ws: ws.read("../outside/secret.txt"),
    lambda ws: ws.read("/etc/passwd"),
    lambda ws: ws.write("../outside/new.txt", "x"),
    lambda ws: ws.read("link.txt"),
    lambda ws: ws.stat("link.txt"),
    lambda ws: ws.read_bytes("link.txt"),
    lambda ws: ws.list("linkdir"),
    lambda ws: ws.read("linkdir/secret.txt"),
    lambda ws: ws.glob("*", path="linkdir"),
    lambda ws: ws.grep("secret", path="linkdir"),
    lambda ws: ws.explore("linkdir"),
    lambda ws: ws.write("link.txt", "overwritten"),
    lambda ws: ws.edit("link.txt", "top", "bottom"),
    lambda ws: ws.write("linkdir/new.txt", "x"),
    lambda ws: ws.mkdir("linkdir/sub"),
    lambda ws: ws.delete("link.txt"),
    lambda ws: ws.delete("linkdir", recursive=True),
    lambda ws: ws.move("link.txt", "moved.txt"),
    lambda ws: ws.move("inside.txt", "linkdir/inside.txt"),
    lambda ws: ws.apply([rq.PutChange(path="linkdir/x.txt", content="x")]),
    lambda ws: ws.exec("pwd", workdir="linkdir"),
]


async def test_nothing_outside_the_folder_is_read_or_touched(
    servers: None, attach: Attach, client: Quill, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    folder = folder_with(tmp_path, {"inside.txt": "inside\n"})
    (folder / "link.txt").symlink_to(outside / "secret.txt")
    (folder / "linkdir").symlink_to(outside)
    before = sorted(os.listdir(outside)), (outside / "secret.txt").stat().st_mtime_ns
    await attach(folder, "laptop", "--trust", "full")
    ws = client.workspace("acme/laptop")

    for i, escape in enumerate(ESCAPES):
        with pytest.raises(QuillError) as info:
            await escape(ws)
        assert info.value.code == ErrorCode.ACCESS_DENIED, (i, info.value)
        assert info.value.message == ACCESS_DENIED_MESSAGE, (i, info.value)

    after = sorted(os.listdir(outside)), (outside / "secret.txt").stat().st_mtime_ns
    assert after == before
    assert (folder / "link.txt").is_symlink() and (folder / "linkdir").is_symlink()
    # Walks never follow a link: links are not shown, nor searched.
    listed = [e.path for e in (await ws.list(".", recursive=True)).entries]
    assert listed == ["inside.txt"]
    assert (await ws.grep("secret", exclude=[])).total == 0
    assert [e.path for e in (await ws.glob("**", exclude=[])).entries] == ["inside.txt"]
    assert (await ws.stat(".")).entries == 1


async def test_links_inside_the_folder_are_read_not_written_through(
    servers: None, attach: Attach, client: Quill, tmp_path: Path
) -> None:
    folder = folder_with(tmp_path, {"docs/readme.md": "the real one\n"})
    (folder / "readme.md").symlink_to("docs/readme.md")
    await attach(folder, "laptop", "--trust", "full")
    ws = client.workspace("acme/laptop")
    assert await ws.read_text("readme.md") == "the real one\n"
    with pytest.raises(QuillError) as info:
        await ws.write("readme.md", "changed\n")
    assert info.value.code == ErrorCode.ACCESS_DENIED
    assert "readme.md is a symbolic link" in info.value.message
    assert (folder / "docs" / "readme.md").read_text() == "the real one\n"
    await ws.edit("docs/readme.md", "real", "only")  # the real path is fine
    assert await ws.read_text("readme.md") == "the only one\n"
