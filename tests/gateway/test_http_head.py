"""The size bound of a request's head (``infra/http/bounds.py``, ``MAX_HEAD_BYTES``):
a head over it is answered 400 and closed, however it is sent, and no more than one read past
it is held; bodies and pipelined requests are not mistaken for heads."""

from __future__ import annotations

import asyncio
import re

import pytest

from infra.http.bounds import MAX_HEAD_BYTES
from services.gateway.server import Gateway

DEADLINE_S = 15.0
"""How long a test waits for the gateway to answer and close."""
HEAD_S = 120.0
"""The head deadline: far past ``DEADLINE_S``, so what closes a connection here is the size."""
FILES = "/v1/host/workspace/files"

pytestmark = pytest.mark.parametrize(
    "gateway", [{"header_timeout": HEAD_S}], indirect=True, ids=["head-timeout-120s"]
)


async def exchange(gateway: Gateway, *pieces: bytes) -> bytes:
    """Send ``pieces`` one write each (stopping if the gateway closes), then read everything
    it answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        for piece in pieces:
            if writer.is_closing() or reader.at_eof():
                break
            writer.write(piece)
            try:
                await writer.drain()
            except ConnectionError:
                break
        async with asyncio.timeout(DEADLINE_S):
            try:
                return await reader.read()
            except ConnectionError:
                return b""
    finally:
        writer.close()


def statuses(answer: bytes) -> list[int]:
    """The status of each response in ``answer`` (a body need not end its line)."""
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]


async def test_a_head_over_the_bound_is_400(gateway: Gateway) -> None:
    headers = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 100) for i in range(200))  # ~21 KB
    answer = await exchange(
        gateway, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n"
    )
    assert statuses(answer) == [400]
    assert b'"error": "bad_request"' in answer, answer


async def test_one_endless_header_line_is_cut_at_the_bound(gateway: Gateway) -> None:
    """Sent in small writes, never ending: the gateway closes the connection once the bound
    is passed (a 400, or a reset that may overtake it: the client was still sending), not
    when the head deadline comes."""
    pieces = [b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: "] + [b"b" * 1024] * 64
    answer = await exchange(gateway, *pieces)  # TimeoutError if it is not closed
    assert statuses(answer) in ([400], [])


async def test_a_head_within_the_bound_is_served(gateway: Gateway) -> None:
    pad = b"X-Pad: " + b"c" * (MAX_HEAD_BYTES - 200) + b"\r\n"
    answer = await exchange(
        gateway, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + pad + b"\r\n"
    )
    assert statuses(answer) == [200]


async def test_a_body_sent_with_its_head_is_no_head(gateway: Gateway) -> None:
    """300 KB of body in the head's own write, and in writes after it: a body, not a head."""
    body = b'{"content": "' + b"d" * 300_000 + b'"}'
    head = (
        f"PUT {FILES}/big.txt HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    assert statuses(await exchange(gateway, head + body)) == [200]
    assert statuses(await exchange(gateway, head, body[:100_000], body[100_000:])) == [200]


async def test_pipelined_requests_are_each_answered(gateway: Gateway) -> None:
    one = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    last = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    assert statuses(await exchange(gateway, one * 20 + last)) == [200] * 21
