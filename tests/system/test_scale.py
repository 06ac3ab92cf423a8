"""Many workspaces on ``quill up`` (issue 17, the short CI version; ``python -m bench scale``
measures it): 2,000 workspaces against a writer holding at most 500; a cold write (to one
it dropped) and a warm one both commit, a retried request id of a dropped workspace gets
its first reply, and the writer never holds more than its budget. No clock is asserted."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from tests.system.conftest import running

COUNT = 2000
BUDGET = 500
TENANT = "scale"


async def call(nc: NATS, name: str, op: str, body: dict[str, Any], request_id: str) -> Any:
    msg = await nc.request(
        f"ws.cmd.{TENANT}.{name}.{op}",
        json.dumps(body).encode(),
        timeout=30,
        headers={"Ws-Request-Id": request_id},
    )
    return json.loads(msg.data)


async def held(nc: NATS) -> int:
    pong = json.loads((await nc.request("ws.sys.ping.writer", b"", timeout=10)).data)
    assert pong["budget"] == BUDGET
    count: int = pong["workspaces"]
    assert count <= BUDGET
    return count


async def scenario(url: str) -> None:
    nc = await nats.connect(url)
    try:
        todo = iter(range(COUNT))
        creates: dict[int, Any] = {}
        writes: dict[int, Any] = {}

        async def client() -> None:
            for i in todo:
                creates[i] = await call(nc, f"w{i}", "create", {}, f"c{i}")
                assert creates[i]["ok"]
                body = {"path": "f", "content": f"{i}\n"}
                writes[i] = await call(nc, f"w{i}", "write", body, f"w{i}")
                assert writes[i]["version"] == 2
                if i % 250 == 0:
                    await held(nc)

        await asyncio.gather(*[client() for _ in range(64)])
        assert await held(nc) == BUDGET  # full, not more
        # w0 was dropped long ago: a cold write, then a warm one
        cold = await call(nc, "w0", "write", {"path": "f", "content": "cold\n"}, "cold")
        warm = await call(nc, "w0", "write", {"path": "f", "content": "warm\n"}, "warm")
        assert (cold["version"], warm["version"]) == (3, 4)
        # a retry of a dropped workspace's request: its first reply, nothing committed
        assert await call(nc, "w1", "write", {"path": "f", "content": "x\n"}, "w1") == writes[1]
        assert await call(nc, "w2", "create", {}, "c2") == creates[2]  # not ALREADY_EXISTS
        read = await nc.request(
            f"ws.qry.{TENANT}.w1.read",
            json.dumps({"path": "f", "min_version": 2}).encode(),
            timeout=30,
        )
        assert json.loads(read.data)["result"]["content"] == "1\n"
        await held(nc)
    finally:
        await nc.close()


def test_two_thousand_workspaces_on_a_writer_holding_five_hundred(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUILL_WRITER_WORKSPACES", str(BUDGET))
    with running(tmp_path / ".quill") as up:
        asyncio.run(scenario(up.nats_url))


@pytest.mark.parametrize("value", ["0", "-5", "many"])
def test_a_writer_budget_that_is_not_a_positive_count_is_refused(
    value: str, tmp_path: Path
) -> None:
    argv = ["writer", "--data", str(tmp_path), "--max-workspaces", value]
    result = subprocess.run(
        [sys.executable, "-m", "quill", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "QUILL_NATS_URL": "nats://127.0.0.1:1"},  # never reached
    )
    assert result.returncode == 2, result.stderr
    assert "--max-workspaces" in result.stderr
