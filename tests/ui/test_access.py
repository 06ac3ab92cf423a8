"""Who sees what: the login page, two tenants' tokens, hostile requests; and the pages usable
by keyboard, without colour, at 1280 px and at a phone's width."""

from __future__ import annotations

from typing import Any

import httpx
from playwright.async_api import expect

from tests.gateway.conftest import StartGateway

TOKENS = {"token-acme-0001": "acme/one", "token-beta-0001": "beta/two"}


async def log_in(page: Any, url: str, token: str) -> None:
    await page.goto(f"{url}/ui/")
    await expect(page).to_have_url(f"{url}/ui/login")
    await page.get_by_label("Token").fill(token)
    await page.get_by_label("Token").press("Enter")


async def test_a_tenant_sees_its_own_workspace_and_never_another_tenants(
    start: StartGateway, browser: Any
) -> None:
    gateway = await start(TOKENS)
    acme = gateway.quill.workspace("acme/one")
    await acme.write("secret-plan.md", "acme only\n")
    context = await browser.new_context()
    try:
        page = await context.new_page()
        await log_in(page, gateway.url, "token-beta-0001")
        await expect(page.locator("main table")).to_contain_text("two")
        await expect(page.locator("main")).not_to_contain_text("one")
        for path in ("/ui/w/one/", "/ui/w/one/file?path=secret-plan.md", "/ui/w/one/approvals"):
            await page.goto(f"{gateway.url}{path}")
            await expect(page.locator("main")).to_contain_text("WORKSPACE_NOT_FOUND")
            await expect(page.locator("main")).not_to_contain_text("acme only")
        cookies = await context.cookies()
        [token] = [c for c in cookies if c["name"] == "quill_token"]
        assert token["httpOnly"] and token["sameSite"] == "Strict" and token["path"] == "/ui"
        # The other tenant's token sees its own.
        await page.get_by_role("button", name="Log out").click()
        await log_in(page, gateway.url, "token-acme-0001")
        await page.get_by_role("link", name="one", exact=True).first.click()
        await expect(page.locator("#events")).to_contain_text("secret-plan.md")
    finally:
        await context.close()


async def test_a_wrong_token_is_refused_and_pages_need_a_login(start: StartGateway) -> None:
    gateway = await start(TOKENS)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        page = await http.get("/ui/w/one/", headers={"Accept": "text/html"})
        assert (page.status_code, page.headers["location"]) == (303, "/ui/login")
        assert (await http.get("/ui/w/one/live")).status_code == 401  # not a page: REST's 401
        form = await http.get("/ui/login")
        nonce = form.text.split('name="csrf" value="')[1].split('"')[0]
        wrong = await http.post("/ui/login", data={"csrf": nonce, "token": "token-nobody-01"})
        assert wrong.status_code == 401 and "Unknown token" in wrong.text
        no_csrf = await http.post("/ui/login", data={"token": "token-acme-0001"})
        assert no_csrf.status_code == 403
        http.cookies.clear()
        for cookie in ("bad token", "token-acme-0001%0d%0aX:y", "%ff%fe%00", "x" * 5000, '"q"'):
            got = await http.get("/ui/", headers={"Cookie": f"quill_token={cookie}"})
            assert got.status_code == 401, cookie
        # A bearer header works as over REST.
        auth = {"Authorization": "Bearer token-acme-0001"}
        assert (await http.get("/ui/w/one/", headers=auth)).status_code == 200
        hostile = await http.get("/ui/w/one/file?path=../../etc/passwd", headers=auth)
        assert hostile.status_code == 403 and "root:" not in hostile.text
        assert (await http.get("/ui/w/one/?before=99999999999999999999", headers=auth)).is_success


async def test_keyboard_and_phone_width(start: StartGateway, browser: Any) -> None:
    gateway = await start()
    ws = gateway.quill.workspace("default/default")
    await ws.write("a/very/long/path/name/that/could/overflow/a/phone/screen/file.txt", "x\n")
    await ws.write("a/very/long/path/name/that/could/overflow/a/phone/screen/file.txt", "y\n")
    for width in (1280, 390):
        context = await browser.new_context(viewport={"width": width, "height": 800})
        try:
            page = await context.new_page()
            await page.goto(f"{gateway.url}/ui/w/default/")
            await page.keyboard.press("Tab")
            await expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
            await page.keyboard.press("Enter")
            for _ in range(40):  # Tab reaches the diff link of the newest event
                await page.keyboard.press("Tab")
                focused = await page.evaluate("document.activeElement.textContent")
                if focused == "diff":
                    break
            await page.keyboard.press("Enter")
            await expect(page.locator("h1")).to_contain_text("Diff from version")
            # Without colour: each changed line says what it is in text.
            await expect(page.locator("tr.del").first).to_contain_text("-x")
            await expect(page.locator("tr.add").first).to_contain_text("+y")
            wide = await page.evaluate("document.documentElement.scrollWidth")
            assert wide <= width, f"the page is {wide} px wide at {width} px"
        finally:
            await context.close()
