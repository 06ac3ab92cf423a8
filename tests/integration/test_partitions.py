"""Writers sharing command partitions (leases in WS_LEASES, epochs fencing the log), on a
real nats-server whose subject mapping spreads commands over the partitions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Subjects
from infra import bus
from infra.runtime import Running, Settings
from quill.client import Quill
from quill_cli.natsserver import NatsServer
from services.writer.app import Writer, start_writer
from services.writer.append import AppendError, Group
from services.writer.config import WriterConfig
from tests.helpers import answers, eventually, partitioned_nats, start_reader
from tests.system.checks import verify_chain

PARTITIONS = 8
TTL = 2.0


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    with partitioned_nats(tmp_path_factory.mktemp("nats"), PARTITIONS) as server:
        yield server


class Writers:
    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.running: dict[str, Running[Writer]] = {}

    async def start(self, name: str, ttl: float = TTL) -> Writer:
        settings = Settings(nats_url=self.url, data_dir=self.tmp / name, instance=name)
        config = WriterConfig(partitions=PARTITIONS, lease_ttl=ttl)
        running = self.running[name] = await start_writer(settings, config)
        await answers(self.url, "writer", name)
        return running.service

    async def stop(self, name: str) -> None:
        await self.running.pop(name).stop()

    async def crash(self, name: str) -> None:
        """Stop serving without handing anything back (its leases run out)."""
        writer = self.running.pop(name).service
        partitions = writer.partitions
        assert partitions is not None
        partitions._stopping = True
        for task in partitions._tasks:
            task.cancel()
        for lease in partitions.held.values():
            if lease.sub is not None:
                await lease.sub.unsubscribe()
        await writer.nc.close()
        await writer.appender.stop()
        await writer.store.close()


@pytest_asyncio.fixture
async def writers(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Writers]:
    group = Writers(nats_server.url, tmp_path)
    yield group
    for name in list(group.running):
        await group.stop(name)


async def held(writer: Writer) -> set[int]:
    assert writer.partitions is not None
    return set(writer.partitions.held)


async def test_writers_share_the_partitions_and_take_over_when_one_goes(
    writers: Writers, nats_server: NatsServer, tmp_path: Path
) -> None:
    a = await writers.start("writer-a")
    assert await held(a) == set(range(PARTITIONS))  # alone, it serves everything
    b = await writers.start("writer-b")

    async def balanced() -> bool:
        ha, hb = await held(a), await held(b)
        return len(ha) == len(hb) == PARTITIONS // 2 and not ha & hb

    await eventually(balanced)

    async with AsyncExitStack() as stack:
        await start_reader(stack, nats_server.url, tmp_path / "reader")
        quill = await Quill.connect(nats_server.url, actor="tester", timeout=5)
        stack.push_async_callback(quill.close)
        names = [f"acme/ws{i}" for i in range(12)]
        for name in names:
            ws = quill.workspace(name)
            await ws.create()
            await ws.write("a.txt", f"{name} one")
        answered = {
            p["instance"]
            for p in await bus.ping_all(quill.nc, Subjects(), "writer")
            if p.get("workspaces")
        }
        assert answered == {"writer-a", "writer-b"}  # both served some of them

        # One goes without handing back its partitions: the other takes them all once the
        # leases run out, and every workspace can be written again (the SDK retries).
        await writers.crash("writer-a")
        for name in names:
            await quill.workspace(name).write("a.txt", f"{name} two")
        assert await held(b) == set(range(PARTITIONS))
        for name in names:
            assert await quill.workspace(name).read_text("a.txt") == f"{name} two"
            await verify_chain(quill.nc, *name.split("/"))


async def test_a_writer_that_lost_its_partition_cannot_append(
    writers: Writers, nats_server: NatsServer
) -> None:
    a = await writers.start("writer-a")
    quill = await Quill.connect(nats_server.url, actor="tester", timeout=5)
    try:
        ws = quill.workspace("acme/fenced")
        await ws.create()
        await ws.write("a.txt", "one")
        actor = a.actors.get("acme", "fenced")
        assert actor.fence is not None and actor.partition is not None
        stale = actor.fence
        # Another writer bumps the partition's epoch (as when it takes the partition over).
        nc: NATS = await bus.connect(nats_server.url, "intruder")
        try:
            js = nc.jetstream()
            last = await js.get_last_msg("WS_EVENTS", stale.subject)
            await js.publish(
                stale.subject,
                b'{"epoch": 99}',
                headers={"Nats-Expected-Last-Subject-Sequence": str(last.seq)},
            )
        finally:
            await nc.close()
        # Even with the right workspace sequence, the old epoch's append is refused...
        state = actor.state
        assert state is not None
        group = Group(
            actor.subject, state.last_seq, [b"{}"], ["intruder-1"], ["0" * 64], fence=stale
        )
        with pytest.raises(AppendError):
            await a.appender.submit(group)
        # ... and a command finds the partition gone: a retriable error, nothing appended.
        once = await Quill.connect(nats_server.url, timeout=5, retries=0)
        try:
            with pytest.raises(QuillError) as caught:
                await once.workspace("acme/fenced").write("b.txt", "two")
        finally:
            await once.close()
        assert caught.value.code == ErrorCode.UNAVAILABLE
        assert actor.partition not in await held(a)
        await verify_chain(quill.nc, "acme", "fenced")
    finally:
        await quill.close()


async def test_a_writer_stopping_hands_its_partitions_over_at_once(
    writers: Writers, nats_server: NatsServer
) -> None:
    # Leases of a minute: the other writer can only have them this soon if they were handed
    # back, not left to expire.
    a = await writers.start("writer-a", ttl=60)
    b = await writers.start("writer-b", ttl=60)

    async def balanced() -> bool:
        return len(await held(a)) == len(await held(b)) == PARTITIONS // 2

    await eventually(balanced)
    quill = await Quill.connect(nats_server.url, timeout=5)
    try:
        names = [f"acme/handover{i}" for i in range(8)]
        for name in names:
            await quill.workspace(name).create()
        await writers.stop("writer-b")

        async def all_on_a() -> bool:
            return await held(a) == set(range(PARTITIONS))

        await eventually(all_on_a, timeout=20)
        for name in names:
            await quill.workspace(name).write("a.txt", "after the handover")
            await verify_chain(quill.nc, *name.split("/"))
    finally:
        await quill.close()


async def test_a_writer_with_another_partition_count_refuses_to_start(
    writers: Writers, nats_server: NatsServer, tmp_path: Path
) -> None:
    await writers.start("writer-a")
    settings = Settings(nats_url=nats_server.url, data_dir=tmp_path / "odd", instance="odd")
    config = WriterConfig(partitions=PARTITIONS * 2, lease_ttl=TTL)
    with pytest.raises(RuntimeError, match=f"this deployment has {PARTITIONS} partitions"):
        await start_writer(settings, config)


async def test_partition_of_is_the_servers_mapping(nats_server: NatsServer) -> None:
    nc = await bus.connect(nats_server.url, "mapping")
    try:
        seen: dict[str, str] = {}
        done = asyncio.Event()
        names = [(f"t{i % 7}", f"ws-{i}_{i * 31 % 97}") for i in range(300)]

        async def on(msg: Msg) -> None:
            seen[".".join(msg.subject.split(".")[3:5])] = msg.subject.split(".")[2]
            if len(seen) == len(names):
                done.set()

        await nc.subscribe("ws.cmdp.>", cb=on)
        await nc.flush()
        for tenant, ws in names:
            await nc.publish(Subjects().cmd(tenant, ws, "noop"), b"")
        await asyncio.wait_for(done.wait(), 10)
        for tenant, ws in names:
            assert int(seen[f"{tenant}.{ws}"]) == Subjects.partition_of(tenant, ws, PARTITIONS)
    finally:
        await nc.close()


async def test_a_command_sent_to_another_partition_by_hand_is_refused(
    writers: Writers, nats_server: NatsServer
) -> None:
    await writers.start("writer-a")
    home = Subjects.partition_of("acme", "astray", PARTITIONS)
    wrong = (home + 1) % PARTITIONS
    nc = await bus.connect(nats_server.url, "astray")
    try:
        reply = await nc.request(f"ws.cmdp.{wrong}.acme.astray.create", b"{}", timeout=5)
        assert json.loads(reply.data)["error"]["code"] == "ACCESS_DENIED"
        reply = await nc.request(f"ws.cmdp.{home}.acme.astray.create", b"{}", timeout=5)
        assert json.loads(reply.data)["ok"] is True
    finally:
        await nc.close()
