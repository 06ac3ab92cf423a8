"""Test helpers shared by unit and integration tests (no fixtures here); the pure ones
(``LogBuilder``, ``T0``) are in tests/core/build.py, re-exported here."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
from contextlib import AsyncExitStack
from pathlib import Path

import nats.errors
from nats.aio.client import Client as NATS

from infra import bus
from infra.runtime import Settings
from services.executor.app import Executor, ExecutorConfig
from services.executor.app import start_executor as start_exec
from services.reader.app import Reader
from services.reader.app import start_reader as run_reader
from services.reader.snapshots import SnapshotConfig
from services.writer.app import Writer
from services.writer.app import start_writer as run_writer
from services.writer.config import WriterConfig
from tests.core.build import T0, LogBuilder

__all__ = [
    "T0",
    "Gate",
    "LogBuilder",
    "answers",
    "services_see",
    "start_executor",
    "start_reader",
    "start_writer",
]


async def start_writer(
    stack: AsyncExitStack,
    nats_url: str,
    data: Path,
    config: WriterConfig | None = None,
    *,
    projection_rows: int | None = None,
) -> Writer:
    """Start an in-process writer, ready to answer; ``stack`` stops it. ``config``: its
    options (``quill writer``'s)."""
    settings = Settings(nats_url=nats_url, data_dir=data, projection_rows=projection_rows)
    running = await run_writer(settings, config)
    stack.push_async_callback(running.stop)
    await answers(nats_url, "writer", running.service.instance)
    return running.service


async def start_reader(
    stack: AsyncExitStack,
    nats_url: str,
    data: Path,
    instance: str = "",
    snapshots: SnapshotConfig | None = None,
    *,
    caught_up: bool = True,
    projection_rows: int | None = None,
) -> Reader:
    """Start an in-process reader replica, ready to answer; ``stack`` stops it. ``snapshots``:
    its options (``quill reader``'s). It has caught up with the log when this returns;
    ``caught_up=False``: as soon as it serves (it joins the queue group before, when near the
    log's end: ``services/reader/follower.py``)."""
    settings = Settings(
        nats_url=nats_url, data_dir=data, instance=instance, projection_rows=projection_rows
    )
    running = await run_reader(settings, snapshots)
    stack.push_async_callback(running.stop)
    await answers(nats_url, "reader", running.service.instance)
    await asyncio.wait_for(running.service.serving.wait(), 60)
    if caught_up:
        await asyncio.wait_for(running.service.follower.ready.wait(), 60)
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
                if not msg.data:  # the server's "no responders": not subscribed yet
                    await asyncio.sleep(0.05)
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


class Gate:
    """What lets a running command go on, whatever its sandbox: the command waits in a
    ``sleep`` of its own (``wait``, a shell snippet), which ``open`` ends. A file the test makes
    in the checkout would not do: a command over an overlay does not see its tree change
    (``infra.exec.layers``)."""

    def __init__(self) -> None:
        self.arg = f"86400.{secrets.randbelow(10**9):09d}"
        self.wait = f"sleep {self.arg} || :"

    def waiting(self) -> list[int]:
        """The pids of the sleeps the command waits in."""
        wanted = b"sleep\0" + self.arg.encode() + b"\0"
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/cmdline", "rb") as f:
                        if f.read() == wanted:
                            found.append(int(name))
                except OSError:
                    continue
        return found

    async def open(self, timeout: float = 30.0) -> None:
        """End the command's wait, once it waits (polling /proc: nothing to wait on)."""
        async with asyncio.timeout(timeout):
            while not (pids := self.waiting()):
                await asyncio.sleep(0.02)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
