"""Issue 28, item 4 (streams): 1,100 open ``GET /mcp`` or console live streams from one tenant
took every gateway in-flight slot (1,024): every other tenant got 503 for as long as they
stayed open, while ``/health`` said ok.

A real gateway (``start_gateway`` on a free port, a writer and a reader) with two tenants'
tokens, driven over HTTP: tenant beta opens more console live streams than the gateway has
request slots, and more than its own cap, while tenant acme's requests are served and its own
stream opens (``infra/http/streams.py``); a stateless MCP endpoint answers ``GET`` with
405 and opens nothing; ``/health`` says ``busy`` (503) while every request slot is taken, and
``ok`` again after.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import StartGateway
from tests.helpers import eventually

TOKENS = {"token-acme-0001": "acme/one", "token-beta-0001": "beta/two"}
ACME = {"Authorization": "Bearer token-acme-0001"}
BETA = {"Authorization": "Bearer token-beta-0001"}
EVENTS = {"Accept": "text/event-stream"}
FILES = "/v1/host/workspace/files"
SLOTS = 2
CAP = 4
"""Beta may keep more streams open than the gateway has request slots."""


async def opened(
    stack: contextlib.AsyncExitStack, http: httpx.AsyncClient, path: str, headers: dict[str, str]
) -> httpx.Response:
    """A live stream, open until ``stack`` closes: read up to its ``ready`` event when it was
    accepted, whole when it was refused."""
    live = await stack.enter_async_context(http.stream("GET", path, headers=headers | EVENTS))
    if live.status_code != 200:
        await live.aread()
        return live
    lines = live.aiter_lines()
    stack.push_async_callback(lines.aclose)  # kept until then: closing it closes the stream
    async for line in lines:
        if line == "data: on":
            break
    return live


async def health(http: httpx.AsyncClient) -> dict[str, Any]:
    body: dict[str, Any] = (await http.get("/health")).json()
    return body


async def test_one_tenants_streams_take_no_request_slot_and_stop_at_its_cap(
    start: StartGateway,
) -> None:
    gateway = await start(TOKENS, max_inflight=SLOTS, max_streams=CAP)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        async with contextlib.AsyncExitStack() as beta:
            for n in range(CAP):  # more than every request slot
                live = await opened(beta, http, "/ui/w/two/live", BETA)
                assert live.status_code == 200, (n, live.status_code)
            refused = await opened(beta, http, "/ui/w/two/audit/live", BETA)
            assert refused.status_code == 429, refused.status_code
            assert refused.headers["retry-after"] == "1"
            body = refused.json()
            assert body["error"] == "too_many_streams"
            assert f"beta/two has {CAP} open, at most {CAP} per caller" in body["message"]
            assert "--max-streams" in body["message"]
            expected = {"reason": "streams", "limit": CAP, "open": CAP}
            assert body["details"] | expected == body["details"]
            # the other tenant: its requests are served, its own stream opens
            for n in range(2 * SLOTS):
                listed = await http.get(FILES, headers=ACME)
                assert listed.status_code == 200, (n, listed.text)
            async with contextlib.AsyncExitStack() as acme:
                own = await opened(acme, http, "/ui/w/one/live", ACME)
                assert own.status_code == 200
                state = await health(http)
                assert state["status"] == "ok"
                assert state["http"] | {"inflight": 0, "streams": CAP + 1} == state["http"]
        # beta's streams closed: given back, beta opens one again
        await eventually(lambda: _streams_are(http, 0))
        async with contextlib.AsyncExitStack() as again:
            assert (await opened(again, http, "/ui/w/two/live", BETA)).status_code == 200


async def _streams_are(http: httpx.AsyncClient, n: int) -> bool:
    return bool((await health(http))["http"]["streams"] == n)


@pytest.mark.parametrize("path", ["/mcp", "/mcp/wap"])
async def test_a_stateless_mcp_endpoint_answers_get_with_405(
    start: StartGateway, path: str
) -> None:
    gateway = await start(TOKENS, max_inflight=SLOTS)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        for method in ("GET", "DELETE"):
            headers = ACME | EVENTS | {"Mcp-Session-Id": "x"}
            async with http.stream(method, path, headers=headers) as answer:
                if answer.status_code != 405:  # an event stream: it would never end
                    raise AssertionError(f"{method} {path}: {answer.status_code}")
                await answer.aread()
            assert answer.headers["allow"] == "POST"
            assert "stateless" in answer.json()["error"]["message"]
        for _ in range(4 * SLOTS):  # each answered at once: none holds a slot
            assert (await http.get(path, headers=ACME | EVENTS)).status_code == 405
        state = await health(http)
        assert state["http"] | {"inflight": 0, "streams": 0} == state["http"]
        listed = await http.get(FILES, headers=ACME)
        assert listed.status_code == 200


async def test_health_says_busy_while_every_request_slot_is_taken(start: StartGateway) -> None:
    """Requests whose bodies have not all come hold every slot: ``/health`` answers 503
    ``busy`` with ``Retry-After`` and says why; once they end, ``ok``."""
    gateway = await start(TOKENS, max_inflight=SLOTS)
    go_on = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield b'{"content": '
        await go_on.wait()
        yield b'"x"}'

    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        held = [
            asyncio.create_task(http.put(f"{FILES}/slow-{n}.md", content=slow_body(), headers=ACME))
            for n in range(SLOTS)
        ]
        try:
            await eventually(lambda: _inflight_is(http, SLOTS))
            answer = await http.get("/health")
            assert answer.status_code == 503
            assert answer.headers["retry-after"] == "1"
            state = answer.json()
            assert state["status"] == "busy"
            assert any("every request slot is taken (2 of 2)" in w for w in state["warnings"])
            assert state["http"] | {"inflight": SLOTS, "max_inflight": SLOTS} == state["http"]
            assert (await http.get(FILES, headers=BETA)).status_code == 503  # as it says
        finally:
            go_on.set()
            written = await asyncio.gather(*held)
        assert [w.status_code for w in written] == [200] * SLOTS
        answer = await http.get("/health")
        assert answer.status_code == 200 and answer.json()["status"] == "ok"


async def _inflight_is(http: httpx.AsyncClient, n: int) -> bool:
    """Whether the gateway serves ``n`` requests now, as its metrics say (``/metrics`` is
    never counted: asking takes no slot from the requests held)."""
    exposition = (await http.get("/metrics")).text
    for family in text_string_to_metric_families(exposition):
        if family.name == "quill_gateway_inflight_requests":
            return bool(family.samples[0].value == n)
    raise AssertionError("no quill_gateway_inflight_requests in /metrics")


FLOOD = 1_100
"""The attack's streams: more than the gateway's 1,024 request slots (``GATEWAY_MAX_INFLIGHT``)."""


@pytest.mark.slow
async def test_the_attacks_1100_streams_leave_every_request_slot_free(start: StartGateway) -> None:
    """The attack at its size, on a gateway with the default request slots: beta's 1,100
    live streams (all admitted: its cap raised to that) take none of them; acme is served,
    ``/health`` says ok and counts them; beta's next stream is refused."""
    gateway = await start(TOKENS, max_streams=FLOOD)
    limits = httpx.Limits(max_connections=FLOOD + 16, max_keepalive_connections=16)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60, limits=limits) as http:
        async with contextlib.AsyncExitStack() as beta:
            for n in range(FLOOD):
                live = await opened(beta, http, "/ui/w/two/live", BETA)
                assert live.status_code == 200, (n, live.status_code)
            refused = await opened(beta, http, "/ui/w/two/live", BETA)
            assert refused.status_code == 429
            for n in range(2 * SLOTS):
                listed = await http.get(FILES, headers=ACME)
                assert listed.status_code == 200, (n, listed.text)
            state = await health(http)
            assert state["status"] == "ok"
            assert state["http"] | {"inflight": 0, "streams": FLOOD} == state["http"]
