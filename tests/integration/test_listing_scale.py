"""The workspace listing at scale (issue 17): paging through thousands of workspaces returns
each exactly once (alone in its module: the next test's reader need not catch up on them)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nats.aio.client import Client as NATS

from services.reader.app import Reader
from tests.conftest import StartReader

TENANT = "many"
COUNT = 2500


async def call(nc: NATS, subject: str, body: dict[str, Any] | None = None) -> Any:
    msg = await nc.request(subject, json.dumps(body or {}).encode(), timeout=30)
    return json.loads(msg.data)


async def build(nc: NATS, names: list[str], clients: int = 64, tenant: str = TENANT) -> None:
    todo = iter(names)

    async def client() -> None:
        for name in todo:
            assert (await call(nc, f"ws.cmd.{tenant}.{name}.create"))["ok"]

    await asyncio.gather(*[client() for _ in range(clients)])


async def caught_up(reader: Reader, names: list[str], tenant: str = TENANT) -> None:
    for name in names:
        assert await reader.follower.wait_for(tenant, name, 1, 30)


async def test_paging_through_thousands_returns_each_once(services: StartReader, nc: NATS) -> None:
    reader = await services("r1")
    names = [f"w{i:05d}" if i % 3 else f"x-{i}" for i in range(COUNT)]
    await build(nc, names)
    await caught_up(reader, names)
    for limit, prefix in ((1000, None), (97, None), (50, "x-")):
        seen: list[str] = []
        after: str | None = None
        while True:
            body: dict[str, Any] = {"limit": limit}
            if after is not None:
                body["after"] = after
            if prefix is not None:
                body["prefix"] = prefix
            page = await call(nc, f"ws.qry.{TENANT}._.workspaces", body)
            assert page["ok"], page
            got = [w["workspace"] for w in page["result"]["workspaces"]]
            assert len(got) <= limit
            seen += got
            after = page["result"]["next"]
            if after is None:
                break
        wanted = sorted(n for n in names if prefix is None or n.startswith(prefix))
        assert seen == wanted  # each exactly once, in order
