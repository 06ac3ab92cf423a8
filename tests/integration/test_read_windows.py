"""Read windows on the bus: anchored where asked, cut by the read limits at that end, with the
read that returns the rest; the SDK's whole-file reads return the whole file."""

from __future__ import annotations

import json

import pytest
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from contracts.limits import LimitsPatch
from contracts.subjects import Subjects
from quill.client import Quill, Workspace
from tests.helpers import new_workspace
from tests.integration.conftest import StartReader

LINES = "".join(f"line {i}\n" for i in range(1, 5001))


def lines(first: int, last: int) -> str:
    return "".join(f"line {i}\n" for i in range(first, last + 1))


async def bus_read(nc: NATS, workspace: str, **body: object) -> dict[str, object]:
    """A bare ``read`` request on the bus: the reply's ``result`` (or its ``error``)."""
    msg = await nc.request(Subjects().qry("acme", workspace, "read"), json.dumps(body).encode(), 5)
    reply = json.loads(msg.data)
    return dict(reply["result"] if reply["ok"] else reply["error"])


async def test_a_tail_keeps_the_last_lines_a_head_the_first(
    services: StartReader, quill: Quill, nc: NATS
) -> None:
    ws = await new_workspace(services, quill, "acme/windows")
    await ws.write("big.log", LINES)
    tail = await bus_read(nc, "windows", path="big.log", tail=3000, min_version=2)
    assert tail["content"] == lines(3001, 5000)
    assert (tail["start_line"], tail["returned_lines"], tail["total_lines"]) == (3001, 2000, 5000)
    assert tail["truncated"] is True
    assert tail["cut"] == {
        "by": "lines",
        "max": 2000,
        "first_missing": 2001,
        "last_missing": 3000,
        "offset": 2001,
        "limit": 1000,
        "char_offset": 0,
        "line": None,
        "line_length": None,
    }
    head = await ws.read("big.log", head=4000)
    assert head.content == lines(1, 2000) and head.truncated and head.cut is not None
    assert (head.cut.first_missing, head.cut.last_missing) == (2001, 4000)
    assert (head.cut.offset, head.cut.limit) == (2001, 2000)
    rest = await ws.read("big.log", offset=head.cut.offset, limit=head.cut.limit)
    assert rest.content == lines(2001, 4000) and not rest.truncated and rest.cut is None
    small = await ws.read("big.log", tail=2)
    assert (small.content, small.start_line, small.truncated) == (lines(4999, 5000), 4999, False)
    refused = await bus_read(nc, "windows", path="big.log", tail=1, char_offset=3)
    assert refused["code"] == "INVALID_ARGUMENT" and "char_offset" in str(refused["message"])


async def follow(ws: Workspace, path: str, **window: int) -> str:
    """The window read, then every read its cuts name, joined."""
    parts: list[str] = []
    r = await ws.read(path, **window)  # type: ignore[arg-type]
    parts.append(r.content or "")
    while r.cut is not None:
        cut = r.cut
        r = await ws.read(path, offset=cut.offset, limit=cut.limit, char_offset=cut.char_offset)
        parts.append(r.content or "")
    return "".join(parts)


async def test_the_byte_limit_cuts_at_the_anchored_end_and_long_lines_in_parts(
    services: StartReader, quill: Quill
) -> None:
    ws = await new_workspace(
        services, quill, "acme/narrow", limits=LimitsPatch(max_read_bytes=1000)
    )
    await ws.write("big.log", LINES)
    tail = await ws.read("big.log", tail=500)
    assert tail.content == lines(4901, 5000) and tail.cut is not None
    assert (tail.cut.by, tail.cut.first_missing, tail.cut.last_missing) == ("bytes", 4501, 4900)
    assert await follow(ws, "big.log", tail=500) == lines(4901, 5000) + lines(4501, 4900)
    assert await follow(ws, "big.log", offset=4001, limit=500) == lines(4001, 4500)
    wide = "ü" * 1200 + "x" * 300 + "\n"
    await ws.write("wide.txt", "first\n" + wide + "last")
    part = await ws.read("wide.txt", offset=2)
    assert part.content == "ü" * 500 and (part.start_char, part.end_char) == (0, 500)
    assert part.cut is not None and (part.cut.line, part.cut.line_length) == (2, 1501)
    assert (part.cut.offset, part.cut.limit, part.cut.char_offset) == (2, 2, 500)
    assert await follow(ws, "wide.txt") == "first\n" + wide + "last"
    await ws.write("wide_end.txt", "first\n" + wide)
    end = await ws.read("wide_end.txt", tail=1)
    assert end.content == "ü" * 349 + "x" * 300 + "\n" and end.start_char == 851
    assert end.cut is not None and (end.cut.offset, end.cut.limit, end.cut.char_offset) == (2, 1, 0)


async def test_read_text_returns_the_whole_file(services: StartReader, quill: Quill) -> None:
    ws = await new_workspace(services, quill, "acme/whole")
    await ws.write("big.log", LINES)
    assert await ws.read_text("big.log") == LINES  # 5,000 lines: more than one read's 2,000
    wide = "ab\n" * 10 + "é" * 150_000  # 300,030 bytes, its last line 300,000 bytes
    await ws.write("wide.txt", wide)
    first = await ws.read("wide.txt")
    assert first.truncated and first.returned_lines == 10  # one read: a part, and says so
    assert await ws.read_text("wide.txt") == wide
    version = ws.last_version
    await ws.write("wide.txt", "short\n")
    assert await ws.read_text("wide.txt", version=version) == wide  # paged at that version
    assert await ws.read_text("wide.txt") == "short\n"
    await ws.mkdir("dir")
    with pytest.raises(QuillError) as info:
        await ws.read_text("dir")
    assert info.value.code == ErrorCode.NOT_A_FILE
