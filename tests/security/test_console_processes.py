"""Issue 32, item 7: the console's processes page lists every live command and shell of a
workspace (``exec.list``) with a Kill button. A command line is whatever an agent typed: markup
in it must show as text on the page an operator, logged in and able to kill, is reading; and
Kill is a form like the console's others, refused without its CSRF token or from another site.

A real gateway, writer, reader and executor, over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest_asyncio

from services.executor.app import ExecutorConfig
from services.gateway.server import Gateway
from tests.gateway.conftest import gateway, nats_server, start  # noqa: F401 (fixtures)
from tests.helpers import eventually, start_executor

HOSTILE = (
    "sleep 60 # '</code></td><script>alert(\"cmd\")</script><img src=x onerror=alert(1)>' "
    '"<svg onload=alert(2)>"'
)
PAGE = "/ui/w/default/processes"


@pytest_asyncio.fixture
async def executor(gateway: Gateway, nats_url: str, tmp_path: Path) -> AsyncIterator[None]:  # noqa: F811
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        yield


def csrf_of(body: str) -> str:
    return body.split('name="csrf" value="')[1].split('"')[0]


async def test_the_processes_page_escapes_a_command_line_and_kills_with_csrf(
    gateway: Gateway,  # noqa: F811 (a fixture)
    executor: None,
) -> None:
    ws = gateway.quill.workspace("default/default")
    await ws.create(exist_ok=True)
    live = await ws.exec(HOSTILE, yield_ms=0, timeout_ms=120_000)
    assert live.running
    shell = await ws.shell()
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        body = (await http.get(PAGE)).text
        assert f'id="proc-{live.command_id}"' in body and f'id="proc-{shell.id}"' in body
        assert "&lt;script&gt;alert(&#34;cmd&#34;)&lt;/script&gt;" in body
        assert "<script>alert" not in body and "<svg onload" not in body
        assert "<img src=x" not in body
        token = csrf_of(body)
        kill = f"{PAGE}/kill"
        refused = await http.post(kill, data={"command": live.command_id})
        assert refused.status_code == 403
        wrong = await http.post(kill, data={"command": live.command_id, "csrf": "0" * 64})
        assert wrong.status_code == 403
        other_site = await http.post(
            kill,
            data={"command": live.command_id, "csrf": token},
            headers={"Origin": "https://evil.example"},
        )
        assert other_site.status_code == 403
        assert [c.command_id for c in (await ws.running()).commands] == [live.command_id]
        killed = await http.post(kill, data={"command": live.command_id, "csrf": token})
        assert killed.status_code == 303
        ended = await ws.command(live.command_id).poll(wait_ms=10_000)
        assert not ended.running and ended.exit_code == 128 + 9
        closed = await http.post(kill, data={"shell": shell.id, "csrf": token})
        assert closed.status_code == 303
        assert f"Closed shell {shell.id}" in (await http.get(closed.headers["location"])).text

        async def gone() -> bool:
            listed = await ws.running()
            return not listed.commands and not listed.shells

        await eventually(gone)
        bad = await http.post(kill, data={"command": "<b>x</b>", "csrf": token})
        assert bad.status_code == 400 and "<b>x</b>" not in bad.text
