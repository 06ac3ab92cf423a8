"""The workspaces page as a person sees it: every workspace of a tenant with its state, a prefix
filter, sorts, pages, live rows; any tenant on loopback, a token's tenant only with tokens."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.async_api import expect

from contracts.requests import Trust
from services.gateway.access import Principal, Tokens
from services.gateway.console import workspaces
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway
from tests.ui.test_access import log_in


async def make(gateway: Gateway, name: str, files: int = 1, trust: Trust = "full") -> None:
    ws = gateway.quill.workspace(name)
    await ws.create(exist_ok=True, trust=trust)
    for i in range(files):
        await ws.write(f"f{i}.txt", "x" * (i + 1))


async def test_every_workspace_with_its_state_filtered_sorted_and_paged(
    gateway: Gateway, page: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workspaces, "PAGE", 2)
    for name, files in (("alpha", 1), ("alps", 3), ("beta", 2)):
        await make(gateway, f"default/{name}", files)
    await gateway.quill.workspace("default/beta").archive("done")
    await page.goto(f"{gateway.url}/ui/?prefix=al")
    table = page.locator("#workspaces")
    await expect(table.locator("tr")).to_have_count(2)
    alps = page.locator("#ws-alps")
    await expect(alps).to_contain_text("write a file by gateway")  # last change and who
    await expect(alps.locator("td").nth(1)).to_have_text("3")  # files
    await expect(alps).to_contain_text("active")
    await expect(alps).to_contain_text("free")  # no lock
    # Sorted by files, most first, two a page: alps, beta, then alpha on the next page.
    await page.get_by_label("Name starts with").fill("")
    await page.get_by_label("Sort by").select_option("files")
    await page.get_by_role("button", name="Show").click()
    await expect(table.locator("tr th")).to_have_text(["alps", "beta"])
    await expect(page.locator("#ws-beta")).to_contain_text("archived")
    await page.get_by_role("link", name="Next page").click()
    await expect(table.locator("tr th").first).to_have_text("alpha")
    # Keyset pages by name too.
    await page.goto(f"{gateway.url}/ui/")
    await expect(table.locator("tr th")).to_have_text(["alpha", "alps"])
    await page.get_by_role("link", name="Next page").click()
    await expect(table.locator("tr th")).to_have_text(["beta", "default"])


async def test_any_tenant_on_loopback_and_live_rows(gateway: Gateway, page: Any) -> None:
    await make(gateway, "acme/plans", 0, trust="restricted")
    await make(gateway, "default/notes")
    # Two tenants have workspaces: /ui/ asks which, listing them without tokens.
    await page.goto(f"{gateway.url}/ui/")
    await expect(page.locator("h1")).to_have_text("Tenants")
    await expect(page.locator("#tenant-acme")).to_contain_text("1 workspace")
    await expect(page.locator("#tenant-default")).to_contain_text("1 workspace")  # notes
    await page.get_by_role("link", name="acme", exact=True).click()
    await expect(page.locator("h1")).to_have_text("Workspaces of tenant acme")
    await expect(page.locator("#tenant")).to_have_text("tenant acme")  # the header says whose
    await page.get_by_label("Tenant").fill("default")  # and any other, by name
    await page.get_by_label("Tenant").press("Enter")
    await expect(page.locator("#tenant")).to_have_text("tenant default")
    await page.get_by_label("Tenant").fill("acme")
    await page.get_by_label("Tenant").press("Enter")
    await expect(page.locator("h1")).to_have_text("Workspaces of tenant acme")
    plans = page.locator("#ws-plans")
    await expect(plans).to_contain_text("restricted")
    await expect(plans).to_contain_text("0")  # no approvals waiting
    await expect(page.locator("#live-state")).to_have_text("on")
    # A change, a new workspace and a lock appear without reloading.
    await gateway.quill.workspace("acme/fresh").create()
    await expect(page.locator("#ws-fresh")).to_contain_text("create the workspace")
    await page.get_by_role("link", name="plans", exact=True).click()
    await expect(page).to_have_url(f"{gateway.url}/ui/w/acme:plans/")
    await expect(page.locator("#events")).to_contain_text("create")
    await expect(page.locator("#tenant")).to_have_text("tenant acme")  # browsing acme's


async def test_ui_opens_on_the_one_tenant_with_workspaces(gateway: Gateway, page: Any) -> None:
    """Without tokens, when one tenant has workspaces (the gateway's own default/default, as
    made, empty, does not count), /ui/ opens on it rather than on the empty default."""
    await make(gateway, "acme/plans")
    await page.goto(f"{gateway.url}/ui/")
    await expect(page.locator("h1")).to_have_text("Workspaces of tenant acme")
    await expect(page.locator("#tenant")).to_have_text("tenant acme")
    await expect(page.locator("#ws-plans")).to_contain_text("write a file by gateway")
    await gateway.quill.workspace("default/default").write("notes.md", "now it has one\n")
    await page.goto(f"{gateway.url}/ui/")
    await expect(page.locator("h1")).to_have_text("Tenants")


async def test_a_token_lists_its_tenant_only(start: StartGateway, browser: Any) -> None:
    tokens = Tokens(
        {
            "token-acme-0001": Principal("acme", "one", pinned=False, actor="ann"),
            "token-acme-pin1": Principal("acme", "two", actor="pat"),
            "token-beta-0001": Principal("beta", "own", pinned=False, actor="bob"),
        }
    )
    gateway = await start(tokens)
    await make(gateway, "beta/secret")
    await make(gateway, "acme/two")
    context = await browser.new_context()
    try:
        page = await context.new_page()
        await log_in(page, gateway.url, "token-acme-0001")
        await expect(page.locator("#workspaces tr th")).to_have_text(["one", "two"])
        await page.goto(f"{gateway.url}/ui/?tenant=beta")  # ignored: acme's own
        await expect(page.locator("#workspaces tr th")).to_have_text(["one", "two"])
        await expect(page.locator("main")).not_to_contain_text("secret")
        await page.goto(f"{gateway.url}/ui/w/beta:secret/")
        await expect(page.locator("main")).to_contain_text("INVALID_ARGUMENT")
    finally:
        await context.close()
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        pinned = {"Authorization": "Bearer token-acme-pin1"}
        got = await http.get("/ui/", headers=pinned)
        assert ">two</a>" in got.text and ">one</a>" not in got.text
        assert "<h1>Tenants</h1>" not in got.text and "beta" not in got.text  # no tenant list
        beta = {"Authorization": "Bearer token-beta-0001"}
        for query in ("?tenant=acme", "?prefix=%00%ff", "?sort=evil", "?sort=size&after=x|y"):
            got = await http.get(f"/ui/{query}", headers=beta)
            assert got.status_code == 200 and ">two</a>" not in got.text, query
        assert (await http.get("/ui/live/workspaces", headers={})).status_code == 401
