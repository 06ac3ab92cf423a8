"""Readers against a real nats-server, driven through the SDK."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from contracts.subjects import Subjects
from quill.client import Quill
from tests.helpers import new_workspace
from tests.integration.conftest import StartReader


async def test_read_your_writes_and_every_version(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/reads")
    await ws.write("doc.md", "one\ntwo\n")  # v2
    await ws.write("doc.md", "three\n", mode="append")  # v3
    await ws.delete("doc.md")  # v4
    await ws.write("doc.md", "again")  # v5
    assert (await ws.read("doc.md", version=2)).content == "one\ntwo\n"
    assert (await ws.read("doc.md", version=3)).content == "one\ntwo\nthree\n"
    with pytest.raises(QuillError) as info:
        await ws.read("doc.md", version=4)
    assert info.value.code == ErrorCode.FILE_NOT_FOUND
    latest = await ws.read("doc.md")
    assert (latest.content, latest.file_version, latest.etag) == ("again", 3, "v3")
    with pytest.raises(QuillError) as info:
        await ws.read("doc.md", version=99)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert "does not exist" in info.value.message


async def test_line_ranges_numbers_and_limits(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/lines")
    await ws.write("f.txt", "".join(f"line {i}\n" for i in range(1, 201)))
    r = await ws.read("f.txt", offset=100, limit=3, line_numbers=True)
    assert r.content == "100: line 100\n101: line 101\n102: line 102\n"
    assert (r.total_lines, r.returned_lines, r.start_line, r.truncated) == (200, 3, 100, False)
    assert (await ws.read("f.txt", head=2)).content == "line 1\nline 2\n"
    assert (await ws.read("f.txt", tail=1)).content == "line 200\n"
    with pytest.raises(QuillError) as info:
        await ws.read("f.txt", head=1, tail=1)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    big = quill.workspace("acme/bigread")
    await big.create()
    await big.write("big.txt", "x\n" * 5000)
    r = await big.read("big.txt")
    assert r.truncated and r.returned_lines == 2000 and r.total_lines == 5000


async def test_binary_files_give_metadata_and_bytes(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/bin")
    blob = bytes(range(256)) * 1024  # 256 KiB: stored in WS_BLOBS, not inline
    await ws.write("img.bin", blob)
    r = await ws.read("img.bin")
    assert r.binary and r.content is None and r.size == len(blob)
    assert await ws.read_bytes("img.bin") == blob
    info = await ws.stat("img.bin")
    assert info.binary and info.mime_type == "application/octet-stream"


async def test_list_stat_history_info_events(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/meta")
    await ws.write("src/a.py", "a")
    await ws.write("src/b.py", "bb")
    await ws.mkdir("docs/empty")
    await ws.move("src/a.py", "src/z.py")
    listing = await ws.list(".")
    assert [(e.name, e.kind) for e in listing.entries] == [
        ("docs", "directory"),
        ("src", "directory"),
    ]
    assert [e.name for e in (await ws.list("src")).entries] == ["b.py", "z.py"]
    with pytest.raises(QuillError) as info:
        await ws.list("src/b.py")
    assert info.value.code == ErrorCode.NOT_A_DIRECTORY
    with pytest.raises(QuillError) as info:
        await ws.list("nowhere")
    assert info.value.message == "Directory not found: nowhere"
    stat = await ws.stat("src")
    assert stat.kind == "directory" and stat.entries == 2
    hist = await ws.history("src/a.py")
    assert [r.change for r in hist.revisions] == ["deleted", "created"]
    assert (await ws.history("src/z.py")).revisions[0].moved_from == "src/a.py"
    whole = await ws.history(limit=2)
    assert [r.version for r in whole.revisions] == [5, 4] and whole.truncated
    info_ = await ws.info()
    assert (info_.version, info_.files, info_.directories, info_.total_bytes) == (5, 2, 3, 3)
    assert "**/node_modules/**" in info_.default_exclusions and "cmd.write" in info_.capabilities
    page = await ws.events(after=0, limit=2)
    assert [e.version for e in page.events] == [1, 2] and page.has_more
    assert page.events[1].prev_hash == page.events[0].hash


async def test_two_replicas_answer_the_same(services: StartReader, quill: Quill, nc: NATS) -> None:
    await services("ra")
    ws = await new_workspace(services, quill, "acme/twins", "rb")
    for i in range(20):
        await ws.write(f"d{i % 3}/f{i}.txt", f"{i}\n" * i)
    subjects = Subjects()
    answers = {}
    for replica in ("ra", "rb"):
        for op, body in [
            ("info", {"min_version": 21}),
            ("list", {"path": "d1", "min_version": 21}),
            ("read", {"path": "d2/f14.txt", "version": 16, "min_version": 21}),
        ]:
            msg = await nc.request(
                subjects.replica(replica, "acme", "twins", op), json.dumps(body).encode(), timeout=5
            )
            reply = json.loads(msg.data)
            assert reply["ok"], reply
            answers.setdefault(op, []).append(reply)
    for op, (a, b) in answers.items():
        assert a == b, op


async def test_deleted_database_is_rebuilt(
    nats_url: str, tmp_path: Path, services: StartReader, quill: Quill
) -> None:
    first = await services("gone")
    ws = quill.workspace("acme/rebuild")
    await ws.create()
    await ws.write("a.txt", "1")
    await ws.write("b/c.txt", "2")
    before = (await ws.info(), await ws.read("b/c.txt", version=3))
    await first.stop()
    shutil.rmtree(first.store.path.parent)
    await services("gone2")
    after = (await ws.info(), await ws.read("b/c.txt", version=3))
    assert before == after


async def test_bad_queries_get_invalid_argument(services: StartReader, nc: NATS) -> None:
    await services("r1")
    s = Subjects()
    q = Quill(nc)
    await q.workspace("acme/badq").create()
    cases = [
        b"{nope",
        b'{"path": 5}',
        b'{"path": "a", "extra": 1}',
        b'{"path": "a", "offset": -1}',
        b'{"path": "a", "limit": 1e300}',
        json.dumps({"path": "x" * 5000}).encode(),
    ]
    for body in cases:
        msg = await nc.request(s.qry("acme", "badq", "read"), body, timeout=5)
        reply = json.loads(msg.data)
        assert reply["ok"] is False and reply["error"]["code"] == "INVALID_ARGUMENT", (body, reply)
    msg = await nc.request(s.qry("acme", "badq", "nosuchop"), b"{}", timeout=5)
    assert "Unknown query" in json.loads(msg.data)["error"]["message"]
    msg = await nc.request(s.qry("acme", "nobody", "read"), b'{"path": "a"}', timeout=5)
    assert json.loads(msg.data)["error"]["code"] == "WORKSPACE_NOT_FOUND"


async def test_apply_through_the_sdk(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/apply")
    await ws.write("keep.txt", "k")
    result = await ws.apply(
        [
            rq.PutChange(path="new/one.txt", content="1"),
            rq.PutChange(path="bin.dat", data=b"\x00\x01"),
            rq.DeleteChange(path="keep.txt"),
        ],
        message="bulk import",
    )
    assert result.committed and result.applied == ["new/one.txt", "bin.dat", "keep.txt"]
    assert (await ws.history(limit=1)).revisions[0].paths == [
        "new",
        "new/one.txt",
        "bin.dat",
        "keep.txt",
    ]
    assert await ws.read_bytes("bin.dat") == b"\x00\x01"


async def test_listings_page_through_every_entry(services: StartReader, quill: Quill) -> None:
    await services("r1")
    ws = quill.workspace("acme/pages")
    await ws.create(limits=LimitsPatch(max_directory_entries=3))
    await ws.apply(
        [rq.PutChange(path=f"f{i}.txt", content=str(i)) for i in range(5)]
        + [rq.PutChange(path=f"d{i}/x.md", content="x") for i in range(3)]
        + [rq.PutChange(path="tests/t.py", content="t"), rq.PutChange(path="todo.md", content="")]
    )
    first = await ws.list(".")
    assert [e.name for e in first.entries] == ["d0", "d1", "d2"]  # directories first
    assert (first.total, first.truncated, first.next) == (10, True, "d:d2")
    second = await ws.list(".", after=first.next)
    assert [e.name for e in second.entries] == ["tests", "f0.txt", "f1.txt"]
    assert second.next == "f:f1.txt" and second.total == 10
    names = [e.name async for e in ws.list_all(".")]
    assert len(names) == 10 and names[3:] == [
        "tests", "f0.txt", "f1.txt", "f2.txt", "f3.txt", "f4.txt", "todo.md",
    ]  # fmt: skip
    assert (await ws.list(".", limit=100)).next == "d:d2"  # the workspace caps a page

    files = [e.path async for e in ws.list_all(".", recursive=True, kind="file")]
    assert files == [
        "d0/x.md", "d1/x.md", "d2/x.md", "f0.txt", "f1.txt", "f2.txt", "f3.txt", "f4.txt",
        "tests/t.py", "todo.md",
    ]  # fmt: skip
    t = [e.path async for e in ws.list_all(".", recursive=True, prefix="t")]
    assert t == ["tests", "tests/t.py", "todo.md"]
    assert [e.path async for e in ws.list_all("d1", recursive=True)] == ["d1/x.md"]
    dirs = await ws.list(".", kind="directory", prefix="d", limit=2)
    assert [e.name for e in dirs.entries] == ["d0", "d1"] and dirs.total == 3

    # Pages are as of one version: a write between them neither shifts nor repeats entries.
    version = ws.last_version
    pages = ws.list_all(".", recursive=True, kind="file")
    seen = [await anext(pages)]
    await ws.write("a-new-first.txt", "new")
    seen += [e async for e in pages]
    assert [e.path for e in seen] == files
    now = [e.path async for e in ws.list_all(".", recursive=True, kind="file")]
    assert now == ["a-new-first.txt", *files]
    then = [e.path async for e in ws.list_all(".", recursive=True, kind="file", version=version)]
    assert then == files

    with pytest.raises(QuillError) as info:
        await ws.list(".", after="nonsense")
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert info.value.message == "Invalid after: pass the next of the previous page"
