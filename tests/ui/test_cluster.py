"""The cluster page as a person sees it: every instance that answers its ping, its state, each
replica's lag, the command partitions and their holders; nothing of any tenant's."""

from __future__ import annotations

from typing import Any

import httpx
from playwright.async_api import expect

from contracts.subjects import Subjects
from infra import bus
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway


async def test_instances_lag_and_partitions(gateway: Gateway, nats_url: str, page: Any) -> None:
    ws = gateway.quill.workspace("default/default")
    await ws.write("a.txt", "a\n")
    # A writer that holds partitions 0 and 1 of 4 answers the same ping as the real ones.
    nc = await bus.connect(nats_url, "test-partitioned-writer")
    held = {"partitions": 4, "held": [0, 1], "writers": ["writer-test-1"]}
    subs = await bus.serve_ping(
        nc, Subjects(), "writer", "writer-test-1", lambda: {"partitions": held}
    )
    try:
        await page.goto(f"{gateway.url}/ui/")
        await page.get_by_role("link", name="Cluster").click()
        instances = page.locator("#instances")
        await expect(instances).to_contain_text("gateway")
        await expect(instances).to_contain_text("reader")
        reader = instances.locator("tr", has_text="reader").first
        await expect(reader).to_contain_text("serving")
        await expect(reader).to_contain_text("✓ 0 events behind")  # it applied a.txt's write
        partitions = page.locator("#partitions")
        await expect(partitions.locator("tr").nth(0)).to_contain_text("writer-test-1")
        await expect(partitions.locator("tr").nth(1)).to_contain_text("writer-test-1")
        await expect(partitions.locator("tr").nth(2)).to_contain_text("✗ no writer")
        await expect(partitions.locator("tr")).to_have_count(4)
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await nc.close()


async def test_a_token_sees_the_cluster_and_no_tenants_data(start: StartGateway) -> None:
    gateway = await start({"token-acme-0001": "acme/one", "token-beta-0001": "beta/two"})
    await gateway.quill.workspace("acme/one").write("acme-secret.txt", "x")
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        anonymous = await http.get("/ui/cluster", headers={"Accept": "text/html"})
        assert anonymous.status_code == 303  # log in first
        beta = await http.get("/ui/cluster", headers={"Authorization": "Bearer token-beta-0001"})
        assert beta.is_success and "reader" in beta.text
        assert "acme" not in beta.text and "secret" not in beta.text
