"""The tenant's workspaces at the gateway (``services/gateway/rest/workspaces.py``,
``mcp/workspaces.py``): REST ``/v1/workspaces`` (list, archive, unarchive, purge) and the MCP
tools ``list_workspaces`` and ``archive_workspace``, with who may do what: a tenant-scope token
in its own tenant only, a pinned token nothing but seeing its own workspace."""

from __future__ import annotations

import httpx
import pytest

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill
from services.gateway.access import Principal, Tokens
from tests.gateway.conftest import StartGateway
from tests.gateway.support import error, mcp_client, ok

TOKENS = Tokens(
    {
        "acme-admin-token": Principal("acme", "ops", pinned=False, actor="ann"),
        "acme-agent-token": Principal("acme", "agents"),
        "globex-admin-token": Principal("globex", "ops", pinned=False),
    }
)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def seed(sdk: Quill) -> None:
    for name in ("acme/agents", "acme/book", "acme/ops", "acme/zoo", "globex/book"):
        await sdk.workspace(name).create(exist_ok=True)
    await sdk.workspace("acme/book").write("ch1.md", "once\n")
    for name in ("acme/book", "globex/book"):  # read-your-writes: the replica has them all
        await sdk.workspace(name).info()


async def test_rest_lists_archives_and_purges_in_the_callers_tenant_only(
    start: StartGateway,
) -> None:
    gateway = await start(TOKENS)
    await seed(gateway.quill)
    admin, agent, globex = (bearer(t) for t in ("acme-admin-token", "acme-agent-token",
                                                 "globex-admin-token"))  # fmt: skip
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        page = (await http.get("/v1/workspaces?limit=2", headers=admin)).json()
        assert [w["name"] for w in page["workspaces"]] == ["agents", "book"]
        assert page["next"] == "book" and page["tenant"] == "acme"
        book = page["workspaces"][1]
        assert (book["version"], book["files"], book["size"], book["archived"]) == (2, 1, 5, False)
        assert book["updatedAt"].endswith("Z")
        rest = (await http.get(f"/v1/workspaces?after={page['next']}", headers=admin)).json()
        assert [w["name"] for w in rest["workspaces"]] == ["ops", "zoo"] and rest["next"] is None
        # a pinned token sees its own workspace, nothing else
        mine = (await http.get("/v1/workspaces", headers=agent)).json()
        assert [w["name"] for w in mine["workspaces"]] == ["agents"]
        theirs = (await http.get("/v1/workspaces", headers=globex)).json()
        assert [w["name"] for w in theirs["workspaces"]] == ["book", "ops"]
        assert (await http.get("/v1/workspaces?limit=0", headers=admin)).status_code == 400
        assert (await http.get("/v1/workspaces")).status_code == 401

        # archive: refused to a pinned token, another tenant reaches only its own "book"
        refused = await http.post("/v1/workspaces/book/archive", headers=agent)
        assert refused.status_code == 403 and refused.json()["error"] == "access_denied"
        done = await http.post("/v1/workspaces/book/archive", headers=globex,
                               json={"reason": "theirs"})  # fmt: skip
        assert done.json() == {"archived": True, "changed": True}
        assert not (await gateway.quill.workspaces("acme")).workspaces[1].archived
        done = await http.post("/v1/workspaces/book/archive", headers=admin, json={"reason": "x"})
        assert done.json() == {"archived": True, "changed": True}
        bad = await http.post("/v1/workspaces/book/archive", headers=admin, json={"why": 1})
        assert bad.status_code == 400
        with pytest.raises(QuillError) as archived:
            await gateway.quill.workspace("acme/book").write("ch2.md", "twice\n")
        assert archived.value.code == ErrorCode.WORKSPACE_ARCHIVED
        await gateway.quill.workspace("acme/book").info()  # the replica has the archive
        listed = (await http.get("/v1/workspaces?prefix=bo", headers=admin)).json()
        assert [(w["name"], w["archived"]) for w in listed["workspaces"]] == [("book", True)]
        back = await http.post("/v1/workspaces/book/unarchive", headers=admin)
        assert back.json() == {"archived": False, "changed": True}

        # purge: not by a pinned token, not unconfirmed, not the token's own workspace
        assert (await http.delete("/v1/workspaces/book?confirm=acme/book",
                                  headers=agent)).status_code == 403  # fmt: skip
        for confirm in ("", "book", "globex/book"):
            unconfirmed = await http.delete(f"/v1/workspaces/book?confirm={confirm}",
                                            headers=admin)  # fmt: skip
            assert unconfirmed.status_code == 400, confirm
        own = await http.delete("/v1/workspaces/ops?confirm=acme/ops", headers=admin)
        assert own.status_code == 403
        assert (await http.delete("/v1/workspaces/Bad..name?confirm=x",
                                  headers=admin)).status_code == 400  # fmt: skip
        gone = await http.delete("/v1/workspaces/book?confirm=acme/book", headers=admin)
        assert gone.json() == {"purged": "acme/book", "version": 4}
        missing = await http.delete("/v1/workspaces/book?confirm=acme/book", headers=admin)
        assert missing.status_code == 404
        marker = gateway.quill.workspace("acme/zoo")
        await marker.write("after.md", "after the purge\n")
        await marker.info()  # the replica has applied the purge before it
        left = (await http.get("/v1/workspaces", headers=admin)).json()
        assert [w["name"] for w in left["workspaces"]] == ["agents", "ops", "zoo"]
        assert (await gateway.quill.workspace("globex/book").info()).version == 2


async def test_mcp_lists_the_tenants_workspaces_and_archives(start: StartGateway) -> None:
    gateway = await start(TOKENS, operator_tools=("archive_workspace",))  # offered: asked for
    await seed(gateway.quill)
    async with mcp_client(gateway.url, token="acme-admin-token") as mcp:
        await ok(mcp, "attach_workspace", uri="server:/acme/book")
        said = await ok(mcp, "list_workspaces")
        session, tenant = said.split("\n\n")
        assert session.splitlines() == [
            "Primary workspace: server:/acme/ops",
            "Attached (tools that name no workspace try them in this order):",
            "  server:/acme/book -> acme/book (server)",
        ]  # the session's, then the tenant's: one list, the same marks
        lines = tenant.splitlines()
        assert lines[0] == "Workspaces of tenant acme (* this session's primary, + attached):"
        assert [line[:2] for line in lines[1:]] == ["  ", "+ ", "* ", "  "]
        assert lines[2].startswith("+ book: v2, 1 file, 5 bytes, last write ")
        assert await ok(mcp, "archive_workspace", workspace="zoo", reason="done") == "Archived zoo"
        again = await ok(mcp, "archive_workspace", workspace="zoo")
        assert again == "zoo was archived already"
        assert "zoo: v2, 0 files, 0 bytes, last archive" in await ok(mcp, "list_workspaces")
        refused = await error(mcp, "write_file", path="a.md", content="a", workspace="zoo")
        assert "is archived" in refused
    async with mcp_client(gateway.url, token="acme-agent-token") as mcp:
        tenant = (await ok(mcp, "list_workspaces")).split("\n\n")[1].splitlines()
        assert len(tenant) == 2 and tenant[1].startswith("* agents")  # its own alone
        denied = await error(mcp, "archive_workspace", workspace="book")
        assert denied.startswith("Error: Access denied: this token reaches only its own")
        tools = {t.name for t in (await mcp.list_tools()).tools}
        assert {"list_workspaces", "archive_workspace"} <= tools
        assert not {"purge_workspace", "unarchive_workspace"} & tools
    default = await start(TOKENS)  # no model is offered an operator's tool by default
    async with mcp_client(default.url, token="acme-admin-token") as mcp:
        tools = {t.name for t in (await mcp.list_tools()).tools}
        assert "list_workspaces" in tools and "archive_workspace" not in tools
        unknown = await mcp.call_tool("archive_workspace", {"workspace": "zoo"})
        assert unknown.is_error and "archive_workspace" in str(unknown.content)
    book = await default.quill.workspace("acme/book").events()
    assert "workspace_archived" not in {e.type for e in book.events}
