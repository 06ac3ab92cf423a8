"""A fork's merge back in a browser (issue 33): the Forks tab's "Preview merge" shows the dry
run (its conflicts with their three-way hunks), the Merge form merges with the strategy
chosen, and a merge into a restricted workspace waits for approval, linked from the page."""

from __future__ import annotations

from typing import Any

from playwright.async_api import expect

from services.gateway.server import Gateway

TEXT = "".join(f"line {i}\n" for i in range(1, 11))


async def test_preview_merge_then_merge_through_approvals(gateway: Gateway, page: Any) -> None:
    sdk = gateway.quill
    book = sdk.workspace("default/book")
    await book.create(exist_ok=True)
    await book.write("t.txt", TEXT)
    await sdk.fork("default/book", "try")
    fork = sdk.workspace("default/try")
    await fork.write("t.txt", TEXT.replace("line 2\n", "line two (fork)\n"))
    await fork.write("new.md", "new\n")
    await book.write("t.txt", TEXT.replace("line 2\n", "line 2 (book)\n"))
    await fork.info()
    await page.goto(f"{gateway.url}/ui/w/book/forks")
    await page.locator("#fork-try").get_by_role("link", name="Preview merge").click()
    await expect(page.locator("h1")).to_have_text("book: merge try")
    await expect(page.locator("#preview")).to_contain_text("It would be refused")
    conflict = page.locator("#conflict-1")
    await expect(conflict.locator("h3")).to_have_text("t.txt: both sides changed the same lines")
    await expect(conflict.locator("pre.ours")).to_have_text("line 2 (book)\n")
    await expect(conflict.locator("pre.theirs")).to_have_text("line two (fork)\n")
    form = page.locator("#merge-form")
    await form.get_by_label("On conflict").select_option("fail")
    await form.get_by_role("button", name="Merge").click()
    await expect(page.locator("#refused")).to_contain_text("nothing committed")
    await page.locator("#merge-form").get_by_label("On conflict").select_option("theirs")
    await page.locator("#merge-form").get_by_role("button", name="Merge").click()
    await expect(page.locator("#merged")).to_contain_text("Merged default/try@")
    await expect(page.locator("#no-conflicts")).to_be_visible()
    assert (await book.read_text("new.md")) == "new\n"
    await book.set_trust("restricted")
    await fork.write("late.md", "late\n")
    await fork.info()
    await page.goto(f"{gateway.url}/ui/w/book/merge?from=try")
    await expect(page.locator("#changes")).to_contain_text("late.md")
    await page.locator("#merge-form").get_by_role("button", name="Merge").click()
    await expect(page.locator("#parked")).to_contain_text("waits for approval")
    await page.locator("#parked").get_by_role("link").click()
    await expect(page.locator("h1")).to_contain_text("book: approval")
    await expect(page.locator("main")).to_contain_text("waiting")
    await expect(page.locator("#preview")).to_contain_text("late.md")  # the merge's diff
