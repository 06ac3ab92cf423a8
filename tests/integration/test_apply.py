"""``apply`` as the executor uses it: blob references, replacing a file by a directory, and
change sets whose contents exceed what one event carries inline."""

from __future__ import annotations

import hashlib

import pytest
from nats.aio.client import Client as NATS

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import BUCKET_BLOBS, STREAM_EVENTS, Subjects
from quill.client import Quill
from tests.helpers import new_workspace
from tests.integration.conftest import StartReader


async def test_a_put_may_name_content_already_in_the_object_store(
    services: StartReader, quill: Quill, nc: NATS
) -> None:
    ws = await new_workspace(services, quill, "acme/blobref")
    big = bytes(range(256)) * 1024  # 256 KiB, binary
    sha = hashlib.sha256(big).hexdigest()
    await (await nc.jetstream().object_store(BUCKET_BLOBS)).put(
        f"acme/blobref/{sha}", big
    )  # the workspace's own name
    done = await ws.apply(
        [rq.PutChange(path="out/model.bin", blob=sha), rq.PutChange(path="a.txt", content="a")]
    )
    assert done.applied == ["out/model.bin", "a.txt"]
    assert await ws.read_bytes("out/model.bin") == big
    assert (await ws.stat("out/model.bin")).binary

    missing = "0" * 64
    with pytest.raises(QuillError) as info:
        await ws.apply([rq.PutChange(path="b.bin", blob=missing)])
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert info.value.message == f"Blob {missing} is not in WS_BLOBS: store it before the apply"
    with pytest.raises(QuillError) as info:
        await ws.apply([rq.PutChange(path="c.bin", blob=sha, content="x")])
    assert info.value.message == "Give one of content, data or blob"


async def test_a_file_replaced_by_a_directory(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/replace")
    await ws.write("build", "a file")
    done = await ws.apply(
        [rq.DeleteChange(path="build"), rq.MkdirChange(path="build")], base_version=2
    )
    assert done.committed and (await ws.stat("build")).kind == "directory"
    await ws.write("x", "a file")
    await ws.apply([rq.DeleteChange(path="x"), rq.PutChange(path="x", content="again")])
    assert await ws.read_text("x") == "again"
    for twice in (
        [rq.PutChange(path="y", content="1"), rq.PutChange(path="y", content="2")],
        [rq.DeleteChange(path="x"), rq.PutChange(path="x", content="1"), rq.MkdirChange(path="x")],
    ):
        with pytest.raises(QuillError) as info:
            await ws.apply(twice)
        assert info.value.message.startswith("Path appears twice in changes: ")


async def test_contents_over_the_inline_budget_go_to_the_object_store(
    services: StartReader, quill: Quill, nc: NATS
) -> None:
    ws = await new_workspace(services, quill, "acme/budget")
    # 120 files of 50 KB: each small enough to go inline, 6 MB together (over 4 MiB).
    files = {f"gen/{i:03}.txt": f"{i:03}:".ljust(50_000, "x") for i in range(120)}
    await ws.apply([rq.PutChange(path=p, content=t) for p, t in files.items()])
    event = await nc.jetstream().get_last_msg(STREAM_EVENTS, Subjects().evt("acme", "budget"))
    assert event.data is not None and len(event.data) < 4.5 * 1024 * 1024
    for path in ("gen/000.txt", "gen/119.txt"):
        assert await ws.read_text(path) == files[path]
    assert len((await ws.grep("^119:", "gen")).matches) == 1  # every content is searchable
