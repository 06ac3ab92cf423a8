"""Sessions (seed 003): a primary workspace, attached workspaces, and the resolution flowchart
case by case."""

from __future__ import annotations

import asyncio
import json

import pytest
from nats.aio.client import Client as NATS

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from quill.session import Session
from services.common import bridges
from tests.conftest import StartReader


async def test_attach_detach_and_resolution(services: StartReader, quill: Quill, nc: NATS) -> None:
    await services("r1")
    session = await Session.open(quill, "acme", "chat-1")
    assert session.primary.name == "chat-1"
    shared = quill.workspace("acme/shared")
    await shared.create()
    await shared.write("facts.md", "water is wet\n")

    listing = await session.attach("server:/acme/shared")
    assert [(a.uri, a.target, a.kind) for a in listing.attached] == [
        ("server:/acme/shared", "acme/shared", "server")
    ]
    # Named: it goes there (by URI or by name).
    for name in ("server:/acme/shared", "shared", "acme/shared"):
        ws = await session.resolve("qry.read", name)
        assert await ws.read_text("facts.md") == "water is wet\n"
    # Not named, the primary offers it: the primary.
    assert (await session.resolve("qry.read")).name == "chat-1"
    # Not named, the primary does not offer it, an attached one does: the first such.
    await session.primary.set_trust("restricted")  # restricted: no commands
    session.refresh()
    assert (await session.resolve("exec.run")).name == "shared"
    # Nobody offers it: Tool not found.
    await shared.set_trust("restricted")
    session.refresh()
    with pytest.raises(QuillError) as info:
        await session.resolve("exec.run")
    assert info.value.message == "Tool not found: no workspace of session chat-1 offers exec.run"

    # A local folder is attached through the bridge serving it.
    with pytest.raises(QuillError) as info:
        await session.attach("macbook:~/dev/app")
    assert info.value.code == ErrorCode.FILE_NOT_FOUND
    assert "run `quill attach` on macbook" in info.value.message
    kv = await bridges.bucket(nc.jetstream())
    await bridges.claim(kv, "acme", "laptop-app", "b-1", "macbook", "~/dev/app")
    async with asyncio.timeout(10):  # the writer learns claims by watching: wait for it
        while (
            json.loads((await nc.request("ws.sys.ping.writer", b"")).data)["local_workspaces"] != 1
        ):
            await asyncio.sleep(0.01)
    listing = await session.attach("macbook:~/dev/app")
    assert listing.attached[-1].target == "acme/laptop-app"
    assert listing.attached[-1].kind == "local"
    await bridges.release(kv, "acme", "laptop-app")

    # Another tenant's workspace cannot be attached; detaching forgets one.
    with pytest.raises(QuillError) as info:
        await session.attach("server:/other/secret")
    assert info.value.code == ErrorCode.ACCESS_DENIED
    listing = await session.detach("server:/acme/shared")
    assert [a.uri for a in listing.attached] == ["macbook:~/dev/app"]
    assert [a.uri for a in (await session.workspaces()).attached] == ["macbook:~/dev/app"]
    types = [e.type for e in (await session.primary.events()).events]
    assert types.count("workspace_attached") == 2 and types.count("workspace_detached") == 1
    with pytest.raises(QuillError) as info:
        await session.attach("not a uri")
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
