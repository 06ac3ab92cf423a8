"""HTTP clients that are not polite: raw sockets sending half a request, going away mid-body,
or sending more than any request may hold. Each gets one bounded answer (408, 413) or a closed
connection, within the gateway's timeouts, and a client going away is one log line."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.msg import Msg

from contracts.errors import ErrorCode, QuillError
from contracts.limits import CEILINGS
from quill.client import Quill
from services.gateway.rest.edge import MAX_BODY_BYTES
from services.gateway.server import Gateway, GatewayConfig, start_gateway
from tests.helpers import eventually, start_writer_and_reader

FILE = "/v1/host/workspace/files/a.txt"
TIMEOUT_S = 1.0
"""The gateway's header and body timeouts in these tests."""
DEADLINE_S = 15.0
"""How long a test waits for an answer: well past ``TIMEOUT_S``, well short of forever."""
MCP_HEAD = "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"


@pytest_asyncio.fixture
async def gateway(nats_url: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with AsyncExitStack() as stack:
        await start_writer_and_reader(stack, nats_url, tmp_path)
        config = GatewayConfig(nats_url, port=0, header_timeout=TIMEOUT_S, body_timeout=TIMEOUT_S)
        running = await start_gateway(config)
        stack.push_async_callback(running.stop)
        yield running


async def exchange(gateway: Gateway, sent: bytes) -> bytes:
    """Send ``sent`` (and nothing more), then everything the gateway answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        writer.write(sent)
        await writer.drain()
        async with asyncio.timeout(DEADLINE_S):
            return await reader.read()
    finally:
        writer.close()


def status(answer: bytes) -> int | None:
    """The status code of an HTTP answer (None: the connection closed without one)."""
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


async def test_a_request_head_that_never_ends_is_closed(gateway: Gateway) -> None:
    partial = f"GET {FILE} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    nothing, half, slow = await asyncio.gather(
        exchange(gateway, b""),
        exchange(gateway, partial),
        exchange(gateway, b"GE"),
    )
    for answer in (nothing, half, slow):
        assert status(answer) in (None, 408), answer
    assert status(half) == 408 and b"request_timeout" in half
    # a keep-alive connection that starts a second request and stalls is closed too
    whole = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    answer = await exchange(gateway, whole + partial)
    assert status(answer) == 200 and answer.count(b"HTTP/1.1 ") == 2
    assert b"HTTP/1.1 408" in answer


@pytest.mark.parametrize("path", [FILE, "/mcp"])
async def test_a_body_that_never_ends_is_408(gateway: Gateway, path: str) -> None:
    head = f"PUT {FILE}" if path == FILE else "POST /mcp"
    sent = (
        f'{head} HTTP/1.1\r\nHost: 127.0.0.1\r\n{MCP_HEAD}Content-Length: 100\r\n\r\n{{"content": '
    ).encode()
    answer = await exchange(gateway, sent)
    assert status(answer) == 408, answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "request_timeout"


async def test_a_client_going_away_mid_body_is_one_line(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="quill.gateway")
    caplog.clear()

    def told() -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if r.exc_info or r.levelno >= logging.ERROR or "went away" in r.getMessage()
        ]

    for head in (f"PUT {FILE}", "POST /mcp"):
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(
            f"{head} HTTP/1.1\r\nHost: 127.0.0.1\r\n{MCP_HEAD}Content-Length: 1000\r\n\r\n"
            '{"content": "'.encode()
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    await eventually(lambda: len(told()) >= 2)
    assert [r for r in told() if r.exc_info or r.levelno >= logging.WARNING] == []
    assert all("\n" not in r.getMessage() for r in told())


@pytest.mark.parametrize("path", [FILE, "/mcp"])
async def test_a_declared_body_over_the_bound_is_413_at_once(gateway: Gateway, path: str) -> None:
    head = f"PUT {FILE}" if path == FILE else "POST /mcp"
    sent = (
        f"{head} HTTP/1.1\r\nHost: 127.0.0.1\r\n{MCP_HEAD}"
        f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n"
    ).encode()
    answer = await exchange(gateway, sent)  # no body sent: answered without waiting for it
    assert status(answer) == 413, answer


@pytest.mark.parametrize("path", [FILE, "/mcp"])
async def test_a_streamed_body_is_cut_at_the_bound(gateway: Gateway, path: str) -> None:
    """Chunked, so no length is declared: the gateway stops reading past ``MAX_BODY_BYTES``
    (answers 413 and closes), instead of reading (and holding) all that is sent."""
    head = f"PUT {FILE}" if path == FILE else "POST /mcp"
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    answered = asyncio.ensure_future(reader.read())
    chunk = b"x" * 65536
    framed = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    sent = 0
    try:
        writer.write(
            f"{head} HTTP/1.1\r\nHost: 127.0.0.1\r\n{MCP_HEAD}"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        async with asyncio.timeout(DEADLINE_S):
            while sent < 3 * MAX_BODY_BYTES and not answered.done():
                writer.write(framed)
                await writer.drain()
                sent += len(chunk)
    except ConnectionError:
        pass  # closed while we were sending: it stopped reading
    finally:
        async with asyncio.timeout(DEADLINE_S):
            try:
                answer = await answered
            except ConnectionError:
                answer = b""  # reset before its 413 could be read: it still stopped reading
        writer.close()
    assert sent < 3 * MAX_BODY_BYTES, "the gateway read everything that was sent"
    assert status(answer) in (None, 413), answer[:200]


async def test_the_sdk_refuses_content_no_workspace_takes_before_sending(nats_url: str) -> None:
    """No writer runs: content over ``CEILINGS.max_file_bytes`` is refused before it is
    encoded or sent (before: encoded, sent, and waited on until ``UNAVAILABLE``)."""
    async with await Quill.connect(nats_url, failover_s=2.0, retries=0) as quill:
        sent: list[str] = []

        async def note(msg: Msg) -> None:
            sent.append(msg.subject)

        sub = await quill.nc.subscribe("ws.cmd.>", cb=note)
        ws = quill.workspace("acme/big")
        for content in ("x" * (CEILINGS.max_file_bytes + 1), b"\0" * (CEILINGS.max_file_bytes + 1)):
            with pytest.raises(QuillError) as refused:
                await ws.write("big.txt", content)
            assert refused.value.code == ErrorCode.SIZE_LIMIT_EXCEEDED
            assert refused.value.details == {"max_file_bytes": CEILINGS.max_file_bytes}
        await quill.nc.flush()
        await sub.unsubscribe()
        assert sent == []
