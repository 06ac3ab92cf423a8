"""A workspace's forks in a browser (issue 33): the Forks tab lists the forks made of a
workspace (forked at, ahead, behind, a link to each), the Fork form forks it through the op
every door uses, and the fork's own page says what it was forked from."""

from __future__ import annotations

from typing import Any

from playwright.async_api import expect

from services.gateway.server import Gateway


async def test_the_forks_tab_lists_forks_and_the_form_forks(gateway: Gateway, page: Any) -> None:
    sdk = gateway.quill
    book = sdk.workspace("default/book")
    await book.create(exist_ok=True)
    await book.write("a.md", "a\n")  # version 2
    await sdk.fork("default/book", "early", version=1)
    await sdk.workspace("default/early").write("e.md", "e\n")
    await sdk.workspace("default/early").info()  # the replica has it: ahead 1
    await page.goto(f"{gateway.url}/ui/w/book/")
    await page.get_by_role("link", name="Forks", exact=True).click()
    row = page.locator("#fork-early")
    await expect(row.locator("td")).to_have_text(
        ["version 1", "1", "1", "its changes", "Preview merge"]
    )
    await expect(page.locator("#lineage")).to_contain_text("Not a fork")
    await page.get_by_label("New workspace").fill("try-a")
    await page.get_by_role("button", name="Fork").click()
    await expect(page.locator("#forked")).to_have_text(
        "Forked default/book at version 2 as default/try-a"
    )
    await expect(page.locator("h1")).to_have_text("try-a: forks")
    await expect(page.locator("#lineage li")).to_have_text(
        "book at version 2 (versions up to there are its own history here)"
    )
    await page.locator("#lineage").get_by_role("link", name="book").click()
    await page.get_by_role("link", name="Forks", exact=True).click()
    await expect(page.locator("#forks tbody tr th")).to_have_text(["early", "try-a"])
    await page.locator("#fork-early").get_by_role("link", name="its changes").click()
    await expect(page.locator("main")).to_contain_text("e.md")
