"""Codec round trips and refusals; the apply plan's row operations."""

from __future__ import annotations

import msgspec
import pytest

from contracts import codec, ops
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from core.plan import exact, plan, subtree
from tests.core.build import LogBuilder


def test_requests_decode_strictly() -> None:
    write = ops.find("cmd", "write")
    assert write is not None
    req = codec.decode_request(write, b'{"path":"a","data":"AAE="}')
    assert isinstance(req, rq.WriteFile) and req.data == b"\x00\x01"
    info = ops.find("qry", "info")
    assert info is not None
    assert codec.decode_request(info, b"") == rq.WorkspaceInfoQuery()
    for bad, fragment in [
        (b'{"path":"a","bogus":1}', "unknown field `bogus`"),
        (b'{"path":1}', "Expected `str`"),
        (b'{"path":"a","mode":"sideways"}', "Invalid enum value 'sideways'"),
        (b"[1,2]", "Expected `object`"),
        (b'{"path":"a"', "Invalid JSON"),
    ]:
        with pytest.raises(QuillError) as info_:
            codec.decode_request(write, bad)
        assert info_.value.code == ErrorCode.INVALID_ARGUMENT and fragment in info_.value.message


def test_replies_round_trip_and_errors_raise() -> None:
    result = rp.DirectoryMade(path="a", created=["a"])
    assert codec.decode_reply(codec.ok_reply(4, result), rp.DirectoryMade) == (4, result)
    raw = codec.ok_reply_raw(7, codec.encode(result))
    assert msgspec.json.decode(raw) == {
        "ok": True,
        "version": 7,
        "result": {"path": "a", "created": ["a"]},
    }
    error = QuillError(ErrorCode.CONFLICT, "stale", {"current_etag": "v2"})
    with pytest.raises(QuillError) as info:
        codec.decode_reply(codec.error_reply(error), rp.DirectoryMade)
    assert (info.value.code, info.value.details) == (ErrorCode.CONFLICT, {"current_etag": "v2"})
    with pytest.raises(QuillError) as info:
        codec.decode_reply(b"garbage", rp.DirectoryMade)
    assert info.value.code == ErrorCode.INTERNAL


def test_events_round_trip() -> None:
    b = LogBuilder()
    b.run(rq.CreateWorkspace(), "create")
    b.run(rq.WriteFile(path="x/y.bin", data=b"\xff\x00"))
    for item in b.log:
        assert codec.decode_event(codec.encode(item.event)) == item.event


def test_plan_closes_in_batch_rows_and_database_rows() -> None:
    b = LogBuilder()
    b.run(rq.CreateWorkspace(), "create")  # v1
    b.run(rq.WriteFile(path="d/a", content="1"))  # v2: mkdir d, put d/a
    b.run(rq.WriteFile(path="d/a", content="2"))  # v3: put d/a (closes v2's row)
    b.run(rq.DeletePath(path="d", recursive=True))  # v4: closes d and d/a
    p = plan(b.log, {("acme", "demo"): 1})
    rows = {(r[1], r[2]): r[3] for r in p.rows}  # (path, version) -> until
    assert rows == {("d", 2): 4, ("d/a", 2): 3, ("d/a", 3): 4}
    assert (4, 1, *subtree("d")) in p.closes and (3, 1, *exact("d/a")) in p.closes
    assert p.workspace_updates[1][0] == 4 and len(p.events) == 4
    # a later batch closes what the database holds: nothing in it is live any more
    later = plan(b.log[3:], {("acme", "demo"): 1})
    assert later.rows == [] and {c[0] for c in later.closes} == {4}


def test_malformed_requests_and_unencodable_errors_get_one_answer() -> None:
    """Invalid UTF-8 inside a JSON string is INVALID_ARGUMENT naming it (msgspec raised a
    bare UnicodeDecodeError: the writer never answered); an error that JSON cannot carry still
    makes a reply."""
    import json

    spec = ops.find("cmd", "write")
    assert spec is not None
    for body in (b'{"path": "a\xff", "content": "x"}', b'{"path": "a", "content": "\xed\xa0\x80"}'):
        with pytest.raises(QuillError) as info:
            codec.decode_request(spec, body)
        assert info.value.code == ErrorCode.INVALID_ARGUMENT
        assert "not valid UTF-8" in info.value.message
    reply = json.loads(
        codec.error_reply(QuillError(ErrorCode.INTERNAL, "x\udcff", {"o": object()}))
    )
    assert reply["error"] == {"code": "INTERNAL", "message": "x\\udcff", "details": {}}
