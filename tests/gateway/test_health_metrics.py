"""``/health`` and ``/metrics``: what an operator sees."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.gateway.app import Gateway
from tests.gateway.support import error, mcp_client, ok

FILES = "/v1/host/workspace/files"


async def test_health_says_who_is_up(http: httpx.AsyncClient) -> None:
    reply = await http.get("/health")
    assert reply.status_code == 200
    assert reply.json() == {"status": "ok", "service": "quill-gateway", "version": "0.1.0"}


async def samples(http: httpx.AsyncClient) -> dict[tuple[str, str, str, str], float]:
    """``(metric, kind, op, outcome)`` → value, for the gateway's samples."""
    reply = await http.get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(reply.text):
        for s in family.samples:
            if s.labels.get("service") == "gateway":
                key = (s.name, s.labels["kind"], s.labels["op"], s.labels.get("outcome", ""))
                out[key] = s.value
    return out


async def test_metrics_count_routes_tools_and_errors(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    before = await samples(http)
    await http.put(f"{FILES}/m.txt", json={"content": "x"})
    await http.get(f"{FILES}/missing.txt")
    async with mcp_client(gateway.url) as mcp:
        await ok(mcp, "read_file", path="m.txt")
        await error(mcp, "read_file", path="nope.txt")
    after = await samples(http)

    def grew(key: tuple[str, str, str, str]) -> float:
        return after.get(key, 0) - before.get(key, 0)

    total = "quill_requests_total"
    assert grew((total, "http", "PUT /v1/host/workspace/files/{path}", "ok")) == 1
    assert grew((total, "http", "GET /v1/host/workspace/files/{path}", "404")) == 1
    assert grew((total, "mcp", "read_file", "ok")) == 1
    assert grew((total, "mcp", "read_file", "FILE_NOT_FOUND")) == 1
    assert grew(("quill_request_seconds_count", "mcp", "read_file", "")) == 2
    assert grew(("quill_request_seconds_count", "http", "POST /mcp", "")) >= 2
