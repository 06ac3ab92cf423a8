"""A flood on a bridge's workspace is refused busy past ``BRIDGE_MAX_INFLIGHT``, each request
answered exactly once (bare nats-py: one publish per request, its own reply inbox)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg

from contracts.limits import BRIDGE_MAX_INFLIGHT
from contracts.subjects import Subjects
from quill.client import Quill
from tests.bridge.conftest import Attach

N = 3 * BRIDGE_MAX_INFLIGHT


async def test_a_flood_of_queries_is_answered_once_each_ok_or_busy(
    servers: None, attach: Attach, client: Quill, nats_url: str, tmp_path: Path
) -> None:
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "a.txt").write_text("hello\n")
    bridge = await attach(tmp_path / "here", "flooded")
    replies: dict[str, list[dict[str, Any]]] = {}
    all_in = asyncio.Event()
    nc = await nats.connect(nats_url)

    async def on_reply(msg: Msg) -> None:
        replies.setdefault(msg.subject, []).append(json.loads(msg.data))
        if len(replies) == N:
            all_in.set()

    await nc.subscribe("_INBOX.bf.*", cb=on_reply, pending_msgs_limit=2 * N)
    try:
        subject = Subjects().qry("acme", "flooded", "read")
        for i in range(N):
            await nc.publish(subject, b'{"path": "a.txt"}', reply=f"_INBOX.bf.{i}")
        await nc.flush()
        async with asyncio.timeout(120):
            await all_in.wait()
        await nc.flush()
    finally:
        await nc.close()
    assert all(len(r) == 1 for r in replies.values())
    outcomes = Counter(
        "ok"
        if r[0]["ok"]
        else f"{r[0]['error']['details'].get('reason')}:{r[0]['error']['details'].get('queue')}"
        for r in replies.values()
    )
    assert set(outcomes) <= {"ok", "busy:requests"}, outcomes
    assert outcomes["ok"] > 0 and outcomes["busy:requests"] > 0, outcomes
    async with asyncio.timeout(30):  # served as before once the flood is over
        assert (await client.workspace("acme/flooded").read("a.txt")).content == "hello\n"
    assert await bridge.stop() == 0
