"""Issue 10, item 8: ``attach`` of a ``git:`` URI names the workspace it was cloned into
(``target``); a target that is not exactly ``<tenant>/<workspace>`` (``acme/../globex/main``,
dot segments, empty or percent-encoded ones) is refused with ``INVALID_ARGUMENT``, and so is a
git URL with dot segments. Driven with bare nats-py against a real ``quill up``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from tests.security.conftest import Canaries, verify
from tests.up import Up


@pytest.fixture
async def nc(up: Up) -> AsyncIterator[NATS]:
    client = await nats.connect(up.nats_url)
    yield client
    await client.drain()


async def call(nc: NATS, kind: str, workspace: str, op: str, body: object) -> dict[str, Any]:
    msg = await nc.request(
        f"ws.{kind}.{workspace.replace('/', '.')}.{op}", json.dumps(body).encode(), timeout=15
    )
    reply: dict[str, Any] = json.loads(msg.data)
    return reply


BAD_TARGETS = [
    "acme/../globex/main",
    "acme/..",
    "acme/.",
    "acme/",
    "acme//x",
    "acme/./x",
    "acme/x/..",
    "acme/%2e%2e/globex/main",
    "acme/%2E%2E",
    "acme/..%2fglobex%2fmain",
    "acme/x/y",
    "/acme/x",
    "acme",
    "acme/../acme/x",
]

BAD_URLS = [
    "git:https://github.com/org/../evil/repo",
    "git:github.com/org/./repo",
    "git:github.com/org/%2e%2e/repo",
    "git:https://github.com/org/%2E%2e",
    "git:github.com//repo",
    "git:github.com/org/repo/..",
    "git:../github.com/org/repo",
]


async def test_attach_refuses_a_git_target_that_is_not_tenant_slash_workspace(
    up: Up, nc: NATS, canaries: Canaries
) -> None:
    assert (await call(nc, "cmd", "acme/s1", "create", {}))["ok"]
    assert (await call(nc, "cmd", "globex/main", "create", {}))["ok"]
    uri = "git:https://github.com/org/repo"
    for target in BAD_TARGETS:
        reply = await call(nc, "cmd", "acme/s1", "attach", {"uri": uri, "target": target})
        assert not reply.get("ok"), (target, reply)
        assert reply["error"]["code"] == "INVALID_ARGUMENT", (target, reply)
    for bad in BAD_URLS:
        reply = await call(nc, "cmd", "acme/s1", "attach", {"uri": bad, "target": "acme/repo"})
        assert not reply.get("ok"), (bad, reply)
        assert reply["error"]["code"] == "INVALID_ARGUMENT", (bad, reply)
    listing = await call(nc, "qry", "acme/s1", "attached", {})
    assert listing["result"]["attached"] == []
    # A well-formed target of the session's own tenant is attached as before.
    good = await call(nc, "cmd", "acme/s1", "attach", {"uri": uri, "target": "acme/git-repo-1"})
    assert good["ok"], good
    assert [a["target"] for a in good["result"]["attached"]] == ["acme/git-repo-1"]
    other = await call(nc, "cmd", "acme/s1", "attach", {"uri": uri, "target": "globex/main"})
    assert other["error"]["code"] == "ACCESS_DENIED"
    verify(up, "acme/s1")
    verify(up, "globex/main")
