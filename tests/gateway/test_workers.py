"""Several gateway processes on one port (``infra/http/workers.py``): each serves, one
that dies is restarted, none outlives the gateway that started it."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infra.http.scrape import Whole
from services.gateway.server import Gateway, GatewayConfig, start_gateway
from tests.gateway.support import mcp_client, ok
from tests.gateway.test_process import processes, spawn  # noqa: F401
from tests.helpers import (
    QuietHandler,
    eventually,
    http_server,
    start_writer,
    start_writer_and_reader,
)

__all__ = ["processes"]


def owner(server_port: int, client_port: int, pids: list[int]) -> int | None:
    """Which of ``pids`` holds the server side of the TCP connection from ``client_port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, remote = fields[1], fields[2]
                if (
                    int(local.rsplit(":", 1)[1], 16) == server_port
                    and int(remote.rsplit(":", 1)[1], 16) == client_port
                ):
                    inodes.add(f"socket:[{fields[9]}]")
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return pid
            except OSError:
                continue
    return None


async def served_by(gateway: Gateway, pids: list[int]) -> set[int]:
    """Open connections until each of ``pids`` has answered one (at most 200 tries); the pids
    that answered."""
    answered: set[int] = set()
    for _ in range(200):
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        try:
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # kept open meanwhile
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            client_port = writer.get_extra_info("sockname")[1]
            pid = owner(gateway.port, client_port, pids)
            if pid is not None:
                answered.add(pid)
        finally:
            writer.close()
        if answered == set(pids):
            break
    return answered


@pytest.fixture
async def two(nats_url: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    """A gateway of two workers (this process and one more)."""
    async with AsyncExitStack() as stack:
        await start_writer_and_reader(stack, nats_url, tmp_path)
        gateway = await start_gateway(GatewayConfig(nats_url, port=0, workers=2))
        stack.push_async_callback(gateway.stop)
        yield gateway


def pids(gateway: Gateway) -> list[int]:
    assert gateway.workers is not None
    return [os.getpid(), *(p.pid for p in gateway.workers.processes.values() if p.pid)]


async def test_each_worker_answers(two: Gateway) -> None:
    everyone = pids(two)
    assert len(everyone) == 2
    assert await served_by(two, everyone) == set(everyone)
    async with mcp_client(two.url) as client:  # and MCP, through whichever it reaches
        await ok(client, "write_file", path="a.md", content="one\n")
        assert await ok(client, "read_file", path="a.md") == "one\n"


async def test_a_worker_that_dies_is_restarted(two: Gateway) -> None:
    assert two.workers is not None
    (dead,) = two.workers.processes.values()
    os.kill(dead.pid, signal.SIGKILL)  # type: ignore[arg-type]
    await asyncio.wait_for(two.workers.restarted.wait(), 60)
    assert two.workers.restarts == 1
    (fresh,) = two.workers.processes.values()
    assert fresh.pid != dead.pid and fresh.is_alive()
    assert await served_by(two, pids(two)) == set(pids(two))


async def test_stopping_stops_every_worker(nats_url: str, tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        await start_writer_and_reader(stack, nats_url, tmp_path)
        gateway = await start_gateway(GatewayConfig(nats_url, port=0, workers=3))
        assert gateway.workers is not None
        children = list(gateway.workers.processes.values())
        assert len(children) == 2
        await gateway.stop()
        assert all(not p.is_alive() for p in children)
        with pytest.raises(httpx.TransportError):
            async with httpx.AsyncClient() as http:
                await http.get(gateway.url + "/health")


async def serving(gateway: asyncio.subprocess.Process, workers: int) -> None:
    """Read the gateway's log until each of its ``workers`` said it serves."""
    assert gateway.stdout is not None
    said = 0
    while said < workers:
        line = await asyncio.wait_for(gateway.stdout.readline(), 60)
        assert line, "the gateway exited"
        said += b" serving http://" in line


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                continue
    return found


async def test_workers_stop_when_the_gateway_is_killed(
    nats_url: str,
    tmp_path: Path,
    processes: list[asyncio.subprocess.Process],  # noqa: F811
) -> None:
    """``quill gateway --workers 2`` killed outright (no chance to stop its workers): the
    worker sees its parent gone and stops, rather than hold the port as an orphan."""
    async with AsyncExitStack() as stack:
        await start_writer_and_reader(stack, nats_url, tmp_path)
        port = str(_free_port())
        gateway = await spawn(
            "gateway", "--nats-url", nats_url, "--http-port", port, "--workers", "2"
        )
        processes.append(gateway)
        await serving(gateway, 2)
        workers = [p for p in children_of(gateway.pid) if b"spawn_main" in _cmdline(p)]
        assert len(workers) == 1
        os.kill(gateway.pid, signal.SIGKILL)
        await gateway.wait()
        await eventually(lambda: not alive(workers[0]), 30, "the worker to stop after its gateway")


async def test_quill_gateway_workers_refuses_zero(
    processes: list[asyncio.subprocess.Process],  # noqa: F811
) -> None:
    gateway = await spawn("gateway", "--workers", "0")
    processes.append(gateway)
    output, _ = await asyncio.wait_for(gateway.communicate(), 30)
    assert gateway.returncode == 2
    assert "--workers" in output.decode(), output


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def _free_port() -> int:
    from quill_cli.stack import free_port

    return free_port()


def _requests(text: str, worker: str | None = None) -> float:
    """The gateway's ``GET /health`` count in an exposition (of one ``worker``, or all)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "quill_requests_total"
                and labels.get("op") == "GET /health"
                and (worker is None or labels.get("worker") == worker)
            ):
                total += sample.value
    return total


async def test_metrics_of_two_workers_add_up(nats_url: str, tmp_path: Path) -> None:
    """Whichever worker a scrape lands on, it sees both workers' counts: as many ``GET
    /health`` as were sent, spread over ``worker`` 0 and 1, with each worker's own memory."""
    async with AsyncExitStack() as stack:
        await start_writer(stack, nats_url, tmp_path / "writer")
        gateway = await start_gateway(GatewayConfig(nats_url, port=0, workers=2, metrics_port=0))
        stack.push_async_callback(gateway.stop)
        everyone = pids(gateway)
        assert await served_by(gateway, everyone) == set(everyone)  # each answered a /health
        assert gateway.scrape is not None and gateway.scrape.server is not None
        before = _requests(httpx.get(gateway.scrape.server.url).text)
        sent = 40
        for _ in range(sent):  # a new connection each: the kernel spreads them
            async with httpx.AsyncClient() as http:
                assert (await http.get(gateway.url + "/health")).status_code == 200
        whole = httpx.get(gateway.scrape.server.url).text
        assert _requests(whole) - before == sent
        assert _requests(whole, "0") > 0 and _requests(whole, "1") > 0
        memory = {
            s.labels["worker"]: s.value
            for f in text_string_to_metric_families(whole)
            for s in f.samples
            if s.name == "process_resident_memory_bytes"
        }
        assert set(memory) == {"0", "1"} and all(v > 0 for v in memory.values())
        seen = set()
        for _ in range(40):  # GET /metrics on the HTTP port, whichever worker answers
            async with httpx.AsyncClient() as http:
                answer = await http.get(gateway.url + "/metrics")
            assert answer.status_code == 200
            seen.add(_requests(answer.text) >= sent)
        assert seen == {True}


def test_a_worker_answering_garbage_or_nothing_is_left_out() -> None:
    """The whole scrape survives a peer that answers something else than metrics, and one
    that does not answer (a worker being restarted): worker 0's series are still there."""

    class Garbage(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.answer(200, b"# TYPE x counter\nx{{{ not metrics\n")

    with http_server(Garbage) as port:
        whole = Whole(lambda: {1: f"http://127.0.0.1:{port}/metrics", 2: "http://127.0.0.1:1/"})
        workers = {s.labels.get("worker") for family in whole.collect() for s in family.samples}
        assert workers == {"0"}
