"""The pages added after the first version (workspaces, commands, cluster) by keyboard alone,
and without horizontal overflow at 1280 px and at a phone's 390 px."""

from __future__ import annotations

import re
from typing import Any

from playwright.async_api import expect

from services.gateway.server import Gateway

PAGES = ("/ui/", "/ui/cluster", "/ui/w/default/commands")


async def test_pages_fit_a_phone_and_a_desktop(gateway: Gateway, browser: Any) -> None:
    ws = gateway.quill.workspace("default/a-rather-long-workspace-name-for-a-phone-screen")
    await ws.create()
    await ws.write("x.txt", "x\n")
    for width in (1280, 390):
        context = await browser.new_context(viewport={"width": width, "height": 800})
        try:
            page = await context.new_page()
            for path in PAGES:
                await page.goto(f"{gateway.url}{path}")
                await expect(page.locator("h1")).to_be_visible()
                wide = await page.evaluate("document.documentElement.scrollWidth")
                assert wide <= width, f"{path} is {wide} px wide at {width} px"
        finally:
            await context.close()


async def test_the_workspaces_page_by_keyboard(gateway: Gateway, page: Any) -> None:
    for name in ("zeta", "alpha"):
        ws = gateway.quill.workspace(f"default/{name}")
        await ws.create()
        await ws.write("f.txt", "x" * 100 if name == "zeta" else "x")
    await page.goto(f"{gateway.url}/ui/")
    await page.keyboard.press("Tab")
    await expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    await page.keyboard.press("Enter")
    sort = page.get_by_label("Sort by")
    for _ in range(20):
        await page.keyboard.press("Tab")
        if await sort.evaluate("e => e === document.activeElement"):
            break
    await expect(sort).to_be_focused()
    await sort.select_option("size")  # a select takes arrow keys; Playwright picks the same
    await page.keyboard.press("Tab")
    await expect(page.get_by_role("button", name="Show")).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(re.compile(r"/ui/\?.*sort=size"))
    await expect(page.locator("#workspaces tr th").first).to_have_text("zeta")
