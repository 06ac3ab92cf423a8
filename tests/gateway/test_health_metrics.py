"""``/health`` and ``/metrics``: what an operator sees."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.executor.app import ExecutorConfig
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway
from tests.gateway.support import error, mcp_client, ok
from tests.helpers import eventually, start_executor

FILES = "/v1/host/workspace/files"


async def test_health_says_who_is_up(http: httpx.AsyncClient) -> None:
    reply = await http.get("/health")
    assert reply.status_code == 200
    body = reply.json()
    assert {k: body[k] for k in ("status", "service", "version")} == {
        "status": "ok",
        "service": "quill-gateway",
        "version": "0.1.0",
    }
    assert "warnings" not in body


async def test_health_warns_of_an_executor_without_cgroups(
    nats_url: str, start: StartGateway, tmp_path: Path
) -> None:
    """An executor that cannot give each sandbox a cgroup (here: the local provider, which
    never does) is named in ``/health``: an operator's probe sees the risk."""
    async with AsyncExitStack() as stack:
        executor = await start_executor(
            stack, nats_url, tmp_path / "executor", ExecutorConfig(sandbox="local")
        )
        gateway = await start()
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:

            async def pinged() -> dict[str, Any] | None:  # the gateway's first round of pings
                body: dict[str, Any] = (await http.get("/health")).json()
                return body if "executors" in body else None

            body = await eventually(pinged)
        assert body["status"] == "ok"
        assert body["executors"] == {"answered": 1, "without_cgroups": [executor.instance]}
        assert executor.instance in body["warnings"][0] and "cgroup" in body["warnings"][0]


async def samples(http: httpx.AsyncClient) -> dict[tuple[str, str, str, str], float]:
    """``(metric, kind, op, outcome)`` → value, for the gateway's request samples (other
    families, such as its busy rejections, have no ``kind``; one test module's process may
    hold another's)."""
    reply = await http.get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(reply.text):
        if family.name not in ("quill_requests", "quill_request_seconds"):
            continue
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
