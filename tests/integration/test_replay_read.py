"""Reading a workspace's log for replay (``quill_cli/tools/replay/read.py``, ``messages``): a pull
consumer of its own, fetched into a callback, the next batch asked for while the caller folds
the one before. Every event comes once, in order, whatever the batch size and whatever else the
stream holds, even when the consumer is lost midway; a caller that stops early leaves nothing
subscribed and no consumer; a server that does not answer is ``UNAVAILABLE``, not a hang;
answers that skip a message are refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts import codec
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Subjects
from infra import bus
from quill_cli.natsserver import NatsServer
from quill_cli.tools import replay as rpl
from quill_cli.tools.replay import read as rpl_read
from tests.helpers import LogBuilder, eventually

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
    monkeypatch.setattr(rpl_read, "BATCH", 4)
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


async def test_a_reader_closed_early_leaves_no_subscription_and_no_consumer(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing the reader after one batch (a replay ``--to-version`` stops there) while the
    next batch is being answered unsubscribes its inbox."""
    monkeypatch.setattr(rpl_read, "BATCH", 2)
    log = built("early", 9)
    await append(nc, log, 0, 0, 10)
    before = len(nc._subs)
    async with contextlib.aclosing(
        rpl.messages(nc.jetstream(), SUBJECTS.evt("acme", "early"))
    ) as batches:
        first = await anext(batches)
    assert len(first) == 2
    assert len(nc._subs) == before
    assert await nc.jetstream().consumers_info("WS_EVENTS") == []
    fold = await rpl.replay(nc.jetstream(), SUBJECTS, "acme", "early", to_version=3)
    assert fold.version == 3


async def test_a_consumer_lost_midway_is_made_again_from_where_it_was(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server deletes the reading consumer (unused for ``INACTIVE_S``: the caller was
    slow) between two batches: the reader makes another from the next message on, and every
    event still comes once, in order; none is left on the server afterwards."""
    monkeypatch.setattr(rpl_read, "BATCH", 3)
    log = built("lost", 10)
    await append(nc, log, 0, 0, 11)
    js = nc.jetstream()
    got, deleted = [], 0
    async with contextlib.aclosing(rpl.messages(js, SUBJECTS.evt("acme", "lost"))) as batches:
        async for batch in batches:
            got += batch
            if deleted < 2:
                for consumer in await js.consumers_info("WS_EVENTS"):
                    await js.delete_consumer("WS_EVENTS", consumer.name)
                    deleted += 1
    assert deleted == 2
    assert got == [(codec.encode(c.event), c.hash) for c in log.log]
    assert await js.consumers_info("WS_EVENTS") == []


class FakeJetStream:
    """Something answering a JetStream API prefix: consumers are made, fetches are answered
    by ``answer(reply)`` (by nothing when it is None)."""

    def __init__(self, nc: NATS, answer: Callable[[str], Awaitable[None]] | None) -> None:
        self.nc, self.answer, self.prefix = nc, answer, "$FAKE.API"

    async def __aenter__(self) -> FakeJetStream:
        async def create(msg: Msg) -> None:
            info = {
                "stream_name": "WS_EVENTS",
                "name": "fake",
                "config": {},
                "created": "2026-01-01T00:00:00Z",
            }
            await self.nc.publish(msg.reply, json.dumps(info).encode())

        async def fetch(msg: Msg) -> None:
            if self.answer is not None:
                await self.answer(msg.reply)

        self.subs = [
            await self.nc.subscribe(f"{self.prefix}.CONSUMER.CREATE.>", cb=create),
            await self.nc.subscribe(f"{self.prefix}.CONSUMER.MSG.NEXT.>", cb=fetch),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for sub in self.subs:
            await sub.unsubscribe()

    async def first_batch(self) -> list[rpl.Raw]:
        js = self.nc.jetstream(prefix=self.prefix)
        async with contextlib.aclosing(rpl.messages(js, SUBJECTS.evt("acme", "x"))) as batches:
            return await anext(batches)


async def refusal(nc: NATS, answer: Callable[[str], Awaitable[None]] | None) -> QuillError:
    """What the first fetch of the log raises where ``FakeJetStream(nc, answer)`` answers."""
    async with FakeJetStream(nc, answer) as fake:
        with pytest.raises(QuillError) as refused:
            await fake.first_batch()
    return refused.value


async def test_no_answer_is_unavailable_not_a_hang(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fetches taken by something that never answers end in ``UNAVAILABLE`` once ``IDLE_S``
    passes without a message."""
    monkeypatch.setattr(rpl_read, "IDLE_S", 0.3)
    unanswered = await refusal(nc, None)
    assert unanswered.code == ErrorCode.UNAVAILABLE
    assert "no answer" in unanswered.message


async def test_answers_that_skip_a_message_are_refused(nc: NATS) -> None:
    """A fetch answered with consumer sequences 1 then 3 (a message lost between) is refused
    as not the log, not folded as if nothing were missing."""

    async def skipping(reply: str) -> None:
        for dseq in (1, 3):
            # (no client may publish with a $JS.ACK reply; the reader reads its tokens from the end)
            ack = f"fake.ack.WS_EVENTS.fake.1.{dseq}.{dseq}.0.{5 - dseq}"
            await nc.publish(reply, b"{}", headers={"Ws-Event-Hash": "x"}, reply=ack)
        await nc.publish(reply, b"", headers={"Status": "404"})

    refused = await refusal(nc, skipping)
    assert refused.code == ErrorCode.INTERNAL
    assert "skipped a message" in refused.message


async def test_a_status_that_is_not_the_end_is_unavailable(nc: NATS) -> None:
    """A fetch answered by a status other than "nothing left" or "bytes used up" (here 408)
    is ``UNAVAILABLE`` with the server's words."""

    async def refusing(reply: str) -> None:
        headers = {"Status": "408", "Description": "Request Timeout"}
        await nc.publish(reply, b"", headers=headers)

    refused = await refusal(nc, refusing)
    assert refused.code == ErrorCode.UNAVAILABLE
    assert "408 Request Timeout" in refused.message


async def test_a_late_status_of_one_fetch_does_not_end_the_next(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch filled to its count whose server also ends it with a status (a 409 for the
    bytes used up) after the next fetch was sent: that status belongs to the first fetch, and
    the second still brings its messages (it used to be read as "a message larger than the
    fetch's bytes", failing a replay of a good log)."""
    monkeypatch.setattr(rpl_read, "BATCH", 2)
    replies: list[str] = []

    def message(dseq: int) -> tuple[bytes, dict[str, str], str]:
        ack = f"fake.ack.WS_EVENTS.fake.1.{dseq}.{dseq}.0.{3 - dseq}"
        return f'{{"n": {dseq}}}'.encode(), {"Ws-Event-Hash": f"h{dseq}"}, ack

    async def answering(reply: str) -> None:
        replies.append(reply)
        if len(replies) == 1:
            for dseq in (1, 2):
                data, headers, ack = message(dseq)
                await nc.publish(reply, data, headers=headers, reply=ack)
            return
        late = {"Status": "409", "Description": "Message Size Exceeds MaxBytes"}
        await nc.publish(replies[0], b"", headers=late)  # the first fetch's, arriving late
        data, headers, ack = message(3)
        await nc.publish(reply, data, headers=headers, reply=ack)
        await nc.publish(reply, b"", headers={"Status": "404"})  # nothing more

    async with FakeJetStream(nc, answering) as fake:
        js = fake.nc.jetstream(prefix=fake.prefix)
        got: list[rpl.Raw] = []
        async with contextlib.aclosing(rpl.messages(js, SUBJECTS.evt("acme", "x"))) as batches:
            async for batch in batches:
                got += batch
    assert [data for data, _ in got] == [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']
    assert len(set(replies)) == len(replies) == 2  # each fetch answered on its own subject


async def test_a_fetch_its_consumer_dropped_unanswered_is_asked_again(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer is deleted as a fetch comes and the server drops the fetch (no 409, no
    503: seen under load): past ``PROBE_S`` the reader asks whether its consumer is there,
    makes another from where it was and reads on, instead of failing after ``IDLE_S``."""
    monkeypatch.setattr(rpl_read, "PROBE_S", 0.2)
    created: list[str] = []
    fetches: list[str] = []

    async def answering(reply: str) -> None:
        fetches.append(reply)
        if len(fetches) == 1:
            return  # the first consumer's fetch: dropped
        ack = "fake.ack.WS_EVENTS.fake.1.1.1.0.0"
        await nc.publish(reply, b'{"n": 1}', headers={"Ws-Event-Hash": "h1"}, reply=ack)
        await nc.publish(reply, b"", headers={"Status": "404"})  # nothing more

    async def info(msg: Msg) -> None:
        gone = {"error": {"code": 404, "err_code": 10014, "description": "consumer not found"}}
        await nc.publish(msg.reply, json.dumps(gone).encode())

    async with FakeJetStream(nc, answering) as fake:

        async def count(msg: Msg) -> None:
            created.append(msg.subject)

        counted = await nc.subscribe(f"{fake.prefix}.CONSUMER.CREATE.>", cb=count)
        asked = await nc.subscribe(f"{fake.prefix}.CONSUMER.INFO.>", cb=info)
        js = fake.nc.jetstream(prefix=fake.prefix)
        async with contextlib.aclosing(rpl.messages(js, SUBJECTS.evt("acme", "x"))) as batches:
            got = await asyncio.wait_for(anext(batches), 20)
        await counted.unsubscribe()
        await asked.unsubscribe()
    assert [data for data, _ in got] == [b'{"n": 1}']
    assert len(fetches) == 2
    await eventually(lambda: len(created) == 2, what="a second consumer made")
