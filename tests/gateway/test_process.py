"""``quill gateway`` and ``quill up`` as real processes, as an operator runs them."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from infra import bus
from quill_cli.stack import free_port
from tests.gateway.conftest import StartGateway
from tests.gateway.support import mcp_client, ok
from tests.helpers import eventually
from tests.up import READY, running

FILES = "/v1/host/workspace/files"


def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text('[tokens."token-for-tests"]\ntenant = "acme"\nworkspace = "ops"\n')
    return path


async def healthy(url: str, process: asyncio.subprocess.Process, timeout: float = 30) -> None:
    """Until ``GET /health`` answers 200 (failing if the process dies meanwhile)."""
    async with httpx.AsyncClient() as http:

        async def answers() -> bool:
            assert process.returncode is None, "the process exited"
            return (await http.get(url + "/health")).status_code == 200

        await eventually(answers, timeout, f"{url}/health", ignoring=(httpx.TransportError,))


async def spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quill",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.fixture
async def processes() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Processes a test starts; any still running at the end is killed (its group, by id)."""
    started: list[asyncio.subprocess.Process] = []
    yield started
    for process in started:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await asyncio.wait_for(process.wait(), 30)


async def stop(process: asyncio.subprocess.Process) -> tuple[int, str]:
    """SIGTERM, as Ctrl-C or a supervisor would; the exit status and everything it printed."""
    process.send_signal(signal.SIGTERM)
    output, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, output.decode()


async def test_quill_gateway_serves_pings_and_stops(
    start: StartGateway,
    nats_url: str,
    tmp_path: Path,
    processes: list[asyncio.subprocess.Process],
) -> None:
    port = free_port()
    gateway = await spawn(
        "gateway", "--nats-url", nats_url, "--http-port", str(port), "--tokens",
        str(tokens_file(tmp_path)), "--log-format", "json",
    )  # fmt: skip
    processes.append(gateway)
    url = f"http://127.0.0.1:{port}"
    await healthy(url, gateway)
    nc = await bus.connect(nats_url, "test-ping")
    try:
        pong = json.loads((await nc.request("ws.sys.ping.gateway", b"", timeout=5)).data)
    finally:
        await nc.close()
    assert pong["service"] == "gateway" and pong["http_url"] == url
    auth = {"Authorization": "Bearer token-for-tests"}
    async with httpx.AsyncClient(base_url=url, headers=auth) as http:
        put = await http.put(f"{FILES}/runbook.md", json={"content": "restart it"})
        assert put.status_code == 200
    code, output = await stop(gateway)
    assert code == 0, output
    assert all(json.loads(line)["level"] for line in output.splitlines() if line.strip())


async def test_quill_gateway_refuses_a_public_address_without_tokens() -> None:
    process = await spawn("gateway", "--host", "0.0.0.0", "--http-port", "0")
    output, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2
    assert output.decode().strip() == (
        "quill: --host 0.0.0.0 needs --tokens: without tokens the gateway serves loopback only"
    )


async def test_quill_up_starts_the_gateway_with_tokens(tmp_path: Path) -> None:
    with running(tmp_path / ".quill", "--tokens", str(tokens_file(tmp_path))) as up:
        assert READY.search(up.output[0]), up.output  # its first line
        url = up.http_url
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url) and not url.endswith(":0")
        async with httpx.AsyncClient(base_url=url) as http:
            health = await http.get("/health")
            assert (health.status_code, health.json()["service"]) == (200, "quill-gateway")
            assert (await http.get(FILES)).status_code == 401
            auth = {"Authorization": "Bearer token-for-tests"}
            put = await http.put(f"{FILES}/notes.md", json={"content": "hello"}, headers=auth)
            assert put.status_code == 200
        async with mcp_client(url, token="token-for-tests") as mcp:
            assert await ok(mcp, "read_file", path="notes.md") == "hello"
        stack = json.loads((tmp_path / ".quill" / "stack.json").read_text())
        assert stack["http_url"] == url
        assert up.stop() == 0


async def test_quill_up_refuses_a_bad_tokens_file(tmp_path: Path) -> None:
    bad = tmp_path / "tokens.toml"
    bad.write_text("[tokens]\n")
    result = subprocess.run(
        [sys.executable, "-m", "quill", "up", "--data", str(tmp_path / "q"), "--tokens", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("quill: ") and "no [tokens" in result.stderr


async def test_quill_gateway_reports_a_busy_port(start: StartGateway, nats_url: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        process = await spawn("gateway", "--nats-url", nats_url, "--http-port", str(port))
        output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1
    assert output.decode().splitlines()[-1] == (
        f"quill: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


async def test_quill_gateway_reports_a_host_it_cannot_resolve(
    start: StartGateway, nats_url: str, tmp_path: Path
) -> None:
    host = "no-such-host.invalid"
    tokens = str(tokens_file(tmp_path))
    process = await spawn("gateway", "--nats-url", nats_url, "--host", host, "--tokens", tokens)
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1
    last = output.decode().splitlines()[-1]
    assert last.startswith("quill: cannot listen on no-such-host.invalid:8080: "), last
    assert "Unknown error" not in last
