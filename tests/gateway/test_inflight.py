"""The gateway's in-flight bound (``infra/http/inflight.py``): past it, REST gets 503 with
``Retry-After``, MCP a tool error result saying when to retry; /health is always answered."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from starlette.types import Receive, Scope, Send

from contracts.errors import QuillError, busy
from infra.busy import REJECTIONS
from infra.http.inflight import INFLIGHT, MCP_PEEK_BYTES, Inflight
from services.gateway.rest.edge import error_response
from tests.helpers import eventually


class Held:
    """An app whose requests wait until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.entered += 1
        if scope["path"] != "/health":
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})


@pytest_asyncio.fixture
async def held() -> AsyncIterator[tuple[Held, httpx.AsyncClient]]:
    app = Held()
    transport = httpx.ASGITransport(app=Inflight(app, max_inflight=2, retry_after_ms=1500))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield app, client
    app.release.set()


def rejected() -> float:
    return REJECTIONS.labels("gateway", "http")._value.get()


async def test_past_the_bound_rest_is_503_with_retry_after_and_health_still_answers(
    held: tuple[Held, httpx.AsyncClient],
) -> None:
    app, client = held
    gauge = INFLIGHT._value.get()
    first = [asyncio.create_task(client.get(f"/v1/host/workspace/files/{i}")) for i in range(2)]
    await eventually(lambda: app.entered == 2)
    assert INFLIGHT._value.get() == gauge + 2
    before = rejected()
    refused = await client.get("/v1/host/workspace/files/x")
    assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
    body = refused.json()
    assert body["error"] == "unavailable" and "gateway is busy" in body["message"]
    assert body["details"] == {
        "reason": "busy",
        "queue": "http",
        "retry_after_ms": 1500,
        "limit": 2,
    }
    assert rejected() == before + 1
    assert (await client.get("/health")).status_code == 200  # never counted, never refused
    app.release.set()
    assert [(await r).status_code for r in first] == [200, 200]
    assert INFLIGHT._value.get() == gauge
    assert (await client.get("/v1/host/workspace/files/y")).status_code == 200


@pytest.mark.parametrize("path", ["/mcp", "/mcp/wap"])
async def test_past_the_bound_an_mcp_tool_call_gets_an_error_result_saying_when_to_retry(
    held: tuple[Held, httpx.AsyncClient], path: str
) -> None:
    app, client = held
    first = [asyncio.create_task(client.get("/v1/runs")) for _ in range(2)]
    await eventually(lambda: app.entered == 2)
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "read_file"}}
    answer = await client.post(path, json=call)
    assert answer.status_code == 200
    rpc = answer.json()
    assert rpc["id"] == 7 and rpc["result"]["isError"] is True
    assert "retry in 1500 ms" in rpc["result"]["content"][0]["text"]
    listing = await client.post(path, json={"jsonrpc": "2.0", "id": "a", "method": "tools/list"})
    error = listing.json()["error"]
    assert listing.json()["id"] == "a" and error["code"] == -32000
    assert error["data"]["reason"] == "busy" and error["data"]["retry_after_ms"] == 1500
    # what is no single request with an id is answered 503, without reading past the peek
    hostile = [
        b"not json",
        b"[]",
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode(),
        json.dumps({"jsonrpc": "2.0", "id": {"x": 1}, "method": "tools/list"}).encode(),
        b'{"id": 1, "pad": "' + b"x" * MCP_PEEK_BYTES + b'"}',
    ]
    for body in hostile:
        answer = await client.post(path, content=body)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "2", body[:40]
    app.release.set()
    await asyncio.gather(*first)


def test_rest_says_retry_after_for_a_busy_service_and_not_for_other_unavailable() -> None:
    response = error_response(busy("The writer", "commands", 250, limit=9))
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    body = json.loads(bytes(response.body))
    assert body["details"]["queue"] == "commands" and "retry in 250 ms" in body["message"]
    other = error_response(QuillError("UNAVAILABLE", "No Quill writer is running"))
    assert other.status_code == 503 and "retry-after" not in other.headers
