"""MCP ``tools/call read_file`` round trips through the gateway, next to the same read through
the SDK over NATS (the gateway's own cost), in one run."""

from __future__ import annotations

import asyncio
import json
import re
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


def up(data: Path) -> tuple[Process, str, str]:
    proc, nats_url = quill_up(data)
    found = re.search(r"http=(\S+)", proc.line)
    assert found is not None
    return proc, nats_url, found.group(1)


async def main(seconds: float = 4.0, rounds: int = 3) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc, nats_url, http_url = up(Path(tmp) / "quill")
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

            async def mcp() -> Load:
                # Fresh connections each round: the server drops idle keep-alives after 5 s.
                connections[:] = [await Connection.open(http_url) for _ in range(CLIENTS)]
                try:
                    return await closed_loop(CLIENTS, mcp_call, seconds)
                finally:
                    for connection in connections:
                        connection.close()

            async def sdk() -> Load:
                return await closed_loop(CLIENTS, sdk_call, seconds)

            base, ours = await interleaved(rounds, sdk, mcp)
            print(
                f"Gateway: {CLIENTS} closed-loop clients, {rounds} rounds of {seconds:.0f}s "
                "alternating (median round); quill up on one machine\n"
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
            await quill.close()
        finally:
            proc.stop()


if __name__ == "__main__":
    asyncio.run(main())
