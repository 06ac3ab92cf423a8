"""MCP ``tools/call read_file`` round trips through the gateway, next to the same read through
the SDK over NATS (the gateway's own cost), in one run; then, driven by ``wrk`` (when it is on
the PATH), the same MCP call next to a REST ``GET`` of the same file through the same gateway.

The gateway runs ``quill up``'s default number of workers (half the cores) unless
``workers`` says otherwise; its CPU per call (every worker's, from ``/proc``) is printed too,
the figure a shared machine disturbs least."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.harness import Load, Process, closed_loop, interleaved, quill_up, row
from quill.client import Quill

CLIENTS = 16
TEXT = "".join(f"line {i}: the quick brown fox\n" for i in range(30))  # ~1 KB


class Connection:
    """A minimal HTTP/1.1 keep-alive client: the load generator must not eat the cores the
    gateway needs (httpx costs ~3 ms of CPU a request here)."""

    def __init__(
        self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.host, self.reader, self.writer = host, reader, writer

    @classmethod
    async def open(cls, url: str) -> Connection:
        netloc = url.removeprefix("http://").rstrip("/")
        host, _, port = netloc.partition(":")
        return cls(netloc, *await asyncio.open_connection(host, int(port)))

    async def post(self, path: str, body: bytes) -> bytes:
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n"
            "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        return await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def up(data: Path, workers: int | None = None) -> tuple[Process, str, str]:
    proc, nats_url = quill_up(data, *(["--gateway-workers", str(workers)] if workers else []))
    found = re.search(r"http=(\S+)", proc.line)
    assert found is not None
    return proc, nats_url, found.group(1)


def gateway_pids(proc: Process) -> list[int]:
    """The gateway's processes under ``quill up`` (its workers included)."""
    table = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True)
    rows = [line.split(None, 2) for line in table.stdout.splitlines()[1:]]
    found, parents = [], {proc.proc.pid}
    while parents:
        kids = [r for r in rows if int(r[1]) in parents and len(r) == 3]
        parents = {int(r[0]) for r in kids}
        found += [int(r[0]) for r in kids if " gateway " in r[2] or "spawn_main" in r[2]]
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of ``pids`` so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


class Wrk:
    """``wrk`` with ``CLIENTS`` connections against one URL: calls a second, p50/p99."""

    LUA = """wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
"""

    def __init__(self, tmp: Path, body: bytes) -> None:
        self.script = tmp / "mcp.lua"
        self.script.write_text(self.LUA.format(body=json.dumps(body.decode())))

    def run(self, url: str, seconds: float, post: bool) -> Load:
        argv = ["wrk", "-t2", f"-c{CLIENTS}", f"-d{seconds:.0f}s", "--latency"]
        argv += ["-s", str(self.script)] if post else []
        out = subprocess.run([*argv, url], capture_output=True, text=True, check=True).stdout
        if "Non-2xx" in out or "Socket errors" in out:
            raise RuntimeError(f"wrk saw errors:\n{out}")
        rate = float(re.search(r"Requests/sec:\s*([\d.]+)", out).group(1))  # type: ignore[union-attr]
        pcts = {
            q: _ms(*re.search(rf"\s{q}%\s+([\d.]+)(us|ms|s)", out).groups())  # type: ignore[union-attr]
            for q in ("50", "99")
        }
        # A Load of the median round: wrk gives percentiles, not each latency.
        return Load(
            round(rate * seconds), seconds, [pcts["50"] / 1000] * 98 + [pcts["99"] / 1000] * 2
        )

    async def load(self, url: str, seconds: float, post: bool) -> Load:
        return await asyncio.to_thread(self.run, url, seconds, post)


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


async def main(seconds: float = 4.0, rounds: int = 3, workers: int | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc, nats_url, http_url = up(Path(tmp) / "quill", workers)
        try:
            quill = await Quill.connect(nats_url, timeout=30)
            ws = quill.workspace("default/default")
            await ws.create(exist_ok=True)
            await ws.write("notes.md", TEXT)
            body = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tools/call",
                    "params": {"name": "read_file", "arguments": {"path": "notes.md"}},
                }
            ).encode()
            connections: list[Connection] = []

            async def mcp_call(n: int, i: int) -> None:
                answer = await connections[n].post("/mcp", body)
                assert b'"isError":false' in answer, answer

            async def sdk_call(n: int, i: int) -> None:
                await ws.read("notes.md")

            pids = gateway_pids(proc)
            spent = [0.0, 0]  # gateway CPU seconds, calls: over the MCP rounds

            async def mcp() -> Load:
                # Fresh connections each round: the server drops idle keep-alives after 5 s.
                connections[:] = [await Connection.open(http_url) for _ in range(CLIENTS)]
                try:
                    before = cpu_seconds(pids)
                    load = await closed_loop(CLIENTS, mcp_call, seconds, warmup=0)
                    spent[0] += cpu_seconds(pids) - before
                    spent[1] += load.ops
                    return load
                finally:
                    for connection in connections:
                        connection.close()

            async def sdk() -> Load:
                return await closed_loop(CLIENTS, sdk_call, seconds)

            base, ours = await interleaved(rounds, sdk, mcp)
            print(
                f"Gateway: {CLIENTS} closed-loop clients, {rounds} rounds of {seconds:.0f}s "
                f"alternating (median round); quill up on one machine, {len(pids)} gateway "
                f"process(es) on {os.cpu_count()} cores\n"
            )
            print(f"{'figure':<44} {'gateway':>16} {'sdk/nats':>16} {'ratio':>8}  note")
            print(
                row(
                    "MCP tools/call read_file (1 KB)",
                    f"{ours.rate:,.0f}/s",
                    f"{base.rate:,.0f}/s",
                    ours.rate / base.rate,
                    "HTTP+MCP over the same NATS read",
                )
            )
            print(
                row(
                    "  p50/p99 latency",
                    f"{ours.pct(0.5):.1f}/{ours.pct(0.99):.1f} ms",
                    f"{base.pct(0.5):.1f}/{base.pct(0.99):.1f} ms",
                    ours.pct(0.5) / base.pct(0.5),
                    "(latency ratio)",
                )
            )
            print(f"{'  gateway CPU per call':<44} {1000 * spent[0] / spent[1]:>14.3f}ms")
            await wrk_figures(Path(tmp), body, http_url, base, seconds, rounds)
            await quill.close()
        finally:
            proc.stop()


async def wrk_figures(
    tmp: Path, body: bytes, http_url: str, bus: Load, seconds: float, rounds: int
) -> None:
    """MCP ``tools/call read_file`` and REST ``GET`` of the same file, each driven by ``wrk``
    (``CLIENTS`` connections), alternating rounds; ``bus``: the SDK read measured above."""
    if shutil.which("wrk") is None:
        print("wrk: skipped (wrk is not on the PATH; apt-get install wrk)")
        return
    wrk = Wrk(tmp, body)
    rest_url = f"{http_url}/v1/host/workspace/files/notes.md"
    mcp, rest = await interleaved(
        rounds,
        lambda: wrk.load(f"{http_url}/mcp", seconds, post=True),
        lambda: wrk.load(rest_url, seconds, post=False),
    )
    print()
    print(f"{'wrk, ' + str(CLIENTS) + ' connections':<44} {'ours':>16} {'baseline':>16}")
    print(
        row(
            "MCP tools/call vs REST GET",
            f"{mcp.rate:,.0f}/s",
            f"{rest.rate:,.0f}/s",
            mcp.rate / rest.rate,
            "goal >= 0.5x",
        )
    )
    print(
        row(
            "  p50/p99 latency",
            f"{mcp.pct(0.5):.1f}/{mcp.pct(0.99):.1f} ms",
            f"{rest.pct(0.5):.1f}/{rest.pct(0.99):.1f} ms",
            mcp.pct(0.5) / rest.pct(0.5),
            "(latency ratio)",
        )
    )
    print(
        row(
            "REST GET vs the SDK read (bus)",
            f"{rest.rate:,.0f}/s",
            f"{bus.rate:,.0f}/s",
            rest.rate / bus.rate,
            "goal >= 0.5x",
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
