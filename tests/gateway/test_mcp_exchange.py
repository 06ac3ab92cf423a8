"""``/mcp`` and ``/mcp/wap`` answer a plain stateless JSON-RPC request in the request's own task
(``services/gateway/mcp/exchange.py``): each request here gets the same answer (status, content
type, JSON) as the MCP SDK's own stateless path gives it, and the plain ones are answered by
the short path (so the comparison compares something)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.routing import Route

from quill.client import Quill
from services.gateway.access import Principal, Tokens
from services.gateway.mcp.exchange import Exchange
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway

JSON = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
LEGACY = "2025-06-18"


def call(tool: str, arguments: Any, rid: Any = 1) -> dict[str, Any]:
    params = {"name": tool, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


def rpc(method: str, params: Any = None, rid: Any = 7) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    return body if params is None else body | {"params": params}


PLAIN: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("read", call("read_file", {"path": "notes.md"}), {}),
    ("read, string id", call("read_file", {"path": "notes.md"}, rid="a-1"), {}),
    (
        "read, handshake version",
        call("read_file", {"path": "notes.md"}),
        {"mcp-protocol-version": LEGACY},
    ),
    ("read lines", call("read_file", {"path": "notes.md", "head": 1, "line_numbers": True}), {}),
    ("missing file", call("read_file", {"path": "nope.md"}), {}),
    ("path outside", call("read_file", {"path": "/etc/passwd"}), {}),
    ("bad argument", call("read_file", {"path": "notes.md", "head": -1}), {}),
    ("argument of the wrong type", call("read_file", {"path": ["notes.md"]}), {}),
    ("missing argument", call("read_file", {}), {}),
    ("unknown tool", call("no_such_tool", {}), {}),
    ("another tenant's workspace", call("read_file", {"path": "x", "workspace": "../other"}), {}),
    ("write, no change", call("write_file", {"path": "w.md", "content": "hello\n"}), {}),
    ("tools/list", rpc("tools/list"), {}),
    ("ping", rpc("ping"), {}),
    ("unknown method", rpc("no/such_method"), {}),
    ("tool name not a string", rpc("tools/call", {"name": 5}), {}),
    ("resources/list", rpc("resources/list"), {}),
    ("prompts/list", rpc("prompts/list"), {}),
]
"""Requests the short path answers (each also by the SDK, to compare)."""

OTHER: list[tuple[str, bytes, dict[str, str]]] = [
    (
        "lone surrogate (not JSON to the SDK either)",
        json.dumps(call("write_file", {"path": "s.md", "content": "\ud800"})).encode(),
        {},
    ),
    (
        "notification",
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode(),
        {},
    ),
    (
        "initialize",
        json.dumps(
            rpc(
                "initialize",
                {
                    "protocolVersion": LEGACY,
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"},
                },
            )
        ).encode(),
        {},
    ),
    ("batch", json.dumps([call("read_file", {"path": "notes.md"})]).encode(), {}),
    ("a response", json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}).encode(), {}),
    ("not JSON", b"{not json", {}),
    ("invalid UTF-8", b'{"jsonrpc": "2.0", "id": 1, "method": "\xff\xfe"}', {}),
    ("deep", b"[" * 100_000 + b"]" * 100_000, {}),
    ("empty", b"", {}),
    ("no jsonrpc", json.dumps({"id": 1, "method": "ping"}).encode(), {}),
    ("params not an object", json.dumps(rpc("tools/call", [1, 2])).encode(), {}),
    ("html only", json.dumps(rpc("ping")).encode(), {"accept": "text/html"}),
    ("form body", json.dumps(rpc("ping")).encode(), {"content-type": "text/plain"}),
    ("modern version", json.dumps(rpc("ping")).encode(), {"mcp-protocol-version": "2026-07-28"}),
    ("unknown version", json.dumps(rpc("ping")).encode(), {"mcp-protocol-version": "1999-01-01"}),
]
"""Requests the short path hands to the SDK unchanged."""


def exchanges(gateway: Gateway) -> dict[str, Exchange]:
    app = gateway.server.config.app
    found = {r.path: r.app for r in app.routes if isinstance(r, Route)}
    return {path: e for path, e in found.items() if isinstance(e, Exchange)}


async def both(
    http: httpx.AsyncClient, endpoint: Exchange, path: str, body: bytes, headers: dict[str, str]
) -> tuple[Any, Any]:
    """The answer of the short path and the SDK's, each as (status, content type, JSON)."""
    answers = []
    for fast in (True, False):
        endpoint.fast = fast
        try:
            answer = await http.post(path, content=body, headers=JSON | headers)
        finally:
            endpoint.fast = True
        kind = answer.headers.get("content-type")
        parsed = answer.json() if kind == "application/json" and answer.content else answer.text
        answers.append((answer.status_code, kind, parsed))
    return answers[0], answers[1]


async def on_mcp(
    gateway: Gateway, http: httpx.AsyncClient, body: bytes, headers: dict[str, str]
) -> tuple[int, Any, Any]:
    """``body`` posted to ``/mcp`` on both paths (``both``): how many requests the short path
    answered itself (1: the one sent its way; 0: it handed it to the SDK), and the answers."""
    endpoint = exchanges(gateway)["/mcp"]
    before = endpoint.answered
    ours, sdks = await both(http, endpoint, "/mcp", body, headers)
    return endpoint.answered - before, ours, sdks


@pytest.fixture
async def notes(sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.create(exist_ok=True)
    await ws.write("notes.md", "one\ntwo\n")
    await ws.write("w.md", "hello\n")  # so that each path's write answers "No changes"


@pytest.mark.usefixtures("notes")
@pytest.mark.parametrize(("name", "body", "headers"), PLAIN, ids=[p[0] for p in PLAIN])
async def test_plain_requests_answer_as_the_sdk_does(
    gateway: Gateway, http: httpx.AsyncClient, name: str, body: Any, headers: dict[str, str]
) -> None:
    short, ours, sdks = await on_mcp(gateway, http, json.dumps(body).encode(), headers)
    assert short == 1, "the short path did not answer"
    assert ours == sdks
    assert ours[0] == 200 and ours[1] == "application/json"
    assert ours[2]["id"] == body["id"]


@pytest.mark.usefixtures("notes")
@pytest.mark.parametrize(("name", "body", "headers"), OTHER, ids=[o[0] for o in OTHER])
async def test_other_requests_go_to_the_sdk(
    gateway: Gateway, http: httpx.AsyncClient, name: str, body: bytes, headers: dict[str, str]
) -> None:
    short, ours, sdks = await on_mcp(gateway, http, body, headers)
    assert short == 0, "the short path answered what is the SDK's"
    assert ours == sdks
    assert ours[0] < 500


async def test_wap_answers_as_the_sdk_does(
    gateway: Gateway, http: httpx.AsyncClient, sdk: Quill
) -> None:
    ws = sdk.workspace("default/default")
    await ws.create(exist_ok=True)
    await ws.write("src/app.js", "x\n")
    endpoint = exchanges(gateway)["/mcp/wap"]
    for body in (
        call("readFile", {"path": "src/app.js"}),
        call("readFile", {"path": "missing.js"}),
        rpc("tools/list"),
    ):
        ours, sdks = await both(http, endpoint, "/mcp/wap", json.dumps(body).encode(), {})
        assert ours == sdks
    assert endpoint.answered >= 3


async def test_the_caller_is_who_the_token_says(start: StartGateway) -> None:
    """The short path runs under the same principal as the SDK's: a token reads its own
    workspace, never another tenant's."""
    tokens = Tokens({"ta": Principal("acme", "notes"), "tb": Principal("beta", "notes")})
    gateway = await start(tokens)
    await gateway.quill.workspace("acme/notes").write("secret.md", "acme only\n")
    endpoint = exchanges(gateway)["/mcp"]
    body = json.dumps(call("read_file", {"path": "secret.md"})).encode()
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        for token, readable in (("ta", True), ("tb", False)):
            auth = {"authorization": f"Bearer {token}"}
            ours, sdks = await both(http, endpoint, "/mcp", body, auth)
            assert ours == sdks
            assert ours[2]["result"]["isError"] is not readable
            assert ("acme only" in json.dumps(ours[2])) is readable
        refused = await http.post("/mcp", content=body, headers=JSON)
        assert refused.status_code == 401
