"""Bounded queues against a real nats-server: past each bound, one busy answer at once.

Commands are held in a writer by a lock another session holds (``Ws-Wait``): they park,
counted in their workspace's queue and the writer's, so each bound is reached exactly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts.errors import QuillError
from contracts.subjects import HEADER_REQUEST_ID, HEADER_SESSION, HEADER_WAIT, Subjects
from infra import bus
from infra.busy import REJECTIONS, Dropped
from infra.runtime import Settings
from infra.store import Store
from services.writer.app import Writer
from services.writer.config import WriterConfig
from tests.conftest import StartReader
from tests.helpers import eventually

S = Subjects()


def rejections(service: str, queue: str) -> float:
    return REJECTIONS.labels(service, queue)._value.get()


async def answering(nats_url: str) -> None:
    """Until a command gets an answer (here, the writer's refusal of an unknown op): seen once
    under a loaded machine, the first command after a writer started met no responders."""
    client = await nats.connect(nats_url)
    try:
        await eventually(
            lambda: client.request(S.cmd("busy", "probe", "nothing"), b"{}", timeout=5),
            10,
            "an answer from the writer",
            ignoring=(nats.errors.NoRespondersError,),
        )
    finally:
        await client.close()


@pytest_asyncio.fixture
async def start_writer(
    nats_url: str, tmp_path: Path
) -> AsyncIterator[Callable[[WriterConfig], Awaitable[Writer]]]:
    started: list[tuple[Writer, Store, NATS]] = []

    async def start(config: WriterConfig) -> Writer:
        nc = await bus.connect(nats_url, "writer")
        await bus.ensure_streams(nc, S)
        store = await Store.open(tmp_path / f"writer{len(started)}.db", role="writer")
        writer = Writer(Settings(nats_url=nats_url, data_dir=tmp_path), nc, store, config)
        await writer.start()
        started.append((writer, store, nc))
        await answering(nats_url)
        return writer

    yield start
    for writer, store, nc in started:
        await writer.stop(grace_s=1)
        await store.close()
        await nc.close()


async def cmd(nc: NATS, ws: str, op: str, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    tenant, name = ws.split("/")
    subject = S.cmd(tenant, name, op)
    msg = await nc.request(subject, json.dumps(body).encode(), timeout=20, headers=headers or None)
    return json.loads(msg.data)  # type: ignore[no-any-return]


def write(nc: NATS, ws: str, path: str, content: str = "x", **headers: str) -> asyncio.Task[Any]:
    """A write of session ``b`` that waits up to 20 s for session ``a``'s lock."""
    waiting = {HEADER_SESSION: "b", HEADER_WAIT: "20000", **headers}
    return asyncio.create_task(cmd(nc, ws, "write", {"path": path, "content": content}, **waiting))


async def locked(nc: NATS, ws: str, ttl_ms: int = 60_000) -> None:
    assert (await cmd(nc, ws, "create", {}))["ok"]
    assert (await cmd(nc, ws, "lock", {"ttl_ms": ttl_ms}, **{HEADER_SESSION: "a"}))["ok"]


async def unlock(nc: NATS, ws: str) -> None:
    assert (await cmd(nc, ws, "unlock", {}, **{HEADER_SESSION: "a"}))["ok"]


def busy(reply: dict[str, Any], queue: str) -> dict[str, Any]:
    assert not reply["ok"], reply
    error = reply["error"]
    assert error["code"] == "UNAVAILABLE", error
    assert error["details"]["reason"] == "busy" and error["details"]["queue"] == queue, error
    assert error["details"]["retry_after_ms"] > 0
    assert "busy" in error["message"] and "retry in" in error["message"]
    return error  # type: ignore[no-any-return]


async def test_a_workspace_holds_at_most_its_bound_and_the_next_command_is_busy(
    start_writer: Callable[[WriterConfig], Awaitable[Writer]], nc: NATS
) -> None:
    """200 writes published at once to a workspace that may hold one: the entry takes them
    faster than one append, so most are refused busy; each is answered exactly once."""
    writer = await start_writer(WriterConfig(max_queued_per_workspace=1))
    assert (await cmd(nc, "busy/one", "create", {}))["ok"]
    client = await nats.connect(writer.settings.nats_url)
    replies: dict[str, list[dict[str, Any]]] = {}
    done = asyncio.Event()

    async def on_reply(msg: Msg) -> None:
        replies.setdefault(msg.subject, []).append(json.loads(msg.data))
        if len(replies) == 200:
            done.set()

    await client.subscribe("_INBOX.one.*", cb=on_reply)
    before = rejections("writer", "workspace_commands")
    try:
        for i in range(200):
            body = json.dumps({"path": f"f{i}", "content": "x"}).encode()
            await client.publish(S.cmd("busy", "one", "write"), body, reply=f"_INBOX.one.{i}")
        await client.flush()
        async with asyncio.timeout(20):
            await done.wait()
        assert (await cmd(nc, "busy/one", "write", {"path": "after", "content": "y"}))["ok"]
    finally:
        await client.close()
    assert all(len(r) == 1 for r in replies.values())
    refused = [busy(r[0], "workspace_commands") for r in replies.values() if not r[0]["ok"]]
    assert refused and refused[0]["details"]["limit"] == 1 and "busy/one" in refused[0]["message"]
    assert rejections("writer", "workspace_commands") == before + len(refused)
    assert writer.queued == 0


async def test_commands_waiting_for_a_lock_are_bounded_apart_and_the_holder_still_unlocks(
    start_writer: Callable[[WriterConfig], Awaitable[Writer]], nc: NATS
) -> None:
    writer = await start_writer(WriterConfig(max_waiting_per_workspace=3))
    await locked(nc, "busy/lk")
    parked = [write(nc, "busy/lk", f"f{i}") for i in range(3)]
    await eventually(lambda: writer.queued == 3)
    error = busy(await write(nc, "busy/lk", "late"), "workspace_waiting")
    assert error["details"]["limit"] == 3 and "busy/lk" in error["message"]
    # another workspace is not held up by it, and the holder is not kept from unlocking
    assert (await cmd(nc, "busy/other", "create", {}))["ok"]
    await unlock(nc, "busy/lk")
    replies = await asyncio.gather(*parked)
    assert [r["ok"] for r in replies] == [True, True, True]
    assert writer.queued == 0


async def test_the_writer_holds_at_most_its_bound_in_commands_and_in_bytes(
    start_writer: Callable[[WriterConfig], Awaitable[Writer]], nc: NATS
) -> None:
    """Commands waiting for a lock count here too (memory is memory): this full writer
    refuses even the holder's unlock, and the waiters go on when the lock expires."""
    writer = await start_writer(WriterConfig(max_queued=2, max_queued_bytes=4096))
    await locked(nc, "busy/t1", ttl_ms=1000)
    await locked(nc, "busy/t2", ttl_ms=1000)
    first = write(nc, "busy/t1", "a")
    await eventually(lambda: writer.queued == 1)
    # one more command may come, but not one whose bytes would pass the bound
    busy(await write(nc, "busy/t2", "big", "x" * 5000), "command_bytes")
    second = write(nc, "busy/t2", "b")
    await eventually(lambda: writer.queued == 2)
    busy(await write(nc, "busy/t2", "c"), "commands")
    busy(await cmd(nc, "busy/t1", "unlock", {}, **{HEADER_SESSION: "a"}), "commands")
    assert (await first)["ok"] and (await second)["ok"]
    assert writer.queued == 0 and writer.deps.backlog.bytes == 0


async def test_copies_of_one_request_waiting_are_bounded_and_each_is_answered_once(
    start_writer: Callable[[WriterConfig], Awaitable[Writer]], nc: NATS
) -> None:
    writer = await start_writer(WriterConfig())
    await locked(nc, "busy/r")
    same = {HEADER_REQUEST_ID: "the-one"}
    copies = [write(nc, "busy/r", "f", **same)]
    await eventually(lambda: writer.queued == 1)
    copies += [write(nc, "busy/r", "f", **same) for _ in range(16)]
    actor = writer.actors.get("busy", "r")
    await eventually(lambda: len(actor._inflight["the-one"].retries) == 16)
    busy(await write(nc, "busy/r", "f", **same), "request_retries")
    await unlock(nc, "busy/r")
    replies = await asyncio.gather(*copies)
    assert all(r["ok"] for r in replies) and len({r["version"] for r in replies}) == 1


async def test_requests_nats_py_drops_as_a_slow_consumer_are_answered_busy(nats_url: str) -> None:
    """A subscription that holds one pending message: what comes past it is dropped by
    nats-py, and each dropped request still gets its one answer (busy)."""
    dropped = Dropped("writer")
    service = await bus.connect(nats_url, "flooded", on_dropped=dropped)
    release = asyncio.Event()
    handled: list[str] = []

    async def handler(msg: Msg) -> None:
        await release.wait()
        handled.append(msg.subject)
        await msg.respond(b'{"ok": true, "version": null, "result": null}')

    await bus.serve(service, S.cmd("t", "w", "write"), None, handler, pending=1)
    await service.flush()
    client = await nats.connect(nats_url)
    replies: dict[str, list[dict[str, Any]]] = {}
    got = asyncio.Event()

    async def on_reply(msg: Msg) -> None:
        replies.setdefault(msg.subject, []).append(json.loads(msg.data))
        if sum(len(r) for r in replies.values()) == 20:
            got.set()

    await client.subscribe("_INBOX.drop.*", cb=on_reply)
    try:
        before = rejections("writer", "subscription")
        for i in range(20):
            await client.publish(S.cmd("t", "w", "write"), b"{}", reply=f"_INBOX.drop.{i}")
        await client.flush()
        await eventually(lambda: dropped.count >= 18)  # one handled, one pending, the rest dropped
        release.set()
        async with asyncio.timeout(10):
            await got.wait()
        assert len(replies) == 20 and all(len(r) == 1 for r in replies.values())
        refused = [r[0] for r in replies.values() if not r[0]["ok"]]
        assert len(refused) == dropped.count == 20 - len(handled)
        for reply in refused:
            busy(reply, "subscription")
        assert rejections("writer", "subscription") == before + len(refused)
    finally:
        release.set()
        await client.close()
        await service.close()


async def test_a_slow_consumer_drop_is_never_answered_into_a_refused_reply_subject(
    nats_url: str,
) -> None:
    """A dropped message whose reply subject a service never answers ($JS..., the request's
    own root) is only counted."""
    dropped = Dropped("reader")
    service = await bus.connect(nats_url, "flooded", on_dropped=dropped)
    release = asyncio.Event()

    async def handler(msg: Msg) -> None:
        await release.wait()

    await bus.serve(service, "ws.qry.t.w.read", None, handler, pending=1)
    await service.flush()
    client = await nats.connect(nats_url)
    seen: list[Msg] = []

    async def spy(msg: Msg) -> None:
        seen.append(msg)

    await client.subscribe("ws.evil.>", cb=spy)
    try:
        for _ in range(5):
            await client.publish("ws.qry.t.w.read", b"{}", reply="ws.evil.reply")
        await client.flush()
        await eventually(lambda: dropped.count >= 3)
        await client.flush()
        assert seen == []
    finally:
        release.set()
        await client.close()
        await service.close()


def test_the_busy_error_says_what_is_busy_and_when_to_retry() -> None:
    error = QuillError("UNAVAILABLE", "x", {"reason": "busy", "retry_after_ms": 250})
    from contracts.errors import busy as make
    from contracts.errors import retry_after_ms

    assert retry_after_ms(error) == 250 and error.retriable
    made = make("The reader", "queries", 100, limit=4)
    assert made.details == {"reason": "busy", "queue": "queries", "retry_after_ms": 100, "limit": 4}
    assert str(made) == "UNAVAILABLE: The reader is busy (queries queue full); retry in 100 ms"
    for hostile in (-1, "250", True, None, 2.5):
        assert retry_after_ms(QuillError("UNAVAILABLE", "x", {"retry_after_ms": hostile})) is None


@pytest.mark.parametrize("hint", [None, 0, 400, 10**9])
def test_the_sdk_waits_at_least_the_hint_and_never_past_its_cap(hint: int | None) -> None:
    from quill.client import MAX_RETRY_AFTER_S, backoff

    details = {} if hint is None else {"reason": "busy", "retry_after_ms": hint}
    last = QuillError("UNAVAILABLE", "busy", details)
    pauses = [backoff(attempt, last, 1.0) for attempt in (1, 2, 3, 8) for _ in range(20)]
    if hint is None:
        assert max(pauses) == 1.0 and min(pauses) == 0.2
    else:
        floor = min(max(hint / 1000, 0.2), MAX_RETRY_AFTER_S)
        assert min(pauses) >= floor and max(pauses) <= max(floor, 1.0) * 1.25


async def test_a_version_wait_that_times_out_leaves_nothing_behind(services: StartReader) -> None:
    """Before: each timed-out ``min_version`` wait stayed in the follower until its workspace
    was next written (never, for an idle one): memory grew with every such query."""
    reader = await services("r1")
    follower = reader.follower
    for _ in range(50):
        assert not await follower.wait_for("busy", "idle", 10**6, 0.001)
    assert follower._waiters == {} and follower.waiting == 0


async def test_version_waiters_are_bounded(services: StartReader) -> None:
    reader = await services("r2")
    follower = reader.follower
    follower.max_waiters = 2
    waiting = [asyncio.create_task(follower.wait_for("busy", "w", 10**6, 30)) for _ in range(2)]
    await eventually(lambda: follower.waiting == 2)
    before = rejections("reader", "version_waiters")
    with pytest.raises(QuillError) as refused:
        await follower.wait_for("busy", "w", 10**6, 30)
    assert refused.value.details["queue"] == "version_waiters" and refused.value.retriable
    assert rejections("reader", "version_waiters") == before + 1
    assert reader.info()["version_waiters"] == 2
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert follower._waiters == {} and follower.waiting == 0
