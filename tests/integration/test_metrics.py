"""The services' metrics against a real nats-server: each state driven for real, then scraped
(the process's registry, as ``--metrics-port`` and the gateway's ``/metrics`` serve it).

Writer: appends ok and in conflict (two writers on one workspace), commands parked behind a
lock counted in the queue. Reader: lag while its projection cannot apply, back to 0 after;
``min_version`` waiters. Publishes the server refuses (credentials that may not publish audit
records or notices) counted as publish failures. Requests of every kind counted, and an op a
hostile client invents counted as ``unknown``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from quill.credentials import ENV_NAMES, NatsAuth
from quill_cli.natsserver import NatsServer
from services.reader import follower
from tests.conftest import StartReader
from tests.helpers import new_workspace, start_writer
from tests.metrics_scrape import Scrape, scrape, scraped


async def test_appends_ok_and_in_conflict(nats_url: str, tmp_path: Path, quill: Quill) -> None:
    """Two writers serve one workspace (one queue group): the one that answers after the
    other wrote holds a stale state, its append is refused on the workspace's sequence
    (``conflict``), it reloads and commits (``ok``)."""
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "w1")
        await start_writer(stack, nats_url, tmp_path / "w2")
        ws = quill.workspace("metrics/appends")
        await ws.create()
        before = scrape()
        for n in range(200):  # commands go to either writer; stops at the first conflict
            await ws.write("a.txt", f"{n}")
            now = scrape()
            if now.grew(before, "quill_writer_appends_total", outcome="conflict"):
                break
        assert now.grew(before, "quill_writer_appends_total", outcome="conflict") >= 1
        assert now.grew(before, "quill_writer_appends_total", outcome="ok") == n + 1
        assert now.grew(before, "quill_requests_total", service="writer", op="write") == n + 1


async def test_commands_parked_behind_a_lock_are_the_queue(
    services: StartReader, quill: Quill, nats_url: str
) -> None:
    holder = quill.as_actor("holder", session="s1").workspace("metrics/queue")
    await holder.create()
    await holder.lock(ttl_ms=60_000)
    async with await Quill.connect(nats_url, actor="other", session="s2", wait_ms=30_000) as q:
        other = q.workspace("metrics/queue")
        parked = [asyncio.create_task(other.write(f"f{i}.txt", "x")) for i in range(3)]
        seen = await scraped(lambda s: s.value("quill_writer_queue_depth_max") >= 3)
        assert seen.value("quill_writer_queue_depth") >= 3
        assert seen.value("quill_writer_workspaces") >= 1
        await holder.unlock()
        await asyncio.gather(*parked)
    done = await scraped(lambda s: s.value("quill_writer_queue_depth") == 0)
    assert done.value("quill_writer_queue_depth_max") == 0


async def test_reader_lag_rises_while_it_cannot_apply_and_returns_to_zero(
    services: StartReader, quill: Quill, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follower, "LAG_POLL_S", 0.05)
    reader = await services("lagging")
    ws = quill.workspace("metrics/lag")
    await ws.create()
    gate = asyncio.Event()
    apply = reader.store.apply

    async def held(*args: Any, **kwargs: Any) -> Any:
        await gate.wait()  # the projection is stuck (a slow disk, a long transaction)
        return await apply(*args, **kwargs)

    monkeypatch.setattr(reader.store, "apply", held)
    before = scrape()
    for n in range(5):
        await ws.write("a.txt", f"{n}")
    behind = await scraped(lambda s: s.value("quill_reader_lag_versions") >= 5)
    assert behind.value("quill_reader_lag_seconds") > 0
    waiting = asyncio.create_task(ws.read("a.txt"))  # min_version: the last write
    await scraped(lambda s: s.value("quill_reader_version_waiters") >= 1)
    gate.set()
    assert (await waiting).content.endswith("4")
    after = await scraped(lambda s: s.value("quill_reader_lag_versions") == 0)
    assert after.value("quill_reader_lag_seconds") == 0
    assert after.value("quill_reader_version_waiters") == 0
    assert after.grew(before, "quill_reader_apply_seconds_count") >= 1
    assert after.grew(before, "quill_requests_total", service="reader", op="read") >= 1


def _auth_config() -> str:
    """Users for a server that refuses the services' audit records and notices."""
    return (
        "authorization {\n  users = [\n"
        '    {user: "svc", password: "svc-password",'
        ' permissions: {publish: {deny: ["ws.audit.>", "ws.updated.>"]}}}\n'
        '    {user: "metrics", password: "client-password"}\n'
        "  ]\n}\n"
    )


@pytest.fixture(scope="module")
def refusing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats"), extra_config=_auth_config()).start()
    yield server
    server.stop()


async def test_refused_publishes_are_publish_failures(
    refusing_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's credentials may not publish audit records or ``workspace.updated``: the
    server refuses each (asynchronously); the operation itself succeeds, and each refusal
    counts."""
    for name, value in NatsAuth("svc", "svc-password").environ().items():
        monkeypatch.setenv(name, value)
    async with AsyncExitStack() as stack:
        await start_writer(stack, refusing_server.url, tmp_path / "writer")
        for name in ENV_NAMES:
            monkeypatch.delenv(name, raising=False)
        client = await Quill.connect(
            refusing_server.url, user="metrics", password="client-password", actor="t"
        )
        stack.push_async_callback(client.close)
        before = scrape()
        ws = client.workspace("metrics/refused")
        await ws.create()
        await ws.write("a.txt", "x")

        def counted(s: Scrape) -> bool:
            return all(
                s.grew(before, "quill_publish_failures_total", service="writer", stream=st) >= n
                for st, n in (("audit", 2), ("updated", 2))
            )

        await scraped(counted)


async def test_every_request_is_counted_and_an_invented_op_is_unknown(
    services: StartReader, quill: Quill, nc: NATS
) -> None:
    ws = await new_workspace(services, quill, "metrics/hostile", "r")
    before = scrape()
    invented = f"op{uuid.uuid4().hex}"
    for kind in ("cmd", "qry"):
        reply = await nc.request(f"ws.{kind}.metrics.hostile.{invented}", b"{}", timeout=5)
        assert json.loads(reply.data)["error"]["code"] == "INVALID_ARGUMENT"
    reply = await nc.request("ws.cmd.Not-An-Id.x.write", b"{}", timeout=5)  # no address
    assert not json.loads(reply.data)["ok"]
    now = scrape()
    assert now.grew(before, "quill_requests_total", service="writer", op="unknown") == 2
    assert not [s for s in now.samples if invented in json.dumps(s[1])]
    for service, kind in (("writer", "cmd"), ("reader", "qry")):
        assert (
            now.grew(
                before,
                "quill_requests_total",
                service=service,
                kind=kind,
                op="unknown",
                outcome="INVALID_ARGUMENT",
            )
            >= 1
        )
    with pytest.raises(QuillError) as refused:
        await ws.read("missing.txt")
    assert refused.value.code == ErrorCode.FILE_NOT_FOUND
    after = scrape()
    assert after.grew(now, "quill_requests_total", kind="qry", outcome="FILE_NOT_FOUND") == 1
    assert after.grew(now, "quill_request_seconds_count", kind="qry", op="read") == 1
