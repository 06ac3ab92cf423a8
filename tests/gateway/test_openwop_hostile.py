"""The openwop surface (discovery, the file list's paging, runs) as a hostile client uses it:
no token, a wrong or another tenant's token, bad paging, bad run ids, huge or malformed
bodies. Every request goes to a real gateway over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio

from services.gateway.rest.edge import MAX_BODY_BYTES
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway

FILES = "/v1/host/workspace/files"
OWNER, STRANGER = "owner-token-1", "stranger-token-1"


@pytest_asyncio.fixture
async def host(start: StartGateway) -> Gateway:
    return await start({OWNER: "acme/agents", STRANGER: "other/agents"})


@pytest_asyncio.fixture
async def owner(host: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    auth = {"Authorization": f"Bearer {OWNER}"}
    async with httpx.AsyncClient(base_url=host.url, headers=auth, timeout=30) as http:
        yield http


async def test_discovery_is_open_and_everything_else_is_not(host: Gateway) -> None:
    async with httpx.AsyncClient(base_url=host.url) as anonymous:
        public = await anonymous.get("/.well-known/openwop")
        assert public.status_code == 200
        for method, path in (
            ("GET", FILES),
            ("GET", f"{FILES}/a.md"),
            ("PUT", f"{FILES}/a.md"),
            ("DELETE", f"{FILES}/a.md"),
            ("POST", "/v1/runs"),
            ("GET", "/v1/runs/x:1"),
            ("POST", "/v1/runs/x:1/cancel"),
        ):
            reply = await anonymous.request(method, path, json={"workflowId": "w"})
            assert (reply.status_code, reply.json()) == (401, {"error": "unauthorized"}), path
        for header in ("Bearer wrong-token-000", "Basic b3duZXI6cHc=", "Bearer"):
            wrong = await anonymous.get(  # an unknown token reads as no token, not a 401
                "/.well-known/openwop", headers={"Authorization": header}
            )
            assert wrong.json() == public.json()
            assert wrong.headers["cache-control"] == public.headers["cache-control"]


async def test_anonymous_discovery_tells_nothing_of_any_tenant(
    nats_url: str, start: StartGateway
) -> None:
    from contracts.limits import LimitsPatch
    from quill.client import Quill

    quill = await Quill.connect(nats_url)
    try:  # a workspace with its own limits: its token is told them, nobody else
        await quill.workspace("acme/tiny").create(limits=LimitsPatch(max_file_bytes=77))
    finally:
        await quill.close()
    gateway = await start({"tiny-token-123": "acme/tiny"})
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        public = await http.get("/.well-known/openwop")
        known = await http.get(
            "/.well-known/openwop", headers={"Authorization": "Bearer tiny-token-123"}
        )
    assert known.json()["workspace"]["maxFileBytes"] == 77
    assert known.headers["cache-control"].startswith("private")
    assert public.json()["workspace"]["maxFileBytes"] != 77
    for secret in ("acme", "tiny", '"maxFileBytes":77'):
        assert secret not in public.text, secret
    assert "authorization" in public.headers["vary"].lower()


async def test_discovery_without_tokens_refuses_nothing_and_tells_a_rebinder_nothing(
    start: StartGateway,
) -> None:
    gateway = await start()  # no tokens: loopback only
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        local = await http.get("/.well-known/openwop")
        rebound = await http.get("/.well-known/openwop", headers={"Host": "evil.example"})
    assert local.status_code == rebound.status_code == 200
    assert rebound.headers["cache-control"].startswith("public")  # not the default workspace's


async def test_bad_paging_parameters_are_400(owner: httpx.AsyncClient) -> None:
    await owner.put(f"{FILES}/a.md", json={"content": "x"})
    for params in (
        {"limit": "0"},
        {"limit": "-5"},
        {"limit": "10001"},
        {"limit": "1e3"},
        {"limit": ""},
        {"limit": "9" * 100},
        {"after": "a/../b"},
        {"after": "bad\x00name"},
        {"runId": "has space"},
        {"runId": "x" * 129},
        {"runId": "../../etc"},
    ):
        reply = await owner.get(FILES, params=params)
        assert reply.status_code == 400, params
        assert reply.json()["error"] == "invalid_argument", params
    escape = await owner.get(FILES, params={"after": "../../etc/passwd"})
    assert escape.status_code == 403
    unknown = await owner.get(FILES, params={"runId": "no-such-run"})
    assert (unknown.status_code, unknown.json()) == (404, {"error": "not_found"})
    run = (await owner.post("/v1/runs", json={"workflowId": "w"})).json()["runId"]
    both = await owner.get(f"{FILES}/a.md", params={"version": "1", "runId": run})
    assert (both.status_code, both.json()["error"]) == (400, "invalid_argument")


async def test_a_link_next_keeps_the_query_and_cannot_be_steered(owner: httpx.AsyncClient) -> None:
    for name in ("a&limit=1.md", "b.md", "c.md"):
        await owner.put(f"{FILES}/{name.replace('&', '%26')}", json={"content": "x"})
    first = await owner.get(FILES, params={"limit": "1", "prefix": ""})
    assert [f["path"] for f in first.json()["files"]] == ["a&limit=1.md"]
    link = first.headers["link"]
    target = link[1 : link.index(">")]
    assert target.startswith(f"{FILES}?") and "after=a%26limit%3D1.md" in target
    second = await owner.get(target)
    assert [f["path"] for f in second.json()["files"]] == ["b.md"]  # limit stayed 1


async def declared_over_the_bound(http: httpx.AsyncClient, path: str) -> int:
    """The status answered to a request declaring a body over the gateway's bound (sent
    by hand: no body follows, the answer must come at once)."""
    url = http.base_url
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {OWNER}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n"
        )
        writer.write(head.encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 30)
    finally:
        writer.close()
    return int(line.split()[1])


async def test_run_bodies_a_client_can_get_wrong(owner: httpx.AsyncClient) -> None:
    bodies: list[bytes] = [
        b"not json",
        b"[]",
        b"{}",
        b'{"workflowId": ""}',
        b'{"workflowId": 7}',
        b'{"workflowId": "a/b"}',
        b'{"workflowId": "x:y"}',
        b'{"workflowId": "' + b"w" * 101 + b'"}',
        b'{"workflowId": "w", "mode": "eval"}',
        b'{"workflowId": "w", "runId": "chosen"}',
        b'{"workflowId": ' + b"[" * 50_000,
    ]
    for raw in bodies:
        reply = await owner.post("/v1/runs", content=raw)
        assert (reply.status_code, reply.json()["error"]) == (400, "invalid_argument"), raw[:40]
    assert await declared_over_the_bound(owner, "/v1/runs") == 413
    ok = await owner.post(
        "/v1/runs", json={"workflowId": "w", "inputs": {"a": 1}, "tags": ["t"], "tenantId": "acme"}
    )
    assert ok.status_code == 201


async def test_run_ids_a_client_can_make_up(owner: httpx.AsyncClient) -> None:
    for run in ("nope", "x" * 200, "a%20b", "%2e%2e", "a:b:c", "run-agents-1"):
        for method, path in (("GET", f"/v1/runs/{run}"), ("POST", f"/v1/runs/{run}/cancel")):
            reply = await owner.request(method, path)
            assert (reply.status_code, reply.json()) == (404, {"error": "not_found"}), path
