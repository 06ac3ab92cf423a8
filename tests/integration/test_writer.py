"""The writer against a real nats-server: commands in, events in WS_EVENTS, replies out."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts import hashing
from contracts.subjects import STREAM_EVENTS, Subjects
from infra.log import CorruptEvent, committed
from services.writer.app import Writer
from tests.helpers import writer_on

S = Subjects()


@pytest_asyncio.fixture
async def writer(nats_url: str, tmp_path: Path) -> AsyncIterator[Writer]:
    async with writer_on(nats_url, tmp_path) as w:
        yield w


async def cmd(nc: NATS, ws: str, op: str, body: dict[str, object], **headers: str) -> dict:
    tenant, name = ws.split("/")
    msg = await nc.request(
        S.cmd(tenant, name, op), json.dumps(body).encode(), timeout=10, headers=headers or None
    )
    return json.loads(msg.data)


async def test_create_write_and_the_log(writer: Writer, nc: NATS) -> None:
    r = await cmd(nc, "acme/w1", "create", {})
    assert r == {
        "ok": True,
        "version": 1,
        "result": {
            "tenant": "acme",
            "workspace": "w1",
            "created": True,
            "trust": "full",
            "limits": r["result"]["limits"],
        },
    }
    r = await cmd(nc, "acme/w1", "write", {"path": "/workspace/docs/a.md", "content": "hi"})
    assert r["ok"] and r["version"] == 2
    assert r["result"] == {
        "path": "docs/a.md",
        "bytes_written": 2,
        "size": 2,
        "file_version": 1,
        "etag": "v1",
        "created": True,
        "modified": r["result"]["modified"],
        "previous_size": None,
        "committed": True,
    }
    # the log holds two chained events on the workspace's subject
    js = nc.jetstream()
    first = await js.get_msg(STREAM_EVENTS, subject=S.evt("acme", "w1"), seq=1, next=True)
    second = await js.get_last_msg(STREAM_EVENTS, S.evt("acme", "w1"))
    assert first.data is not None and second.data is not None
    e1, e2 = json.loads(first.data), json.loads(second.data)
    assert (e1["type"], e1["version"], e1["prev_hash"]) == (
        "workspace_created",
        1,
        hashing.ZERO_HASH,
    )
    assert e2["type"] == "changes_committed" and e2["prev_hash"] == hashing.event_hash(first.data)
    assert [c["type"] for c in e2["changes"]] == ["mkdir", "put"]
    assert r["result"]["modified"] == e2["at"]  # the reply names the commit time


async def test_errors_are_replies(writer: Writer, nc: NATS) -> None:
    assert (await cmd(nc, "acme/nope", "write", {"path": "a", "content": "x"}))["error"][
        "code"
    ] == "WORKSPACE_NOT_FOUND"
    await cmd(nc, "acme/w2", "create", {})
    bad = [
        ({"path": "a", "content": 1}, "INVALID_ARGUMENT"),
        ({"path": "a", "content": "x", "bogus": True}, "INVALID_ARGUMENT"),
        ({"path": "../etc/passwd", "content": "x"}, "ACCESS_DENIED"),
        ({"path": "/etc/passwd", "content": "x"}, "ACCESS_DENIED"),
    ]
    for body, code in bad:
        r = await cmd(nc, "acme/w2", "write", body)
        assert r["ok"] is False and r["error"]["code"] == code, r
    raw = await nc.request(S.cmd("acme", "w2", "write"), b"{not json", timeout=5)
    assert json.loads(raw.data)["error"]["code"] == "INVALID_ARGUMENT"
    raw = await nc.request(S.cmd("acme", "w2", "frobnicate"), b"{}", timeout=5)
    assert "Unknown command" in json.loads(raw.data)["error"]["message"]


async def test_retried_request_id_is_appended_once(writer: Writer, nc: NATS) -> None:
    await cmd(nc, "acme/w3", "create", {})
    body = {"path": "log.txt", "content": "line\n", "mode": "append"}
    first = await cmd(nc, "acme/w3", "write", body, **{"Ws-Request-Id": "req-42"})
    again = await cmd(nc, "acme/w3", "write", body, **{"Ws-Request-Id": "req-42"})
    assert first == again and first["version"] == 2
    info = await nc.jetstream().stream_info(STREAM_EVENTS, subjects_filter=S.evt("acme", "w3"))
    assert info.state.subjects == {S.evt("acme", "w3"): 2}


async def test_concurrent_writers_to_one_workspace_are_serialised(writer: Writer, nc: NATS) -> None:
    await cmd(nc, "acme/hot", "create", {})
    replies = await asyncio.gather(
        *[
            cmd(
                nc,
                "acme/hot",
                "write",
                {"path": "counter.log", "content": f"{i}\n", "mode": "append"},
            )
            for i in range(100)
        ]
    )
    assert all(r["ok"] for r in replies)
    assert sorted(r["version"] for r in replies) == list(range(2, 102))
    sizes = sorted(r["result"]["size"] for r in replies)
    assert len(set(sizes)) == 100  # every append saw the previous one: no lost update


async def test_events_carry_their_hash_and_readers_refuse_a_corrupt_one(
    writer: Writer, nc: NATS
) -> None:
    await cmd(nc, "acme/hashed", "create", {})
    await cmd(nc, "acme/hashed", "write", {"path": "a", "content": "x"})
    seen: list[Msg] = []
    both = asyncio.Event()

    async def keep(msg: Msg) -> None:
        seen.append(msg)
        if len(seen) == 2:
            both.set()

    sub = await nc.jetstream().subscribe(S.evt("acme", "hashed"), cb=keep, ordered_consumer=True)
    await asyncio.wait_for(both.wait(), 10)
    await sub.unsubscribe()
    event = seen[1]
    assert event.headers is not None
    assert event.headers["Ws-Event-Hash"] == hashing.event_hash(event.data)
    assert committed(event).hash == event.headers["Ws-Event-Hash"]
    event.data = event.data.replace(b'"a"', b'"A"')
    with pytest.raises(CorruptEvent):
        committed(event)


async def test_a_failed_projection_apply_is_caught_up_from_the_log(
    writer: Writer, nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The applier fails once (``applier.py``): the writer stops trusting its projection and
    the workspace's actor lets its state go, so the next command loads it from the log, which
    applies the event the projection missed (else the projection would have a gap)."""
    assert (await cmd(nc, "acme/missed", "create", {}))["ok"]
    await writer.appender.applied()
    store = writer.store
    real = store.apply
    failed = asyncio.Event()

    async def once(batch: object) -> None:
        monkeypatch.setattr(store, "apply", real)
        failed.set()
        raise RuntimeError("the projection's disk went away")

    monkeypatch.setattr(store, "apply", once)
    r = await cmd(nc, "acme/missed", "write", {"path": "a.txt", "content": "one"})
    assert r["ok"] and r["version"] == 2  # answered at the log's acknowledgement
    await asyncio.wait_for(failed.wait(), 10)
    await writer.appender.applied()
    assert not writer.deps.projection.complete and store.version_of("acme", "missed") == 1
    r = await cmd(nc, "acme/missed", "write", {"path": "b.txt", "content": "two"})
    assert r["ok"] and r["version"] == 3
    await writer.appender.applied()
    assert store.version_of("acme", "missed") == 3
    r = await cmd(nc, "acme/missed", "write", {"path": "a.txt", "content": "3"})
    assert r["version"] == 4
