"""Every stream and bucket is created idempotently, however many services start at once.

Services starting together each check for WS_EVENTS, WS_AUDIT, the WS_BLOBS object store and
the WS_BRIDGES and WS_LEASES buckets and create what is missing: two of them see the same
asset missing, both create it, and the loser must not exit (JetStream 10058, "stream name
already in use with a different configuration", when the winner has already changed the
configuration after creating it, as WS_BRIDGES does).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext
from nats.js.api import StreamConfig

from contracts.subjects import (
    BUCKET_BLOBS,
    BUCKET_BRIDGES,
    BUCKET_FORKS,
    BUCKET_LEASES,
    BUCKET_SNAPSHOT_LEASES,
    BUCKET_SNAPSHOTS,
    Subjects,
)
from infra import bridges, bus, fork_registry, snapshots
from quill.client import Quill
from quill_cli.natsserver import NatsServer
from quill_cli.stack import Stack
from services.writer.partitions import leases_bucket
from tests.helpers import start_executor, start_reader, start_writer

ROUNDS = 8
AT_ONCE = 6
SKEW_S = 0.003


async def _one_service(url: str, index: int, skew: float) -> None:
    """What a service does at start: every stream and bucket, on its own connection, in one
    of three orders, from ``skew`` seconds on (services never start in step)."""
    nc = await bus.connect(url, f"starter-{index}")
    try:
        js = nc.jetstream()
        await asyncio.sleep(skew)  # not a synchronisation: spreads the starts
        steps = [
            lambda: bus.ensure_streams(nc, Subjects()),
            lambda: bridges.bucket(js),
            lambda: leases_bucket(js, 1),
        ]
        turn = index % len(steps)
        for step in steps[turn:] + steps[:turn]:
            await step()
    finally:
        await nc.close()


async def _check(url: str, *, leases: bool = True, output: bool = False) -> None:
    """Each asset exists once, with the configuration the services rely on."""
    nc = await bus.connect(url, "checker")
    try:
        js = nc.jetstream()
        names = sorted(str(info.config.name) for info in await js.streams_info())
        assert names == sorted(
            [
                "WS_EVENTS",
                "WS_AUDIT",
                f"OBJ_{BUCKET_BLOBS}",
                f"KV_{BUCKET_BRIDGES}",
                f"OBJ_{BUCKET_SNAPSHOTS}",
                f"KV_{BUCKET_SNAPSHOT_LEASES}",
                f"KV_{BUCKET_FORKS}",
            ]
            + ([f"KV_{BUCKET_LEASES}"] if leases else [])
            + (["WS_OUTPUT", "WS_APPROVALS"] if output else [])  # an executor's (and a writer's)
        )
        events: StreamConfig = (await js.stream_info("WS_EVENTS")).config
        assert events.allow_atomic and events.allow_direct
        kv: StreamConfig = (await js.stream_info(f"KV_{BUCKET_BRIDGES}")).config
        assert kv.allow_direct and not kv.allow_rollup_hdrs
    finally:
        await nc.close()


async def test_many_starters_at_once_on_a_fresh_server(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        server = NatsServer(tmp_path / f"nats-{round_}").start()
        try:
            draw = random.Random(round_)
            results = await asyncio.gather(
                *(_one_service(server.url, i, draw.uniform(0, SKEW_S)) for i in range(AT_ONCE)),
                return_exceptions=True,
            )
            failures = [r for r in results if isinstance(r, BaseException)]
            assert not failures, f"round {round_}: {failures!r}"
            await _check(server.url)
        finally:
            server.stop()


Create = Callable[[JetStreamContext], Awaitable[object]]

ASSETS: dict[str, Create] = {
    "events": lambda js: bus._ensure_stream(js, bus._events_stream(Subjects(), 1)),
    "audit": lambda js: bus._ensure_stream(js, bus._audit_stream(Subjects(), 1)),
    "blobs": lambda js: bus._ensure_blobs(js, 1),
    "bridges": lambda js: bridges.bucket(js),
    "forks": lambda js: fork_registry.bucket(js, 1),
    "leases": lambda js: leases_bucket(js, 1),
    "snapshots": lambda js: snapshots.ensure_bucket(js, 1),
}


@pytest.mark.parametrize("asset", sorted(ASSETS))
async def test_a_create_that_loses_the_race_is_a_success(tmp_path: Path, asset: str) -> None:
    """The interleaving the stress above only sometimes hits, forced: a service looks and
    finds the asset missing; another creates it (and corrects its configuration) in full;
    only then does the first one's create arrive. It succeeds, and leaves the asset as
    Quill needs it."""
    server = NatsServer(tmp_path / "nats").start()
    try:
        late = await bus.connect(server.url, "late")
        early = await bus.connect(server.url, "early")
        looked, other_done = asyncio.Event(), asyncio.Event()
        js = late.jetstream()
        add_stream = js.add_stream

        async def add_stream_after_the_other(*args: Any, **kwargs: Any) -> Any:
            looked.set()  # it has looked, found nothing, and creates now
            await other_done.wait()
            return await add_stream(*args, **kwargs)

        js.add_stream = add_stream_after_the_other  # type: ignore[method-assign]
        creating = asyncio.create_task(ASSETS[asset](js))
        await asyncio.wait_for(looked.wait(), 10)
        for name in sorted(ASSETS):  # the other service: everything, corrected
            await ASSETS[name](early.jetstream())
        other_done.set()
        await asyncio.wait_for(creating, 10)
        await ASSETS[asset](js)  # and again: nothing left to do
        await early.close()
        await late.close()
        await _check(server.url)
    finally:
        server.stop()


async def test_services_started_together_all_serve(tmp_path: Path) -> None:
    """A writer, two readers and an executor started at the same moment on a fresh server:
    each starts, and a write and a read go through."""
    for round_ in range(ROUNDS):
        server = NatsServer(tmp_path / f"nats-{round_}").start()
        try:
            async with AsyncExitStack() as stack:
                data = tmp_path / f"round-{round_}"
                await asyncio.gather(
                    start_writer(stack, server.url, data / "writer"),
                    start_reader(stack, server.url, data / "reader-a", instance="a"),
                    start_reader(stack, server.url, data / "reader-b", instance="b"),
                    start_executor(stack, server.url, data / "executor"),
                )
                quill = await Quill.connect(server.url, actor="tester", timeout=10)
                stack.push_async_callback(quill.close)
                ws = quill.workspace(f"acme/round{round_}")
                await ws.create()
                await ws.write("a.txt", "hello\n")
                assert await ws.read_text("a.txt") == "hello\n"
            await _check(server.url, leases=False, output=True)  # one writer: no leases
        finally:
            server.stop()


async def test_service_processes_started_together_all_answer(tmp_path: Path) -> None:
    """``quill up``'s four service processes, started at the same moment on a fresh server
    (without restarts, so that one that exits fails the start instead of being started
    again): each answers its ping."""
    for round_ in range(2):
        server = NatsServer(tmp_path / f"nats-{round_}").start()
        try:
            data = tmp_path / f"up-{round_}"
            stack = Stack(data, nats_url=server.url, http_port=0, sandbox="local", restart=False)
            async with stack:
                assert all(child.alive() for child in stack.children)
            await _check(server.url, leases=False, output=True)
        finally:
            server.stop()
