"""The commands page as a person sees it: each command that ran (exit code, duration, timed out,
its change set and diff), a running command's output arriving live, and nothing of another
tenant's commands."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from playwright.async_api import expect

from services.executor.app import Executor
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway


async def test_each_command_with_its_exit_code_change_set_and_diff(
    gateway: Gateway, executor: Executor, page: Any
) -> None:
    ws = gateway.quill.workspace("default/default")
    await ws.create(exist_ok=True)
    failed = await ws.exec("echo made > out.txt; echo oops >&2; exit 3")
    slow = await ws.exec("sleep 30", timeout_ms=300)
    assert failed.exit_code == 3 and slow.timed_out
    await page.goto(f"{gateway.url}/ui/w/default/commands")
    row = page.locator(f"#cmd-{failed.command_id}")
    await expect(row).to_contain_text("echo made > out.txt")
    await expect(row).to_contain_text("✗ 3")
    await expect(row).to_contain_text("no")  # not timed out
    await expect(page.locator(f"#cmd-{slow.command_id}")).to_contain_text("yes, timed out")
    await expect(page.locator(f"#cmd-{slow.command_id}")).to_contain_text("no change")
    await row.get_by_role("link", name="1 path").click()
    await expect(page.locator("main")).to_contain_text("out.txt")
    await expect(page.locator("tr.add").first).to_contain_text("+made")
    # Its page: what it was and how it ended, not only its output.
    await page.goto(f"{gateway.url}/ui/w/default/commands/{failed.command_id}")
    await expect(page.locator("#ended")).to_contain_text("Ended")
    await expect(page.locator("#stderr")).to_have_text("oops\n")
    line = "echo made > out.txt; echo oops >&2; exit 3"
    await expect(page.locator("#cmdline")).to_have_text(line)
    await expect(page.locator("#exit")).to_have_text("✗ 3")
    await expect(page.locator("#output")).not_to_contain_text("✓")  # never ✓ for a failure
    await expect(page.locator("#timed-out")).to_have_text("no")
    await expect(page.locator("#actor")).to_have_text("gateway")
    await expect(page.locator("#workdir")).to_have_text("/workspace/")
    await expect(page.locator("#duration")).to_contain_text(" ms")
    version = failed.changes.version
    committed = page.locator("#committed")
    await expect(committed).to_contain_text(f"version {version}: 1 path")
    await expect(committed).to_contain_text(f"it ran on version {version - 1}")
    await committed.get_by_role("link", name=f"version {version}: 1 path").click()
    await expect(page.locator("main")).to_contain_text("out.txt")
    await page.goto(f"{gateway.url}/ui/w/default/commands/{slow.command_id}")
    await expect(page.locator("#timed-out")).to_have_text("yes, timed out")
    await expect(page.locator("#exit")).to_contain_text("✗")
    await expect(page.locator("#committed")).to_contain_text("no change")


async def test_a_running_commands_output_streams_live(
    gateway: Gateway, executor: Executor, page: Any
) -> None:
    ws = gateway.quill.workspace("default/default")
    await ws.create(exist_ok=True)
    await page.goto(f"{gateway.url}/ui/w/default/commands")
    await expect(page.locator("#live-state")).to_have_text("on")
    script = "for i in $(seq 1 80); do echo line-$i; sleep 0.1; done"
    running = asyncio.create_task(ws.exec(script))
    try:
        link = page.locator("#running a").first
        await expect(link).to_contain_text("command")
        await link.click()
        await expect(page.locator("#live-state")).to_have_text("on")
        await expect(page.locator("#stdout")).to_contain_text("line-")  # while it runs
        assert not running.done() and await page.locator("#ended").count() == 0
        result = await running
        await expect(page.locator("#ended")).to_contain_text("Ended")
        await expect(page.locator("#exit")).to_have_text("✓ 0")  # what it was, once it ended
        await expect(page.locator("#cmdline")).to_have_text(script)
        await expect(page.locator("#stdout")).to_contain_text("line-1\nline-2\n")  # whole
        await expect(page.locator("#stdout")).to_contain_text("line-80")
        # The page of ended commands got its row without reloading.
        await page.go_back()
        await expect(page.locator(f"#cmd-{result.command_id}")).to_contain_text("✓ 0")
    finally:
        await asyncio.wait_for(running, 30)


async def test_another_tenant_sees_no_command_of_ours(
    start: StartGateway, executor: Executor
) -> None:
    gateway = await start({"token-acme-0001": "acme/one", "token-beta-0001": "beta/two"})
    secret = await gateway.quill.workspace("acme/one").exec("echo acme-secret-output")
    beta = {"Authorization": "Bearer token-beta-0001", "Accept": "text/html"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        listing = await http.get("/ui/w/two/commands", headers=beta)
        assert listing.is_success and "acme-secret" not in listing.text
        own = await http.get(f"/ui/w/two/commands/{secret.command_id}", headers=beta)
        assert own.is_success and "acme-secret" not in own.text
        # Its live output on our workspace: listening, and nothing of theirs.
        path = f"/ui/w/two/commands/{secret.command_id}/output"
        async with http.stream("GET", path, headers=beta) as live:
            lines = []
            async for line in live.aiter_lines():
                lines.append(line)
                if line == "data: on":
                    break
        assert "event: ready" in lines and "acme-secret" not in "".join(lines)
        theirs = await http.get(f"/ui/w/one/commands/{secret.command_id}", headers=beta)
        assert theirs.status_code == 404 and "acme-secret" not in theirs.text
        for bad in ("a.b", "*", ">", "x" * 200, "%2e%2e"):
            got = await http.get(f"/ui/w/two/commands/{bad}/output", headers=beta)
            assert got.status_code in (400, 404), bad
        acme = {"Authorization": "Bearer token-acme-0001"}
        mine = await http.get(f"/ui/w/one/commands/{secret.command_id}", headers=acme)
        assert "acme-secret-output" in mine.text
