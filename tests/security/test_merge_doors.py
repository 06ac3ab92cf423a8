"""Merges through the gateway's doors as an attacker tries them (issue 33, items 6 and 7):
MCP's ``merge_workspace``, REST's ``POST /v1/workspaces/{name}/merge``, the console's merge
preview and Merge form, and ``quill merge``. The rule (``reach.merge_into``, every door's):
the caller must reach both workspaces, so a workspace-scoped (pinned) token never merges (not
into its own workspace, not into another), refused the same whether or not the names exist;
a tenant token merges within its tenant only (another tenant's workspace is not found by
name and cannot be named with its tenant, as the target or as the source); malformed bodies
are refused; nothing is committed by a refusal. A merge of many conflicts stays bounded in
every door's answer (the writer's first 100; the MCP text within ``core.merge_words.MODEL``);
the console escapes markup in file names and contents, and refuses a form without its CSRF
token or from another site. A real gateway, writer and reader, over HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import pytest_asyncio

from contracts import requests as rq
from core.merge_words import MODEL
from quill.client import Quill
from services.gateway.access import Principal, Tokens
from services.gateway.server import Gateway
from tests.gateway.conftest import (
    StartGateway,
    nats_server,  # noqa: F401 (a fixture: a server per test)
)
from tests.gateway.support import call, mcp_client, refused, text
from tests.security.test_console_processes import csrf_of

TOKENS = Tokens(
    {
        "acme-admin-token": Principal("acme", "ops", pinned=False, actor="ann"),
        "acme-agent-token": Principal("acme", "agents"),
        "globex-admin-token": Principal("globex", "ops", pinned=False),
    }
)
ADMIN, AGENT, GLOBEX = (
    {"Authorization": f"Bearer {t}"}
    for t in ("acme-admin-token", "acme-agent-token", "globex-admin-token")
)
MANY = 150
"""Conflicting files: more than the writer lists (100)."""
MARKUP = '<img src=x onerror="alert(1)">'


async def seed(sdk: Quill, tenant: str = "acme") -> None:
    """``book`` forked as ``try``; both sides change ``t.txt``'s first line (a conflict)."""
    for name in (f"{tenant}/agents", f"{tenant}/ops", "globex/ops"):
        await sdk.workspace(name).create(exist_ok=True)
    book = sdk.workspace(f"{tenant}/book")
    await book.create(exist_ok=True)
    await book.write("t.txt", "base\n")
    await sdk.fork(f"{tenant}/book", "try")
    await sdk.workspace(f"{tenant}/try").write("t.txt", "theirs\n")
    await book.write("t.txt", "ours\n")
    await sdk.workspace(f"{tenant}/try").info()


@pytest_asyncio.fixture
async def gateway(start: StartGateway) -> Gateway:
    """A gateway with ``TOKENS``, its workspaces made (``seed``)."""
    running = await start(TOKENS)
    await seed(running.quill)
    return running


async def versions(sdk: Quill) -> dict[str, int]:
    names = ("acme/book", "acme/try", "acme/agents", "acme/ops", "globex/ops")
    return {n: (await sdk.workspace(n).info()).version for n in names}


async def mcp_code(mcp: Any, **arguments: Any) -> tuple[str, str]:
    """``merge_workspace``'s refusal: its error code and its text."""
    return await refused(mcp, "merge_workspace", **arguments)


async def test_mcp_merges_only_what_the_token_reaches_within_its_tenant(gateway: Gateway) -> None:
    sdk = gateway.quill
    before = await versions(sdk)
    async with mcp_client(gateway.url, token="globex-admin-token") as mcp:
        # acme's fork is looked up in globex, where there is none; acme's names are refused
        code, _ = await mcp_code(mcp, strategy="theirs", **{"from": "try"})
        assert code == "WORKSPACE_NOT_FOUND"
        for target, source in (("acme/book", "try"), (None, "acme/try"), ("ops", "acme/try")):
            where = {"workspace": target} if target else {}
            code, _ = await mcp_code(mcp, strategy="theirs", **where, **{"from": source})
            assert code == "INVALID_ARGUMENT", (target, source)
    async with mcp_client(gateway.url, token="acme-agent-token") as mcp:
        own = await mcp_code(mcp, strategy="theirs", **{"from": "try"})
        assert own[0] == "ACCESS_DENIED" and "may not merge" in own[1], own
        assert await mcp_code(mcp, strategy="theirs", **{"from": "ghost"}) == own  # no leak
        code, _ = await mcp_code(mcp, workspace="book", strategy="theirs", **{"from": "try"})
        assert code == "WORKSPACE_NOT_FOUND"  # another workspace: not reached at all
    async with mcp_client(gateway.url, token="acme-admin-token") as mcp:
        for bad in ({"from": "../try"}, {"from": ""}, {"from": "try", "strategy": "all"}):
            code, _ = await mcp_code(mcp, workspace="book", **bad)
            assert code == "INVALID_ARGUMENT", bad
        code, _ = await mcp_code(mcp, workspace="book", **{"from": "book"})  # itself
        assert code == "INVALID_ARGUMENT"
    assert await versions(sdk) == before  # nothing committed anywhere


async def test_mcp_without_tokens_keeps_a_merge_in_its_tenant(start: StartGateway) -> None:
    gateway = await start()  # the loopback caller names any tenant's workspace
    sdk = gateway.quill
    await seed(sdk)
    await sdk.fork("globex/ops", "stolen")
    before = (await sdk.workspace("acme/book").info()).version
    async with mcp_client(gateway.url) as mcp:
        code, said = await mcp_code(
            mcp, workspace="acme/book", strategy="theirs", **{"from": "globex/stolen"}
        )
        assert code == "INVALID_ARGUMENT" and "stays within its tenant" in said
    assert (await sdk.workspace("acme/book").info()).version == before


async def test_rest_merges_only_what_the_token_reaches_and_refuses_bad_bodies(
    gateway: Gateway,
) -> None:
    sdk = gateway.quill
    before = await versions(sdk)
    theirs = {"from": "try", "strategy": "theirs"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:

        async def merge(name: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
            reply = await http.post(f"/v1/workspaces/{name}/merge", json=body, headers=headers)
            return reply.status_code, reply.json()

        assert await merge("book", theirs, GLOBEX) == (404, {"error": "not_found"})
        assert (await merge("ops", {"from": "acme/try"}, GLOBEX))[0] == 400
        own = await merge("agents", theirs, AGENT)
        assert own[0] == 403 and own[1]["error"] == "access_denied"
        assert await merge("book", theirs, AGENT) == own  # into another: the same refusal
        assert await merge("ghost", {"from": "ghost"}, AGENT) == own  # nothing leaks
        for body in (
            [],
            {},
            "try",
            {"from": 1},
            {"from": "try", "strategy": "all"},
            {"from": "try", "strategy": None},
            {"from": "try", "dryRun": "yes"},
            {"from": "try", "dryRun": 1},
            {"from": "try", "dry_run": True},
            {"from": "try", "into": "ops"},
            {"from": "../try"},
            {"from": "x" * 65},
            {"from": "book"},
        ):
            assert (await merge("book", body, ADMIN))[0] == 400, body
        assert (await merge("Bad..name", theirs, ADMIN))[0] == 400
        assert (await merge("book", {"from": "ghost"}, ADMIN))[0] == 404
        bad_json = await http.post("/v1/workspaces/book/merge", content=b"{not json", headers=ADMIN)
        assert bad_json.status_code == 400
        assert (await http.post("/v1/workspaces/book/merge", json=theirs)).status_code == 401
    assert await versions(sdk) == before


async def test_a_huge_conflict_list_stays_bounded_in_every_door(gateway: Gateway) -> None:
    sdk = gateway.quill
    book, fork = sdk.workspace("acme/book"), sdk.workspace("acme/try")
    side = "".join(f"{n} {'x' * 60}\n" for n in range(40))  # ~2.5 KB a side
    paths = [f"c/{i:03}.txt" for i in range(MANY)]
    await book.apply([rq.PutChange(path=p, content="base\n") for p in paths])
    await sdk.fork("acme/book", "many")
    many = sdk.workspace("acme/many")
    await many.apply([rq.PutChange(path=p, content="theirs " + side) for p in paths])
    await book.apply([rq.PutChange(path=p, content="ours " + side) for p in paths])
    await many.info()
    before = (await book.info()).version
    async with mcp_client(gateway.url, token="acme-admin-token") as mcp:
        for dry_run in (True, False):
            result = await call(mcp, "merge_workspace", workspace="book", dry_run=dry_run,
                                **{"from": "many"})  # fmt: skip
            said = text(result)
            assert len(said) < MODEL.total + 2_000, len(said)
            assert f"{MANY} conflicts" in said or f"{MANY} in all" in said
            data: Any = result.structured_content
            listed = data["conflicts"] if dry_run else data["details"]["conflicts"]
            assert len(listed) == 100
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30, headers=ADMIN) as http:
        refused = await http.post("/v1/workspaces/book/merge", json={"from": "many"})
        assert refused.status_code == 409 and len(refused.content) < 600_000
        details = refused.json()["details"]
        assert len(details["conflicts"]) == 100 and details["conflictsTotal"] == MANY
        page = await http.get("/ui/w/book/merge?from=many")
        assert page.status_code == 200 and len(page.content) < 1_200_000
        assert page.text.count('class="conflict"') == 100
        assert f"{MANY} conflicts; the first 100 shown" in page.text
    assert (await book.info()).version == before
    assert (await fork.info()).version >= 3


async def test_the_console_escapes_markup_and_needs_csrf_and_reach(gateway: Gateway) -> None:
    sdk = gateway.quill
    named = f"{MARKUP}.txt"
    await sdk.workspace("acme/book").write(named, f"base\n{MARKUP}\n")
    await sdk.fork("acme/book", "xss")
    await sdk.workspace("acme/xss").write(named, f"theirs {MARKUP}\n{MARKUP}\n")
    await sdk.workspace("acme/book").write(named, f"ours {MARKUP}\n{MARKUP}\n")
    await sdk.workspace("acme/xss").info()
    before = await versions(sdk)
    form = "/ui/w/book/merge"
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        page = await http.get(f"{form}?from=xss", headers=ADMIN)
        assert page.status_code == 200 and 'id="conflict-1"' in page.text
        assert MARKUP not in page.text and "&lt;img src=x onerror=" in page.text
        bad = await http.get(f"{form}?from=<b>x</b>", headers=ADMIN)
        assert bad.status_code == 400 and "<b>x</b>" not in bad.text
        forged = await http.get(f"{form}?from=try&parked=%22%3E%3Cscript%3E", headers=ADMIN)
        assert "<script>" not in forged.text and 'id="parked"' not in forged.text
        token = csrf_of(page.text)
        theirs = {"from": "try", "strategy": "theirs"}
        assert (await http.post(form, data=theirs, headers=ADMIN)).status_code == 403
        wrong = await http.post(form, data={**theirs, "csrf": "0" * 64}, headers=ADMIN)
        assert wrong.status_code == 403
        other_site = await http.post(
            form,
            data={**theirs, "csrf": token},
            headers={**ADMIN, "Origin": "https://evil.example"},
        )
        assert other_site.status_code == 403
        # another principal's token does not carry this one's CSRF token
        assert (
            await http.post(form, data={**theirs, "csrf": token}, headers=AGENT)
        ).status_code == 403
        # a pinned token: no preview, and its own valid form is refused
        mine = await http.get("/ui/w/agents/forks", headers=AGENT)
        preview = await http.get("/ui/w/agents/merge?from=try", headers=AGENT)
        assert preview.status_code == 403 and "may not merge" in preview.text
        pinned = await http.post(
            "/ui/w/agents/merge", data={**theirs, "csrf": csrf_of(mine.text)}, headers=AGENT
        )
        assert pinned.status_code == 403 and "may not merge" in pinned.text
        into_other = await http.post(
            form, data={**theirs, "csrf": csrf_of(mine.text)}, headers=AGENT
        )
        assert into_other.status_code in (403, 404)
        bad_strategy = await http.post(
            form, data={"from": "try", "strategy": "all", "csrf": token}, headers=ADMIN
        )
        assert bad_strategy.status_code == 400
    assert await versions(sdk) == before
