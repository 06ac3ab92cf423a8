"""Issue 17, bounded memory: what the reader and the SDK keep per workspace stays within its
budget however many workspaces are touched (docs/operations.md, Sizing)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from nats.aio.client import Client as NATS

from contracts.subjects import STREAM_AUDIT
from infra import bridges
from quill import _handle as handle_module
from quill.client import Quill
from services.reader import app as reader_app
from services.reader.cache import RevisionCache
from tests.helpers import eventually, subscribed, update_from
from tests.integration.conftest import StartReader


async def test_the_reader_cache_holds_no_trace_of_workspaces_it_dropped(
    services: StartReader, nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_app, "RevisionCache", lambda: RevisionCache(max_entries=2))
    reader = await services("r1")
    quill = Quill(nc)
    names = [f"acme/cached-{i}" for i in range(6)]
    for name in names:
        ws = quill.workspace(name)
        await ws.create()
        await ws.write("a.txt", f"{name}\n")
        assert (await ws.read("a.txt")).content == f"{name}\n"
    cache = reader.queries.cache
    assert len(cache._entries) == 2
    assert len(cache._by_ws) == 2  # not one (empty) entry per workspace ever read
    # a dropped workspace is read again from the projection, and cached again
    first = quill.workspace(names[0])
    assert (await first.read("a.txt")).content == f"{names[0]}\n"
    assert len(cache._by_ws) == 2


async def test_an_sdk_client_remembers_its_most_recent_workspaces_only(
    services: StartReader, nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handle_module, "SDK_WORKSPACES", 3)
    await services("r1")
    quill = Quill(nc)
    names = [f"acme/seen-{i}" for i in range(6)]
    for name in names:
        ws = quill.workspace(name)
        await ws.create()
        await ws.write("a.txt", "x\n")
    assert list(quill._workspaces) == names[3:] and list(quill._seen) == names[3:]
    assert quill.workspace(names[5]).last_version == 2  # read-your-writes for those kept
    # a forgotten one is a new handle, reading the newest version a reader has applied
    again = quill.workspace(names[0])
    assert again.last_version == 0
    assert await again.read_text("a.txt") == "x\n" and again.last_version == 2
    assert len(quill._workspaces) == 3 and len(quill._seen) == 3


async def test_services_forget_claims_of_bridges_that_lapsed(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bridges, "SWEEP_S", 0.0, raising=False)  # sweep at every claim seen
    watching = bridges.Bridges(nc.jetstream())
    await watching.start()
    try:
        kv = await bridges.bucket(nc.jetstream())
        lapsed = bridges.Claim(owner="dead", client="laptop", path="~/x", expires=1.0)
        for i in range(5):  # bridges that died without releasing their claims
            await kv.put(bridges.key("acme", f"lapsed-{i}"), msgspec.json.encode(lapsed))
        await bridges.claim(kv, "acme", "alive", "b1", "laptop", "~/alive")
        await eventually(lambda: watching.claims("acme", "alive") is not None)
        assert list(watching._claims) == ["acme.alive"]
    finally:
        await watching.stop()


async def test_a_watcher_that_goes_away_leaves_no_subscription_nor_consumer(
    services: StartReader, nc: NATS
) -> None:
    await services("r1")
    quill = Quill(nc)
    ws = quill.workspace("acme/watched")
    await ws.create()
    js = nc.jetstream()
    subs_before = len(nc._subs)
    consumers_before = (await js.stream_info(STREAM_AUDIT)).state.consumer_count
    watch = ws.watch()
    first = asyncio.ensure_future(update_from(watch, 2))  # the write's, not the create's
    await subscribed(nc, quill.subjects.updated("acme", "watched"))  # before the write
    await ws.write("a.txt", "x\n")
    assert (await asyncio.wait_for(first, 10)).version == 2
    audit = ws.audit(follow=True)
    assert (await asyncio.wait_for(anext(audit), 10)).op
    assert len(nc._subs) > subs_before
    await watch.aclose()
    await audit.aclose()
    assert len(nc._subs) == subs_before
    # the audit follower's ordered consumer: gone once the server sees no interest in it

    async def consumer_gone() -> bool:
        return (await js.stream_info(STREAM_AUDIT)).state.consumer_count <= consumers_before

    await eventually(consumer_gone, 30, "the audit follower's consumer gone")
