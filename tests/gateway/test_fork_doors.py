"""Forks at the gateway's doors (issue 33, item 6): MCP's ``fork_workspace``, REST's
``POST /v1/workspaces/{name}/fork`` and ``GET /v1/workspaces/{name}/forks`` (as the OpenAPI
document describes them), and the console's forks page with its Fork form; each through a
real gateway, writer and reader, the fork then read through the SDK. Refusals are
``tests/security/test_fork_doors.py``'s."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema

from quill.client import Quill
from services.gateway.access import Principal, Tokens
from services.gateway.rest.openapi import document
from tests.gateway.conftest import StartGateway
from tests.gateway.support import call, mcp_client, ok
from tests.helpers import eventually
from tests.security.test_console_processes import csrf_of

TOKENS = Tokens({"acme-admin-token": Principal("acme", "ops", pinned=False, actor="ann")})
ADMIN = {"Authorization": "Bearer acme-admin-token"}


async def seed(sdk: Quill) -> None:
    book = sdk.workspace("acme/book")
    await book.create(exist_ok=True)
    await book.write("ch1.md", "once\n")  # version 2
    await book.write("ch2.md", "twice\n")  # version 3


async def test_mcp_forks_the_sessions_workspace_or_a_named_one(start: StartGateway) -> None:
    gateway = await start(TOKENS)
    await seed(gateway.quill)
    async with mcp_client(gateway.url, token="acme-admin-token") as mcp:
        said = await ok(mcp, "fork_workspace", name="draft", workspace="book", version=2)
        assert said == (
            "Forked acme/book at version 2 as acme/draft (its next change is version 3): "
            'pass workspace="draft" to work in it'
        )
        result = await call(mcp, "fork_workspace", name="mine")  # the session's own (ops)
        data: Any = result.structured_content
        assert not result.is_error and (data["workspace"], data["source"]) == (
            "acme/mine",
            "acme/ops",
        )
        # the model works in the fork by name; the source does not see it
        await ok(mcp, "write_file", path="ch3.md", content="three\n", workspace="draft")
        listed = await ok(mcp, "list_directory", path=".", workspace="draft")
        assert "[FILE] ch1.md" in listed and "[FILE] ch3.md" in listed
        assert "ch2.md" not in listed  # forked at version 2
        # an attached workspace, by its URI
        await ok(mcp, "attach_workspace", uri="server:/acme/book")
        by_uri = await ok(mcp, "fork_workspace", name="by-uri", workspace="server:/acme/book")
        assert by_uri.startswith("Forked acme/book at version 3 as acme/by-uri")
    book = gateway.quill.workspace("acme/book")
    forks = {f.workspace: (f.version, f.ahead, f.behind) for f in (await book.forks()).forks}
    assert forks == {"by-uri": (3, 0, 0), "draft": (2, 1, 1)}


async def test_rest_forks_and_lists_forks_as_openapi_says(start: StartGateway) -> None:
    gateway = await start(TOKENS)
    await seed(gateway.quill)
    paths = document()["paths"]
    fork_spec = paths["/v1/workspaces/{name}/fork"]["post"]
    forks_spec = paths["/v1/workspaces/{name}/forks"]["get"]

    def check(reply: httpx.Response, spec: dict[str, Any]) -> None:
        schema = spec["responses"][str(reply.status_code)]["content"]["application/json"]
        jsonschema.validate(reply.json(), schema["schema"])

    async with httpx.AsyncClient(base_url=gateway.url, timeout=30, headers=ADMIN) as http:
        body = {"name": "draft", "version": 2}
        jsonschema.validate(body, fork_spec["requestBody"]["content"]["application/json"]["schema"])
        made = await http.post("/v1/workspaces/book/fork", json=body)
        assert made.status_code == 201, made.text
        assert made.json() == {"name": "draft", "from": "book", "version": 2, "trust": "full"}
        check(made, fork_spec)
        latest = await http.post("/v1/workspaces/book/fork", json={"name": "latest"})
        assert latest.json()["version"] == 3
        draft = gateway.quill.workspace("acme/draft")
        await draft.write("new.md", "new\n")
        await draft.info()  # the replica has the write: the listing counts it
        listed = await http.get("/v1/workspaces/book/forks")
        assert listed.json() == {
            "name": "book",
            "forks": [
                {"name": "draft", "version": 2, "ahead": 1, "behind": 1},
                {"name": "latest", "version": 3, "ahead": 0, "behind": 0},
            ],
            "truncated": False,
        }
        check(listed, forks_spec)
        one = (await http.get("/v1/workspaces/book/forks?limit=1")).json()
        assert [f["name"] for f in one["forks"]] == ["draft"] and one["truncated"]
        assert (await http.get("/v1/workspaces/draft/forks")).json()["forks"] == []
        taken = await http.post("/v1/workspaces/book/fork", json={"name": "draft"})
        assert taken.status_code == 409 and taken.json()["error"] == "path_conflict"
        assert "409" in fork_spec["responses"] and "403" in forks_spec["responses"]
    assert (await draft.read_text("ch1.md")) == "once\n"


async def test_the_console_shows_forks_and_forks_through_its_form(start: StartGateway) -> None:
    gateway = await start()  # no tokens: the loopback caller, tenant default
    sdk = gateway.quill
    book = sdk.workspace("default/book")
    await book.create(exist_ok=True)
    await book.write("a.md", "a\n")
    await sdk.fork("default/book", "early", version=1)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:

        async def listed() -> httpx.Response | None:  # once the reader has the fork
            page = await http.get("/ui/w/book/forks")
            assert page.status_code == 200
            return page if 'id="fork-early"' in page.text else None

        page = await eventually(listed, what="the fork on the source's page")
        assert "version 1" in page.text
        assert "Not a fork" in page.text and 'id="merge"' in page.text
        made = await http.post(
            "/ui/w/book/forks", data={"name": "try-a", "version": "", "csrf": csrf_of(page.text)}
        )
        assert made.status_code == 303
        assert made.headers["location"].startswith("/ui/w/try-a/forks?forked=")
        fork_page = await http.get(made.headers["location"])
        assert "Forked default/book at version 2 as default/try-a" in fork_page.text
        assert '<a href="/ui/w/book/">book</a> at version' in fork_page.text
        again = (await http.get("/ui/w/book/forks")).text
        assert 'id="fork-try-a"' in again
        # another tenant's workspace, as the loopback caller names it (tenant:name)
        await sdk.workspace("acme/plan").create(exist_ok=True)
        other = await http.get("/ui/w/acme:plan/forks")
        made = await http.post(
            "/ui/w/acme:plan/forks", data={"name": "alt", "csrf": csrf_of(other.text)}
        )
        assert made.headers["location"].startswith("/ui/w/acme:alt/forks")
    assert [f.workspace for f in (await sdk.workspace("acme/plan").forks()).forks] == ["alt"]
    assert (await sdk.workspace("default/try-a").read_text("a.md")) == "a\n"
