"""Forks through the gateway's doors as an attacker tries them (issue 33, items 6 and 7): MCP's
``fork_workspace``, REST's ``POST /v1/workspaces/{name}/fork`` and ``GET .../forks``, and the
console's Fork form. The rule (``reach.fork``): the caller must reach both the source and the
fork, so a workspace-scoped (pinned) token neither forks (not even its own workspace: it could
not reach the fork) nor lists forks (their names are workspaces it does not see), refused the
same whether or not the source exists; a tenant token forks within its tenant only (another
tenant's workspace is not found by name and cannot be named with its tenant, as the source or
as the fork); names that are not workspace ids, a name taken or the source's own, a version the
source does not have are refused and nothing is created; the console's form is refused
without its CSRF token or from another site. A real gateway, writer and reader, over HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import pytest_asyncio

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from services.gateway.access import Principal, Tokens
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway
from tests.gateway.support import error, mcp_client, refused
from tests.security.test_console_processes import csrf_of

TOKENS = Tokens(
    {
        "acme-admin-token": Principal("acme", "ops", pinned=False, actor="ann"),
        "acme-agent-token": Principal("acme", "agents"),
        "globex-admin-token": Principal("globex", "ops", pinned=False),
    }
)
BAD_NAMES = ("Bad Name", "../x", "x/../../y", "a" * 65, "x.y", "-x", "acme/stolen", "")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def seed(sdk: Quill) -> None:
    for name in ("acme/agents", "acme/ops", "acme/book", "globex/ops"):
        await sdk.workspace(name).create(exist_ok=True)
    await sdk.workspace("acme/book").write("secret.md", "acme's own\n")
    await sdk.workspace("acme/book").info()


@pytest_asyncio.fixture
async def gateway(start: StartGateway) -> Gateway:
    """A gateway with ``TOKENS``, its workspaces made (``seed``)."""
    started = await start(TOKENS)
    await seed(started.quill)
    return started


async def absent(sdk: Quill, *names: str) -> None:
    """None of ``names`` (``tenant/workspace``) exists: a refused fork made nothing."""
    for name in names:
        try:
            await sdk.workspace(name).info()
        except QuillError as exc:
            assert exc.code == ErrorCode.WORKSPACE_NOT_FOUND, name
        else:
            raise AssertionError(f"{name} exists")


async def codes(mcp: Any, **arguments: Any) -> tuple[str, str]:
    """``fork_workspace``'s refusal: its error code and its text."""
    return await refused(mcp, "fork_workspace", **arguments)


async def test_mcp_forks_only_what_the_token_reaches_within_its_tenant(gateway: Gateway) -> None:
    sdk = gateway.quill
    async with mcp_client(gateway.url, token="globex-admin-token") as mcp:
        # acme's book is looked up in globex, where there is none
        code, said = await codes(mcp, workspace="book", name="stolen")
        assert (code, said) == ("WORKSPACE_NOT_FOUND", "Error: Workspace not found: book")
        for source, name in (("acme/book", "stolen"), ("ops", "acme/stolen")):
            code, _ = await codes(mcp, workspace=source, name=name)
            assert code == "INVALID_ARGUMENT", (source, name)
        code, _ = await codes(mcp, workspace="server:/acme/book", name="stolen")
        assert code in ("FILE_NOT_FOUND", "WORKSPACE_NOT_FOUND")  # not attached, not reached
    await absent(sdk, "globex/stolen", "acme/stolen")
    async with mcp_client(gateway.url, token="acme-agent-token") as mcp:
        own = await codes(mcp, name="mine")
        assert own[0] == "ACCESS_DENIED" and "may not fork" in own[1], own
        # the same answer whether or not the workspace named exists: nothing leaks
        assert await codes(mcp, workspace="book", name="mine") == own
        assert await codes(mcp, workspace="ghost", name="mine") == own
    await absent(sdk, "acme/mine")
    async with mcp_client(gateway.url, token="acme-admin-token") as mcp:
        for name in BAD_NAMES:
            code, _ = await codes(mcp, workspace="book", name=name)
            assert code == "INVALID_ARGUMENT", name
        for name in ("book", "ops", "agents"):  # the source's own name, or one taken
            code, said = await codes(mcp, workspace="book", name=name)
            assert code == "ALREADY_EXISTS", name
        for version in (0, 99, 2**60):
            code, _ = await codes(mcp, workspace="book", name="late", version=version)
            assert code == "INVALID_ARGUMENT", version
        said = await error(mcp, "fork_workspace", workspace="ghost", name="late")
        assert said == "Error: Workspace not found: ghost"
    await absent(sdk, "acme/late", "acme/ghost")
    assert (await sdk.workspace("acme/book").info()).version == 2  # untouched
    assert (await sdk.workspace("acme/agents").info()).version == 1


async def test_mcp_without_tokens_keeps_a_fork_in_its_tenant(start: StartGateway) -> None:
    gateway = await start()  # the loopback caller names any tenant's workspace
    sdk = gateway.quill
    await seed(sdk)
    async with mcp_client(gateway.url) as mcp:
        code, said = await codes(mcp, workspace="acme/book", name="globex/stolen")
        assert code == "INVALID_ARGUMENT" and "stays within its tenant" in said
    await absent(sdk, "globex/stolen")


async def test_rest_forks_only_what_the_token_reaches_within_its_tenant(gateway: Gateway) -> None:
    sdk = gateway.quill
    admin, agent, globex = (bearer(t) for t in ("acme-admin-token", "acme-agent-token",
                                                 "globex-admin-token"))  # fmt: skip
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:

        async def fork(name: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
            reply = await http.post(f"/v1/workspaces/{name}/fork", json=body, headers=headers)
            return reply.status_code, reply.json()

        stolen = await fork("book", {"name": "stolen"}, globex)
        assert stolen == (404, {"error": "not_found"})
        assert (await fork("ops", {"name": "acme/stolen"}, globex))[0] == 400
        listed = await http.get("/v1/workspaces/book/forks", headers=globex)
        assert listed.status_code == 404
        # a pinned token: refused alike for its own workspace, another, and none
        own = await fork("agents", {"name": "mine"}, agent)
        assert own[0] == 403 and own[1]["error"] == "access_denied"
        assert await fork("book", {"name": "mine"}, agent) == own
        assert await fork("ghost", {"name": "mine"}, agent) == own
        for name in ("agents", "book"):
            reply = await http.get(f"/v1/workspaces/{name}/forks", headers=agent)
            assert reply.status_code == 403, name
        for name in BAD_NAMES:
            assert (await fork("book", {"name": name}, admin))[0] == 400, name
        for body in (
            [],
            {},
            {"name": 1},
            {"name": "x", "version": "2"},
            {"name": "x", "version": True},
            {"name": "x", "version": 0},
            {"name": "x", "version": 2**53 + 1},
            {"name": "x", "version": 99},
            {"name": "x", "from": "ops"},
        ):
            assert (await fork("book", body, admin))[0] == 400, body
        for name in ("book", "ops"):
            taken = await fork("book", {"name": name}, admin)
            assert taken[0] == 409 and taken[1]["error"] == "path_conflict", name
        assert (await fork("Bad..name", {"name": "x"}, admin))[0] == 400
        assert (await fork("ghost", {"name": "x"}, admin))[0] == 404
        assert (
            await http.get("/v1/workspaces/book/forks?limit=1001", headers=admin)
        ).status_code == 400
        assert (await http.post("/v1/workspaces/book/fork", json={"name": "x"})).status_code == 401
    await absent(sdk, "globex/stolen", "acme/stolen", "acme/mine", "acme/x", "acme/ghost")
    assert (await sdk.workspace("acme/book").info()).version == 2


async def test_the_console_fork_form_needs_its_csrf_token_and_reach(gateway: Gateway) -> None:
    sdk = gateway.quill
    admin, agent = bearer("acme-admin-token"), bearer("acme-agent-token")
    form = "/ui/w/book/forks"
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        page = await http.get(form, headers=admin)
        assert page.status_code == 200 and 'id="fork-form"' in page.text
        token = csrf_of(page.text)
        refused = await http.post(form, data={"name": "x"}, headers=admin)
        assert refused.status_code == 403
        wrong = await http.post(form, data={"name": "x", "csrf": "0" * 64}, headers=admin)
        assert wrong.status_code == 403
        other_site = await http.post(
            form,
            data={"name": "x", "csrf": token},
            headers={**admin, "Origin": "https://evil.example"},
        )
        assert other_site.status_code == 403
        # another principal's token does not carry this one's CSRF token
        theirs = await http.post(form, data={"name": "x", "csrf": token}, headers=agent)
        assert theirs.status_code == 403
        # a pinned token's own page: no form, and its own valid form is refused
        mine = await http.get("/ui/w/agents/forks", headers=agent)
        assert mine.status_code == 200 and 'id="fork-form"' not in mine.text
        pinned = await http.post(
            "/ui/w/agents/forks",
            data={"name": "x", "csrf": csrf_of(mine.text)},
            headers=agent,
        )
        assert pinned.status_code == 403 and "may not fork" in pinned.text
        bad = await http.post(
            form, data={"name": "<b>x</b>", "version": "", "csrf": token}, headers=admin
        )
        assert bad.status_code == 400 and "<b>x</b>" not in bad.text
        big = await http.post(form, data={"name": "y", "version": "9" * 40, "csrf": token},
                              headers=admin)  # fmt: skip
        assert big.status_code == 400
    await absent(sdk, "acme/x", "acme/y")
