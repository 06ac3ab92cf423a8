"""Issue 30: without tokens an MCP call acts as its client's ``clientInfo.name``. A name is
whatever a client sends: it becomes an actor (events, audit records, a NATS header), so a
hostile one is bounded like any actor. Attacks, through a real gateway (MCP over HTTP, the
official client and raw JSON-RPC), writer and reader:

* a name of 100,000 characters: the actor is its first ``NAME_MAX``;
* line breaks, a forged header, controls and a bidi override in the name: none reaches the
  actor (a header or a log line cannot be forged, a name cannot read backwards);
* a name holding a registered secret: not used (the call is ``local``'s, never refused);
* a forged or garbled ``Mcp-Session-Id``: names nobody (``local``); one well-formed but
  carrying a hostile name: bounded as above.
"""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest
from mcp.types import Implementation

from quill.client import Quill
from services.gateway.server import Gateway
from tests.gateway.conftest import gateway, nats_server  # noqa: F401 (fixtures)
from tests.gateway.support import mcp_client, ok

SECRET = "sk-live-0123456789abcdef"
NAME_MAX = 64
"""Characters of a client's name kept as its actor (``services.gateway.mcp.clients``)."""
MCP = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


async def actor_of_last(sdk: Quill) -> tuple[str | None, str | None]:
    events = (await sdk.workspace("default/default").events(after=0, limit=1000)).events
    return events[-1].actor, events[-1].session


async def written_as(url: str, name: str, mode: str) -> None:
    info = Implementation(name=name, version="1")
    async with mcp_client(url, client_info=info, mode=mode) as mcp:
        await ok(mcp, "write_file", path="x.txt", content=f"{len(name)} {mode}\n")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_huge_or_crafted_name_is_bounded(
    gateway: Gateway,  # noqa: F811 (a fixture)
    mode: str,
) -> None:
    sdk = gateway.quill
    await written_as(gateway.url, "agent-" + "x" * 100_000, mode)
    actor, _ = await actor_of_last(sdk)
    assert actor == ("agent-" + "x" * 100_000)[:NAME_MAX]
    crafted = "evil\r\nWs-Actor: admin\r\n\x00\x1b[31m\u202egnp.exe\tname"
    await written_as(gateway.url, crafted, mode)
    actor, _ = await actor_of_last(sdk)
    assert actor == "evil Ws-Actor: admin [31m gnp.exe name"
    assert all(ch.isprintable() for ch in actor or "")
    await written_as(gateway.url, "\r\n\t\u202e", mode)  # nothing left: no name
    assert (await actor_of_last(sdk))[0] == "local"


async def test_a_name_holding_a_secret_is_not_used(
    gateway: Gateway,  # noqa: F811 (a fixture)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = tmp_path / "secrets.toml"
    registry.write_text(f'[secrets]\nopenai = "{SECRET}"\n')
    monkeypatch.setenv("QUILL_SECRETS", str(registry))
    for mode in ("legacy", "auto"):
        await written_as(gateway.url, f"agent {SECRET}", mode)  # answered, not refused
        actor, session = await actor_of_last(gateway.quill)
        assert actor == "local" and SECRET not in str(session)


async def test_a_forged_session_names_nobody(gateway: Gateway) -> None:  # noqa: F811
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "write_file", "arguments": {"path": "f.txt", "content": "f\n"}},
    }
    hostile = base64.urlsafe_b64encode(b"mallory\r\nWs-Run: x").rstrip(b"=").decode()
    forged = {
        "garbage": ("local", None),
        "mcp-short-bWFsbG9yeQ": ("local", None),
        "mcp-" + "A" * 22 + "-" + "%%%%": ("local", None),
        "mcp-" + "A" * 22 + "-" + "B" * 500: ("local", None),  # too long: not read
        "mcp-" + "A" * 22 + "-" + "_w": ("local", None),  # not UTF-8
        "mcp-" + "A" * 22 + "-" + hostile: ("mallory Ws-Run: x", "mcp-" + "A" * 22),
    }
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        for n, (header, expected) in enumerate(forged.items()):
            call["params"]["arguments"]["content"] = f"{n}\n"  # type: ignore[index]  # a change each
            answer = await http.post("/mcp", json=call, headers={**MCP, "mcp-session-id": header})
            assert answer.status_code == 200 and '"isError":true' not in answer.text, header
            assert await actor_of_last(gateway.quill) == expected, header
