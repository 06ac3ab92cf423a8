"""A flood of requests against a real ``quill up`` is refused, not absorbed.

A cheap client (bare nats-py: one publish per request, each with its own reply inbox, no SDK)
sends thousands of requests at once: writes to a few workspaces, and queries asking for a
version far ahead. Checked: every request gets exactly one reply, which is a result, a busy
answer (``UNAVAILABLE``, ``details.reason == "busy"``) or the request's own error (the version
does not exist), never silence nor ``INTERNAL``; each service's resident memory stays under
``RSS_GROWTH_MB`` more than before; afterwards a write and a read through the SDK answer
within a bounded wait. The same for HTTP: raw sockets, one request each, against the gateway
(200 or 503 with ``Retry-After``).

CI runs the 20,000 NATS requests (~11 s on 2 cores) and a short HTTP flood; ``-m slow`` the
full HTTP one (20,000 requests, ~55 s, at most ``HTTP_CONCURRENCY`` connections open at once:
file descriptors).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts.subjects import HEADER_REQUEST_ID, Subjects
from infra.bus import ping_all
from quill import Quill
from tests.up import Up

S = Subjects()
FULL = 20_000
HTTP_SHORT, HTTP_FULL = 2_000, 20_000
HTTP_CONCURRENCY = 2_000
"""Connections open at once (the listen backlog is 2,048; the fd limit bounds the rest)."""
RSS_GROWTH_MB = 200
"""What a flood may add to a service's resident memory (measured: the writer ~32 MiB, the
reader ~40 MiB for 20,000 NATS requests; the gateway ~35 MiB for 2,000 connections at once;
docs/operations.md "Overload")."""
WORKSPACES = [f"flood-{i}" for i in range(4)]
AFTER_S = 30.0
"""The most a normal write and read may take once the flood is over."""


def rss_mb(pid: int) -> float:
    """The resident memory of process ``pid`` (``VmRSS``), in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    assert match is not None
    return int(match.group(1)) / 1024


class Watch:
    """The services' pids (from their pings) and the most memory each held while watched."""

    def __init__(self, pids: dict[int, str]) -> None:
        self.pids = pids
        self.before = {pid: rss_mb(pid) for pid in pids}
        self.peak = dict(self.before)
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def of(cls, nc: NATS) -> Watch:
        pongs = await ping_all(nc, S, wait_s=1.0)
        pids = {int(p["pid"]): str(p["service"]) for p in pongs}
        assert {"writer", "reader", "executor", "gateway"} <= set(pids.values()), pongs
        return cls(pids)

    def sample(self) -> None:
        for pid in self.pids:
            self.peak[pid] = max(self.peak[pid], rss_mb(pid))

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(0.05)  # a sampling period, not a synchronisation

    def __enter__(self) -> Watch:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.sample()

    def check(self) -> None:
        grown = {
            f"{self.pids[pid]}({pid})": round(self.peak[pid] - self.before[pid], 1)
            for pid in self.pids
        }
        print("RSS growth (MiB):", grown)
        assert max(grown.values()) < RSS_GROWTH_MB, grown


async def nats_flood(nc: NATS, n: int) -> dict[int, list[dict[str, Any]]]:
    """``n`` requests at once, each answered on ``_INBOX.flood.<i>``: the replies by ``i``."""
    replies: dict[int, list[dict[str, Any]]] = {}
    all_in = asyncio.Event()

    async def on_reply(msg: Msg) -> None:
        replies.setdefault(int(msg.subject.rsplit(".", 1)[1]), []).append(json.loads(msg.data))
        if len(replies) == n:
            all_in.set()

    sub = await nc.subscribe(
        "_INBOX.flood.*", cb=on_reply, pending_msgs_limit=2 * n, pending_bytes_limit=-1
    )
    for i in range(n):
        ws = WORKSPACES[(i // 2) % len(WORKSPACES)]
        inbox = f"_INBOX.flood.{i}"
        if i % 2:
            body = json.dumps({"path": "a.txt", "min_version": 10**9}).encode()
            await nc.publish(S.qry("default", ws, "read"), body, reply=inbox)
        else:
            body = json.dumps({"path": f"f/{i}.txt", "content": "x"}).encode()
            headers = {HEADER_REQUEST_ID: f"flood-{i}"}
            await nc.publish(S.cmd("default", ws, "write"), body, reply=inbox, headers=headers)
    await nc.flush()
    try:
        async with asyncio.timeout(120):
            await all_in.wait()
    except TimeoutError:
        silent = n - len(replies)
        raise AssertionError(f"{silent} of {n} requests got no reply") from None
    await nc.flush()  # a second reply to any of them would have arrived by now
    await sub.unsubscribe()
    return replies


def outcome(reply: dict[str, Any]) -> str:
    if reply["ok"]:
        return "ok"
    error = reply["error"]
    if error["code"] == "UNAVAILABLE" and error.get("details", {}).get("reason") == "busy":
        assert error["details"]["retry_after_ms"] > 0 and "retry in" in error["message"]
        return f"busy:{error['details']['queue']}"
    return str(error["code"])


async def served_after(up: Up) -> None:
    """A write and a read of it, through the SDK, within ``AFTER_S``."""
    quill = await Quill.connect(up.nats_url, timeout=10)
    try:
        async with asyncio.timeout(AFTER_S):
            ws = quill.workspace("default/flood-0")
            await ws.create(exist_ok=True)  # the HTTP flood alone (-m slow) made none
            await ws.write("after.txt", "still here")
            assert (await ws.read("after.txt")).content == "still here"
    finally:
        await quill.close()


async def flood_nats(up: Up, n: int) -> None:
    setup = await Quill.connect(up.nats_url, timeout=10)
    for name in WORKSPACES:
        await setup.workspace(f"default/{name}").create(exist_ok=True)
    await setup.close()
    nc = await nats.connect(up.nats_url, pending_size=64 * 1024 * 1024)
    try:
        watch = await Watch.of(nc)
        with watch:
            replies = await nats_flood(nc, n)
        assert len(replies) == n and all(len(r) == 1 for r in replies.values())
        outcomes = Counter(outcome(r[0]) for r in replies.values())
        print(f"{n} requests:", dict(outcomes))
        writes = Counter(outcome(replies[i][0]) for i in range(0, n, 2))
        reads = Counter(outcome(replies[i][0]) for i in range(1, n, 2))
        assert set(writes) <= {
            "ok",
            "busy:workspace_commands",
            "busy:commands",
            "busy:subscription",
        }
        assert set(reads) <= {"INVALID_ARGUMENT", "busy:queries", "busy:subscription"}, reads
        assert writes["ok"] > 0 and reads["INVALID_ARGUMENT"] > 0
        if n >= FULL:  # more than the bounds hold: some were refused
            assert writes["busy:workspace_commands"] > 0 and reads["busy:queries"] > 0
        watch.check()
        await served_after(up)
    finally:
        await nc.close()


async def http_one(host: str, port: int, request: bytes) -> tuple[int, str | None]:
    """One request on its own connection: the status and its ``Retry-After``."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        data = await reader.read()
    finally:
        writer.close()
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    status = int(head.split(" ", 2)[1])
    retry = re.search(r"(?im)^retry-after:\s*(\S+)", head)
    return status, retry.group(1) if retry else None


async def flood_http(up: Up, n: int) -> None:
    host, port = up.http_url.removeprefix("http://").rsplit(":", 1)
    quill = await Quill.connect(up.nats_url, timeout=10)
    await quill.workspace("default/default").create(exist_ok=True)
    await quill.workspace("default/default").write("a.txt", "hello")
    await quill.close()
    request = (
        f"GET /v1/host/workspace/files/a.txt HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    ).encode()
    gate = asyncio.Semaphore(HTTP_CONCURRENCY)

    async def one() -> tuple[int, str | None]:
        async with gate:
            return await http_one(host, int(port), request)

    nc = await nats.connect(up.nats_url)
    try:
        watch = await Watch.of(nc)
        with watch:
            answers = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
        failed = [a for a in answers if isinstance(a, BaseException)]
        assert not failed, failed[:3]
        statuses = Counter(status for status, _ in answers)  # type: ignore[misc]
        print(f"{n} HTTP requests:", dict(statuses))
        assert set(statuses) <= {200, 503} and statuses[200] > 0
        assert all(retry == "1" for status, retry in answers if status == 503)  # type: ignore[misc]
        watch.check()
        await served_after(up)
    finally:
        await nc.close()


async def test_20000_nats_requests_at_once_are_answered_and_memory_stays_flat(up: Up) -> None:
    await flood_nats(up, FULL)


async def test_a_flood_of_http_requests_is_answered_and_memory_stays_flat(up: Up) -> None:
    await flood_http(up, HTTP_SHORT)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_20000_http_requests(up: Up) -> None:
    await flood_http(up, HTTP_FULL)
