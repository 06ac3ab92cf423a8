"""Issue 30: the console shows a command's line (its page, and the timeline's label of its
commit). A command line is whatever an agent typed: markup in it must show as text, never run
in an operator's browser, who is logged in (a cookie) and can approve.

A real gateway, writer, reader and bwrap executor; the pages in headless Chromium (a dialog
opened by a script would be caught) and over HTTP (the markup escaped in the HTML)."""

from __future__ import annotations

from typing import Any

import httpx
from playwright.async_api import expect

from services.executor.app import Executor
from services.gateway.server import Gateway
from tests.gateway.conftest import gateway, nats_server  # noqa: F401 (fixtures)
from tests.ui.conftest import browser, executor, page  # noqa: F401 (fixtures)

HOSTILE = (
    "echo '</code></td><script>alert(\"cmd\")</script><img src=x onerror=alert(1)>' "
    '"<svg onload=alert(2)>" > out.txt'
)


async def test_markup_in_a_command_line_shows_as_text(
    gateway: Gateway,  # noqa: F811 (a fixture)
    executor: Executor,  # noqa: F811 (a fixture)
    page: Any,  # noqa: F811 (a fixture)
) -> None:
    ws = gateway.quill.workspace("default/default")
    await ws.create(exist_ok=True)
    ran = await ws.exec(HOSTILE)
    assert ran.exit_code == 0
    dialogs: list[str] = []

    async def caught(dialog: Any) -> None:
        dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", caught)
    await page.goto(f"{gateway.url}/ui/w/default/commands/{ran.command_id}")
    await expect(page.locator("#cmdline")).to_have_text(HOSTILE)  # shown, as text
    await page.goto(f"{gateway.url}/ui/w/default/")
    label = page.locator(f"#v{ran.changes.version} .cmdlabel")
    await expect(label).to_have_text(f"$ {HOSTILE}")
    await page.goto(f"{gateway.url}/ui/w/default/commands")
    await expect(page.locator(f"#cmd-{ran.command_id} .cmdline")).to_have_text(HOSTILE)
    assert await page.locator("script:not([src])").count() == 0
    assert await page.locator("img[src=x], svg").count() == 0
    assert dialogs == []
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        for path in (f"/ui/w/default/commands/{ran.command_id}", "/ui/w/default/"):
            body = (await http.get(path)).text
            assert "&lt;script&gt;alert(&#34;cmd&#34;)&lt;/script&gt;" in body, path
            assert "<script>alert" not in body and "<svg onload" not in body, path
