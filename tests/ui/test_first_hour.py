"""What a team met in its first hour with the console (issue 30): the timeline marks changes as
git does and names a command's commit by its command line, ops read as words, times say their
zone, counts read right, live state reads right, and Approve and Deny do not look alike."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from playwright.async_api import expect

from services.executor.app import Executor
from services.gateway.server import Gateway
from tests.helpers import approvals_pending
from tests.ui.test_console import WS

UTC_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


async def test_the_timeline_marks_changes_as_git_does(
    gateway: Gateway, executor: Executor, page: Any
) -> None:
    ws = gateway.quill.workspace(WS)
    await ws.create(exist_ok=True)
    await ws.write("a.txt", "one\n")
    added = ws.last_version
    await ws.write("a.txt", "two\n")
    modified = ws.last_version
    await ws.mkdir("docs")
    made_dir = ws.last_version
    await ws.move("a.txt", "docs/b.txt")
    moved = ws.last_version
    await ws.delete("docs", recursive=True)
    deleted = ws.last_version
    ran = await ws.exec("echo hi > c.txt")
    await page.goto(f"{gateway.url}/ui/w/default/")
    await expect(page.locator(f"#v{added} .chg")).to_have_text(["A"])
    await expect(page.locator(f"#v{modified} .chg")).to_have_text(["M"])
    await expect(page.locator(f"#v{made_dir}")).to_contain_text("A docs/")  # a directory: A
    await expect(page.locator(f"#v{moved}")).to_contain_text("R docs/b.txt from a.txt")
    await expect(page.locator(f"#v{moved}")).to_contain_text("D a.txt")
    await expect(page.locator(f"#v{deleted} .chg").first).to_have_text("D")
    # The command's commit says its command, and leads to the command's page.
    commit = page.locator(f"#v{ran.changes.version}")
    await expect(commit).to_contain_text("$ echo hi > c.txt")
    await expect(commit).to_contain_text("A c.txt")
    await expect(commit).to_contain_text("apply changes")  # the op in words
    await commit.locator("a.cmdlabel").click()
    await expect(page.locator("#cmdline")).to_have_text("echo hi > c.txt")
    await expect(page.locator("#exit")).to_have_text("✓ 0")
    # Times say their zone.
    await page.goto(f"{gateway.url}/ui/w/default/")
    await expect(page.locator(f"#v{added} time")).to_have_text(UTC_TIME)


async def test_words_counts_and_live_state_read_right(gateway: Gateway, page: Any) -> None:
    ws = gateway.quill.workspace(WS)
    await ws.create(exist_ok=True)
    await ws.write("only.txt", "x\n")
    await page.goto(f"{gateway.url}/ui/w/default/tree")
    await expect(page.locator("main")).to_contain_text("1 entry.")
    await page.goto(f"{gateway.url}/ui/w/default/")
    await expect(page.locator("p.live")).to_have_text("Live updates: on")
    await page.goto(f"{gateway.url}/ui/w/default/audit")
    await expect(page.locator("#records")).to_contain_text("write a file")
    await expect(page.locator("#records td").first).to_have_text(UTC_TIME)


async def test_approve_and_deny_look_different_and_ops_read_as_words(
    gateway: Gateway, page: Any
) -> None:
    ws = gateway.quill.workspace(WS)
    await ws.create(exist_ok=True)
    await ws.set_trust("restricted")
    asked = asyncio.create_task(gateway.quill.as_actor("agent-7").workspace(WS).write("x", "x"))
    try:
        await approvals_pending(ws)
        await page.goto(f"{gateway.url}/ui/w/default/approvals")
        heading = page.locator("#approval-list h2")
        await expect(heading).to_contain_text("write a file")
        await expect(page.locator("#approval-list")).not_to_contain_text("cmd.write")
        approve = page.get_by_role("button", name="Approve")
        deny = page.get_by_role("button", name="Deny")
        await expect(approve).to_have_text("✓ Approve")
        await expect(deny).to_have_text("✗ Deny")
        look = "e => [getComputedStyle(e).backgroundColor, getComputedStyle(e).borderStyle]"
        assert await approve.evaluate(look) != await deny.evaluate(look)
    finally:
        asked.cancel()
