"""Reading a workspace's log for replay (``quill_cli/tools/replay.py``, ``messages``): batched
direct gets answered into a callback, the next batch asked for while the caller folds the one
before. Every event comes once, in order, whatever the batch size and whatever else the stream
holds; a caller that stops early leaves nothing subscribed; a server that does not answer is
``UNAVAILABLE``, not a hang; an answer that is not a direct get's is refused."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from contracts import codec
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Subjects
from infra import bus
from quill_cli.natsserver import NatsServer
from quill_cli.tools import replay as rpl
from tests.helpers import LogBuilder

SUBJECTS = Subjects()


@pytest.fixture
async def nc(tmp_path: Path) -> AsyncIterator[NATS]:
    """A server of its own (the logs here are written behind any writer's back)."""
    server = NatsServer(tmp_path / "nats").start()
    try:
        conn = await bus.connect(server.url, "test-replay-read")
        await bus.ensure_streams(conn, SUBJECTS)
        yield conn
        await conn.close()
    finally:
        server.stop()


def built(workspace: str, writes: int) -> LogBuilder:
    log = LogBuilder("acme", workspace)
    log.run(rq.CreateWorkspace(), "create")
    for n in range(writes):
        log.run(rq.WriteFile(path=f"f{n % 3}.txt", content=f"{workspace} {n}\n"))
    return log


async def append(nc: NATS, log: LogBuilder, after: int, first: int, last: int) -> int:
    ws = log.state.workspace
    items = [(codec.encode(c.event), f"{ws}-{c.seq}", c.hash) for c in log.log[first:last]]
    return await rpl.append_batch(nc, SUBJECTS.evt("acme", ws), after, items, first + 1)


async def test_every_event_once_in_order_across_batches_and_other_subjects(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workspaces' logs interleaved on the stream, batches of 4: the reader yields one
    workspace's payloads, each once, in order, and the replay checks out."""
    monkeypatch.setattr(rpl, "BATCH", 4)
    mine, other = built("mine", 20), built("other", 20)
    a = b = 0
    for i in range(0, 21, 3):  # 3 of mine, then 3 of the other, ...
        a = await append(nc, mine, a, i, i + 3)
        b = await append(nc, other, b, i, i + 3)
    js = nc.jetstream()
    sizes, payloads = [], []
    async with contextlib.aclosing(rpl.messages(js, SUBJECTS.evt("acme", "mine"))) as batches:
        async for batch in batches:
            sizes.append(len(batch))
            payloads += batch
    assert payloads == [(codec.encode(c.event), c.hash) for c in mine.log]
    assert max(sizes) == 4 and sum(sizes) == 21
    fold = await rpl.replay(js, SUBJECTS, "acme", "mine")
    assert (fold.version, fold.last_hash) == (21, mine.log[-1].hash)


async def test_a_reader_closed_early_leaves_no_subscription(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing the reader after one batch (a replay ``--to-version`` stops there) while the
    next batch is being answered unsubscribes its inbox."""
    monkeypatch.setattr(rpl, "BATCH", 2)
    log = built("early", 9)
    await append(nc, log, 0, 0, 10)
    before = len(nc._subs)
    async with contextlib.aclosing(
        rpl.messages(nc.jetstream(), SUBJECTS.evt("acme", "early"))
    ) as batches:
        first = await anext(batches)
    assert len(first) == 2
    assert len(nc._subs) == before
    fold = await rpl.replay(nc.jetstream(), SUBJECTS, "acme", "early", to_version=3)
    assert fold.version == 3


async def test_no_answer_is_unavailable_not_a_hang(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Direct gets taken by something that never answers end in ``UNAVAILABLE`` once
    ``IDLE_S`` passes without a message."""
    monkeypatch.setattr(rpl, "IDLE_S", 0.3)
    prefix = "$SILENT.API"

    async def silent(msg: object) -> None:
        pass

    sub = await nc.subscribe(f"{prefix}.DIRECT.GET.WS_EVENTS", cb=silent)
    try:
        with pytest.raises(QuillError) as unanswered:
            js = nc.jetstream(prefix=prefix)
            async with contextlib.aclosing(rpl.messages(js, SUBJECTS.evt("acme", "x"))) as batches:
                await anext(batches)
        assert unanswered.value.code == ErrorCode.UNAVAILABLE
        assert "no answer" in unanswered.value.message
    finally:
        await sub.unsubscribe()


async def test_an_answer_without_a_sequence_is_refused(nc: NATS) -> None:
    """Something answering the direct-get subject with messages that are not a server's
    answers (no ``Nats-Sequence``) is refused as a log that does not verify, not folded."""
    prefix = "$FAKE.API"

    async def impostor(msg: object) -> None:
        await nc.publish(msg.reply, b'{"not":"an event"}', headers={"Ws-Event-Hash": "x"})  # type: ignore[attr-defined]

    sub = await nc.subscribe(f"{prefix}.DIRECT.GET.WS_EVENTS", cb=impostor)
    try:
        with pytest.raises(QuillError) as refused:
            js = nc.jetstream(prefix=prefix)
            async with contextlib.aclosing(rpl.messages(js, SUBJECTS.evt("acme", "x"))) as batches:
                await anext(batches)
        assert refused.value.code == ErrorCode.INTERNAL
    finally:
        await sub.unsubscribe()
