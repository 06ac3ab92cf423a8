"""Issue 28, item 6: the gateway echoed a registered secret back in ``X-Request-Id``, in MCP's
``Unknown tool: <name>`` and in the JSON-RPC ``id``.

``quill up --secrets FILE`` runs as a real process; plain HTTP clients send a registered secret
in every field the gateway echoes (a header, a JSON-RPC id and method, a tool name, a tool's
arguments, a REST path and body, a console URL and query) and read every byte of the answer,
headers included: the secret occurs 0 times, and where it was echoed the marker
``[REDACTED:<id>]`` stands in its place (``infra/http/redaction.py``). A JSON-RPC id
holding the secret comes back as the marker, on the same HTTP exchange.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tests.up import Up

SECRET = "sk-live-0123456789abcdef"
PATTERNED = "AKIAABCDEFGHIJKLMNOP"
REGISTRY = f"""
[secrets]
openai = "{SECRET}"

[[patterns]]
id = "aws"
regex = "AKIA[0-9A-Z]{{16}}"
"""
MARK = "[REDACTED:openai]"
FILES = "/v1/host/workspace/files"
MCP = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


pytestmark = pytest.mark.up(secrets=REGISTRY)


@pytest_asyncio.fixture
async def http(up: Up) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=up.http_url, timeout=30) as client:
        yield client


def leaked(answer: httpx.Response, secret: str = SECRET) -> list[str]:
    """Where the answer holds ``secret``: its header lines and its body (every byte)."""
    lines = [f"{k}: {v}" for k, v in answer.headers.multi_items()]
    found = [line for line in lines if secret in line]
    if secret.encode() in answer.content:
        found.append(f"body: {answer.text[:300]}")
    return found


def rpc(method: str, params: dict[str, Any], id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


def call(tool: str, **arguments: Any) -> dict[str, Any]:
    return rpc("tools/call", {"name": tool, "arguments": arguments})


async def test_x_request_id_holding_a_secret_is_not_kept(http: httpx.AsyncClient) -> None:
    """The client's ``X-Request-Id`` is kept when valid, but not when it holds a secret: the
    gateway names the request itself (a command named with it would be refused), so the
    write goes through."""
    written = await http.put(
        f"{FILES}/rid.md", json={"content": "x"}, headers={"X-Request-Id": SECRET}
    )
    assert leaked(written) == []
    assert written.status_code == 200, written.text
    assert len(written.headers["x-request-id"]) == 32  # the gateway's own
    plain = f"req-{uuid.uuid4().hex[:8]}"
    kept = await http.get(FILES, headers={"X-Request-Id": plain})
    assert kept.headers["x-request-id"] == plain


async def test_a_json_rpc_id_holding_a_secret_comes_back_as_the_marker(
    http: httpx.AsyncClient,
) -> None:
    """The answer comes on the same HTTP exchange, its id the client's with the marker in
    place of each secret, its result whole."""
    for sent, shown in ((SECRET, MARK), (f"call-{PATTERNED}", "call-[REDACTED:aws]")):
        answer = await http.post("/mcp", json=rpc("tools/list", {}, id=sent), headers=MCP)
        secret = SECRET if sent == SECRET else PATTERNED
        assert leaked(answer, secret) == []
        assert answer.status_code == 200
        body = answer.json()  # still JSON, its Content-Length right
        assert body["id"] == shown
        assert any(t["name"] == "read_file" for t in body["result"]["tools"])


@pytest.mark.parametrize(
    ("path", "message", "expect"),
    [
        ("/mcp", call(SECRET), f"Unknown tool: {MARK}"),
        ("/mcp/wap", call(SECRET), f"Unknown tool: {MARK}"),
        ("/mcp", rpc(SECRET, {}), MARK),  # Method not found, data: the method
        ("/mcp", rpc("prompts/get", {"name": SECRET}), f"Unknown prompt: {MARK}"),
        ("/mcp", rpc("resources/read", {"uri": f"file:///{SECRET}"}), MARK),
        ("/mcp", call("read_file", path="a.md", workspace=f"{SECRET}!"), f"'{MARK}!'"),
        ("/mcp/wap", call("readFile", path="a.md", workspace=f"{SECRET}!"), f"'{MARK}!'"),
    ],
    ids=["tool", "wap-tool", "method", "prompt", "resource", "argument", "wap-argument"],
)
async def test_mcp_answers_echo_no_secret(
    http: httpx.AsyncClient, path: str, message: dict[str, Any], expect: str
) -> None:
    answer = await http.post(path, json=message, headers=MCP)
    assert leaked(answer) == []
    assert answer.status_code == 200
    assert answer.json()["id"] == 1
    assert expect in answer.text, answer.text


async def test_rest_and_console_answers_echo_no_secret(http: httpx.AsyncClient) -> None:
    """A REST body's unknown field, a REST path not in normal form, a console URL naming a
    workspace and a console query: each was echoed."""
    field = await http.put(f"{FILES}/f.md", json={"content": "x", SECRET: 1})
    assert leaked(field) == [] and field.status_code == 400
    assert field.json()["message"] == f"Unknown field(s): {MARK}"
    path = await http.put(f"{FILES}/a//{SECRET}.md", json={"content": "x"})
    assert leaked(path) == [] and path.status_code == 400
    assert f"a/{MARK}.md" in path.json()["message"]
    page = await http.get(f"/ui/w/{SECRET}/", headers={"accept": "text/html"})
    assert leaked(page) == []
    assert MARK in page.text
    audit = await http.get("/ui/w/default/audit", params={"actor": SECRET})
    assert leaked(audit) == [] and audit.status_code == 200
    assert MARK in audit.text


async def test_answers_without_a_secret_are_unchanged(http: httpx.AsyncClient) -> None:
    """What holds no secret passes as it was: a body sent whole, and one streamed."""
    written = await http.put(f"{FILES}/plain.md", json={"content": "plain text\n"})
    assert written.status_code == 200 and written.json()["content"] == "plain text\n"
    assert int(written.headers["content-length"]) == len(written.content)
    listing = await http.get(FILES)
    assert listing.status_code == 200
    assert "plain.md" in {f["path"] for f in listing.json()["files"]}
