"""Test helpers shared by unit and integration tests (no fixtures here)."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats.errors
from nats.aio.client import Client as NATS

from contracts import codec, hashing
from contracts import requests as rq
from contracts.events import PutFile
from contracts.subjects import Origin
from core.decide import decide
from core.decision import Context, to_event
from core.plan import Committed
from core.tree import WorkspaceState, fold
from infra import bus
from infra.runtime import Settings, start_service
from services.executor.app import Executor, ExecutorConfig
from services.executor.app import start_executor as start_exec
from services.reader.app import Reader
from services.writer.app import Writer

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class LogBuilder:
    """Decide commands like the writer does and keep the committed log, without NATS."""

    def __init__(self, tenant: str = "acme", workspace: str = "demo") -> None:
        self.state = WorkspaceState(tenant, workspace)
        self.log: list[Committed] = []
        self.contents: dict[str, bytes] = {}
        self.seq = 0

    def run(self, cmd: rq.Request, op: str = "write") -> None:
        past = self.replay(cmd.version).tree if isinstance(cmd, rq.RestorePath) else None
        ctx = Context(
            version=self.state.version + 1,
            at=T0 + timedelta(seconds=self.state.version),
            content=self.contents.get,
            past=past,
        )
        with self.state.tree.savepoint():
            decision = decide(self.state, cmd, ctx)
            assert decision.commits, cmd
            event = to_event(self.state, decision, ctx, op, Origin(f"req-{ctx.version}"))
        for change in decision.changes:
            if isinstance(change, PutFile) and (change.text is not None or change.data):
                self.contents[change.sha256] = (
                    change.text.encode() if change.text is not None else change.data or b""
                )
        payload = codec.encode(event)
        self.seq += 1
        digest = hashing.event_hash(payload)
        # fold onto a copy of the pre-decision state is what the log says; the tree already
        # holds the decision's changes, so only the log position moves here.
        self.state.version, self.state.last_hash, self.state.last_seq = (
            event.version,
            digest,
            self.seq,
        )
        if decision.created is not None:
            self.state.exists = True
            self.state.trust, self.state.limits = decision.created
        self.log.append(Committed(codec.decode_event(payload), digest, self.seq))

    def replay(self, upto: int | None = None) -> WorkspaceState:
        """Rebuild the state from the log alone (up to version ``upto``)."""
        state = WorkspaceState(self.state.tenant, self.state.workspace)
        for item in self.log:
            if upto is not None and item.event.version > upto:
                break
            fold(state, item.event, item.hash, item.seq)
        return state


async def start_writer(stack: AsyncExitStack, nats_url: str, data: Path) -> Writer:
    """Start an in-process writer, ready to answer; ``stack`` stops it."""
    running = await start_service(Settings(nats_url=nats_url, data_dir=data), "writer", Writer)
    stack.push_async_callback(running.stop)
    await answers(nats_url, "writer", running.service.instance)
    return running.service


async def start_reader(
    stack: AsyncExitStack, nats_url: str, data: Path, instance: str = ""
) -> Reader:
    """Start an in-process reader replica, ready to answer; ``stack`` stops it."""
    settings = Settings(nats_url=nats_url, data_dir=data, instance=instance)
    running = await start_service(settings, "reader", Reader)
    stack.push_async_callback(running.stop)
    await answers(nats_url, "reader", running.service.instance)
    # a replica joins the queue group once it has caught up with the log
    await asyncio.wait_for(running.service.serving.wait(), 60)
    return running.service


async def start_executor(
    stack: AsyncExitStack, nats_url: str, data: Path, config: ExecutorConfig | None = None
) -> Executor:
    """Start an in-process executor, ready to answer; ``stack`` stops it."""
    running = await start_exec(
        Settings(nats_url=nats_url, data_dir=data), config or ExecutorConfig()
    )
    stack.push_async_callback(running.stop)
    await answers(nats_url, "executor", running.service.instance)
    return running.service


async def answers(nats_url: str, service: str, instance: str, timeout: float = 10.0) -> None:
    """Wait until ``instance`` answers a ping from another connection, as ``quill up`` does."""
    nc = await bus.connect(nats_url, "test-readiness")
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        async with asyncio.timeout(timeout):
            while True:
                await nc.publish(f"ws.sys.ping.{service}", b"", reply=inbox)
                try:
                    msg = await sub.next_msg(timeout=0.5)
                except nats.errors.TimeoutError:
                    continue
                if json.loads(msg.data)["instance"] == instance:
                    return
    finally:
        await nc.close()


async def services_see(
    nc: NATS,
    claims: int,
    services: tuple[str, ...] = ("writer", "reader", "executor"),
    timeout: float = 20.0,
) -> None:
    """Wait until each of ``services`` reports ``claims`` live bridge claims
    (``local_workspaces`` in its ping): they learn claims by watching the bucket."""
    async with asyncio.timeout(timeout):
        for service in services:
            while True:
                pong = await nc.request(f"ws.sys.ping.{service}", b"", timeout=2)
                if json.loads(pong.data)["local_workspaces"] == claims:
                    break
                await asyncio.sleep(0.01)  # polling a ping: nothing to wait on instead
