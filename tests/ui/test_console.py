"""What a person sees in the console: the timeline, an old version's file, a diff, a live event,
an approval decided from the page, and nothing of another tenant's."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from playwright.async_api import expect

from quill.client import Workspace
from services.gateway.server import Gateway
from tests.helpers import approvals_pending

WS = "default/default"


async def put(ws: Workspace, path: str, text: str) -> int:
    """Write ``path``; the version it made."""
    await ws.write(path, text)
    return ws.last_version


async def two_versions(gateway: Gateway) -> tuple[Workspace, int, int]:
    ws = gateway.quill.workspace(WS)
    await ws.create(exist_ok=True)
    first = await put(ws, "src/app.py", "def answer():\n    return 41\n")
    return ws, first, await put(ws, "src/app.py", "def answer():\n    return 42\n")


async def test_timeline_shows_events_newest_first_with_a_verified_chain(
    gateway: Gateway, page: Any
) -> None:
    ws, v1, v2 = await two_versions(gateway)
    await ws.write("notes.md", "hello\n")
    await page.goto(f"{gateway.url}/ui/w/default/")
    rows = page.locator("#events tr")
    await expect(rows.first).to_contain_text("notes.md")
    await expect(page.locator(f"#v{v2}")).to_contain_text("src/app.py")
    await expect(page.locator(f"#v{v2}")).to_contain_text("gateway")  # the actor
    await expect(page.locator("#chain")).to_contain_text("✓ verified")
    # A filter by path keeps the file's events only.
    await page.get_by_label("Path").fill("src")
    await page.get_by_role("button", name="Filter").click()
    await expect(page.locator("#events tr")).to_have_count(2)


async def test_an_old_version_of_a_file_by_the_version_picker(gateway: Gateway, page: Any) -> None:
    ws, v1, v2 = await two_versions(gateway)
    await page.goto(f"{gateway.url}/ui/w/default/file?path=src/app.py")
    await expect(page.locator("#content")).to_contain_text("return 42")
    number = page.get_by_label("Version number")
    await number.fill(str(v1))
    await number.press("Enter")  # the keyboard alone
    await expect(page.locator("h1")).to_contain_text(f"as of version {v1}")
    await expect(page.locator("#content")).to_contain_text("return 41")
    # The tree as of the first version, from its link in the timeline.
    await page.goto(f"{gateway.url}/ui/w/default/")
    await page.locator(f"#v{v1} th a").click()
    await expect(page.locator("h1")).to_contain_text(f"files as of version {v1}")
    await expect(page.get_by_role("link", name="src/")).to_be_visible()


async def test_a_diff_unified_and_side_by_side(gateway: Gateway, page: Any) -> None:
    ws, v1, v2 = await two_versions(gateway)
    await page.goto(f"{gateway.url}/ui/w/default/diff?from={v1}&to={v2}")
    section = page.locator("section.file")
    await expect(section).to_contain_text("src/app.py")
    await expect(section.locator("tr.del")).to_contain_text("-    return 41")
    await expect(section.locator("tr.add")).to_contain_text("+    return 42")
    await page.get_by_label("Side by side").check()
    await page.get_by_role("button", name="Compare").click()
    row = page.locator("table.split tr.change")
    await expect(row.locator("td.old")).to_contain_text("return 41")
    await expect(row.locator("td.new")).to_contain_text("return 42")
    await expect(row.locator("td.new span").first).to_be_visible()  # highlighted tokens


async def test_a_new_event_arrives_without_reload(gateway: Gateway, page: Any) -> None:
    ws, _, _ = await two_versions(gateway)
    await page.goto(f"{gateway.url}/ui/w/default/")
    await expect(page.locator("#live-state")).to_have_text("on")
    written = await put(ws, "live.txt", "new\n")
    await expect(page.locator(f"#v{written}")).to_contain_text("live.txt")
    await expect(page.locator("#events tr").first).to_have_id(f"v{written}")


async def test_approve_from_the_page_and_the_waiting_write_completes(
    gateway: Gateway, page: Any
) -> None:
    ws = gateway.quill.workspace(WS)
    await ws.create(exist_ok=True)
    await ws.write("plan.md", "step one\nthe old plan\n")
    await ws.set_trust("restricted")
    agent = gateway.quill.as_actor("agent-7")
    agent.wait_ms = 60_000
    waiting = asyncio.create_task(agent.workspace(WS).write("plan.md", "the plan\n"))
    try:
        await approvals_pending(ws)
        await page.goto(f"{gateway.url}/ui/w/default/approvals")
        await expect(page.locator("#approval-list")).to_contain_text("write plan.md")
        diff = page.locator("#approval-list table.preview")  # the change it would make
        await expect(diff.locator("tr.del")).to_have_text(["-step one", "-the old plan"])
        await expect(diff.locator("tr.add")).to_have_text(["+the plan"])
        await page.get_by_role("button", name="Approve").click()
        written = await asyncio.wait_for(waiting, 30)
    finally:
        waiting.cancel()
    assert written.path == "plan.md"
    await expect(page.locator("#decision")).to_contain_text("✓ approved by local via console")
    await expect(page.locator("#result")).to_contain_text(f"committed version {ws.last_version}")
    assert await ws.read_text("plan.md") == "the plan\n"
    decided = [e for e in (await ws.events()).events if e.type == "approval_decided"]
    assert decided[-1].actor == "local via console"


async def test_an_approval_appears_live(gateway: Gateway, page: Any) -> None:
    ws = gateway.quill.workspace(WS)
    await ws.create(exist_ok=True)
    await ws.set_trust("restricted")
    await page.goto(f"{gateway.url}/ui/w/default/approvals")
    await expect(page.locator(".live span")).to_have_text("on")
    await expect(page.locator("#approval-list")).to_contain_text("No request is waiting")
    agent = gateway.quill.as_actor("agent-7").workspace(WS)
    asked = asyncio.create_task(agent.write("x.md", "x\n"))
    try:
        await expect(page.locator("#approval-list")).to_contain_text("write x.md")
    finally:
        asked.cancel()


async def test_a_form_without_its_csrf_token_is_refused(gateway: Gateway) -> None:
    ws = gateway.quill.workspace(WS)
    await ws.create(exist_ok=True)
    await ws.set_trust("restricted")
    agent = gateway.quill.as_actor("agent-7").workspace(WS)
    asked = asyncio.create_task(agent.write("x.md", "x\n"))
    try:
        url = f"{gateway.url}/ui/w/default/approvals/{(await approvals_pending(ws))[0]}"
        async with httpx.AsyncClient(timeout=10) as http:
            page = await http.get(f"{gateway.url}/ui/w/default/approvals")
            token = page.text.split('name="csrf" value="')[1].split('"')[0]
            none = await http.post(url, data={"decision": "approve"})
            wrong = await http.post(url, data={"decision": "approve", "csrf": "0" * 64})
            foreign = await http.post(
                url,
                data={"decision": "approve", "csrf": token},
                headers={"Origin": "http://evil.example"},
            )
            assert (none.status_code, wrong.status_code, foreign.status_code) == (403, 403, 403)
            assert "CSRF" in none.text
            assert len((await ws.approvals()).pending) == 1  # nothing was decided
            ok = await http.post(url, data={"decision": "deny", "csrf": token})
            assert ok.status_code == 303
        assert (await ws.approvals()).pending == []
    finally:
        asked.cancel()
