"""A workspace claimed by a bridge (a local folder) is answered by the bridge alone: the
writer, readers and executors stay silent on its subjects."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts.errors import ErrorCode, QuillError
from infra import bridges
from quill.client import Quill
from services.executor.app import ExecutorConfig
from tests.conftest import StartReader
from tests.helpers import services_see, start_executor


async def test_servers_stay_silent_on_a_claimed_workspace(
    services: StartReader, nc: NATS, nats_url: str, tmp_path: Path
) -> None:
    await services("r1")
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "x", ExecutorConfig(sandbox="local"))
        kv = await bridges.bucket(nc.jetstream())
        await bridges.claim(kv, "acme", "laptop", "bridge-1", "macbook", "~/dev/app")
        await services_see(nc, 1)
        answered: list[str] = []

        async def bridge(msg: Msg) -> None:  # a slow bridge: any other answer would win
            await asyncio.sleep(0.3)
            answered.append(msg.subject)
            body = {"ok": True, "version": 0, "result": {"from": "the bridge"}}
            await msg.respond(json.dumps(body).encode())

        sub = await nc.subscribe("ws.*.acme.laptop.*", cb=bridge)
        quill = await Quill.connect(nats_url, retries=0)
        stack.push_async_callback(quill.close)
        for kind, op in (("cmd", "write"), ("qry", "read"), ("exec", "run")):
            body = {"path": "a.txt", "content": "x"} if op == "write" else {"path": "a.txt"}
            if op == "run":
                body = {"command": "true"}
            reply = await nc.request(
                f"ws.{kind}.acme.laptop.{op}", json.dumps(body).encode(), timeout=5
            )
            assert json.loads(reply.data)["result"] == {"from": "the bridge"}, kind
        assert len(answered) == 3

        await bridges.release(kv, "acme", "laptop")
        await sub.unsubscribe()
        await services_see(nc, 0)
        ws = quill.workspace("acme/laptop")
        with pytest.raises(QuillError) as info:  # released: the servers answer again
            await ws.read_text("a.txt")
        assert info.value.code == ErrorCode.WORKSPACE_NOT_FOUND
