"""After Approve, the console shows what came of it (Quill carries the request out itself,
its client there or not): the version a change committed, a command's exit code with a link
to its page, or the error. In headless Chromium over a real gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import expect

from contracts.errors import ErrorCode, QuillError
from quill.client import Workspace
from services.executor.app import Executor, ExecutorConfig
from services.gateway.server import Gateway
from tests.helpers import start_executor

WS = "default/default"


@pytest_asyncio.fixture
async def local_executor(nats_url: str, tmp_path: Path) -> AsyncIterator[Executor]:
    async with AsyncExitStack() as stack:
        config = ExecutorConfig(sandbox="local")
        yield await start_executor(stack, nats_url, tmp_path / "executor", config)


async def parked(call: Any) -> str:
    with pytest.raises(QuillError) as info:
        await call
    assert info.value.code == ErrorCode.APPROVAL_REQUIRED
    return str(info.value.details["approval_id"])


async def approve_on_the_page(page: Any, gateway: Gateway, approval_id: str) -> None:
    await page.goto(f"{gateway.url}/ui/w/default/approvals")
    article = page.locator("article.approval").filter(has_text=approval_id)
    await article.get_by_role("button", name="Approve").click()
    await expect(page).to_have_url(f"{gateway.url}/ui/w/default/approvals/{approval_id}")


async def restricted(gateway: Gateway) -> tuple[Workspace, Workspace]:
    ws = gateway.quill.workspace(WS)
    await ws.create(exist_ok=True)
    await ws.write("plan.md", "old\n")
    await ws.set_trust("restricted", commands=True)
    agent = gateway.quill.as_actor("agent-7", session="s-agent")
    return ws, agent.workspace(WS)


async def test_an_approved_change_shows_the_version_it_committed(
    gateway: Gateway, page: Any
) -> None:
    ws, agent = await restricted(gateway)
    approval_id = await parked(agent.write("plan.md", "new\n"))  # the agent goes away
    await approve_on_the_page(page, gateway, approval_id)
    await expect(page.locator("#decision")).to_contain_text("✓ approved")
    result = page.locator("#result")
    await expect(result).to_contain_text("✓ done: committed version")
    await result.get_by_role("link").click()  # its diff
    await expect(page.locator("main")).to_contain_text("+new")
    assert await ws.read_text("plan.md") == "new\n"


async def test_an_approved_change_that_fails_shows_its_error(gateway: Gateway, page: Any) -> None:
    ws, agent = await restricted(gateway)
    etag = (await ws.stat("plan.md")).etag
    late = await parked(agent.write("plan.md", "late\n", if_match=etag))
    sooner = await parked(agent.write("plan.md", "sooner\n"))
    await ws.approve(sooner)
    await ws.wait_approval(sooner, timeout=30)
    await approve_on_the_page(page, gateway, late)
    await expect(page.locator("#result")).to_contain_text("✗ CONFLICT")
    assert await ws.read_text("plan.md") == "sooner\n"


async def test_an_approved_command_shows_its_exit_code_and_page(
    gateway: Gateway, page: Any, local_executor: Executor
) -> None:
    _, agent = await restricted(gateway)
    approval_id = await parked(agent.exec("echo made > made.txt; exit 3"))
    await approve_on_the_page(page, gateway, approval_id)
    result = page.locator("#result")
    await expect(result).to_contain_text("✗ exit code 3")
    await expect(result).to_contain_text("committed version")
    await page.locator("#command-link").click()
    await expect(page).to_have_url(f"{gateway.url}/ui/w/default/commands/{approval_id}")
    await expect(page.locator("main")).to_contain_text("made.txt")
