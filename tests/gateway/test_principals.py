"""Tokens: who reaches which workspace, over REST and MCP; 401s; isolation that leaks nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from services.gateway.access import Tokens
from services.gateway.server import Gateway, GatewayConfig
from tests.gateway.conftest import StartGateway
from tests.gateway.support import error, mcp_client, ok

FILES = "/v1/host/workspace/files"
TOKENS = {
    "token-acme-alpha": "acme/alpha",
    "token-globex-alpha": "globex/alpha",  # same workspace name, another tenant
    "token-acme-beta": "acme/beta",  # same tenant, another workspace
}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def guarded(start: StartGateway) -> Gateway:
    return await start(TOKENS)


async def test_missing_or_unknown_tokens_get_401(guarded: Gateway) -> None:
    async with httpx.AsyncClient(base_url=guarded.url) as http:
        for headers in ({}, bearer("not-a-token"), {"Authorization": "Basic dXNlcjpwdw=="}):
            for method, url in [
                ("GET", FILES),
                ("GET", f"{FILES}/a.md"),
                ("PUT", f"{FILES}/a.md"),
                ("POST", "/mcp"),
                ("POST", "/mcp/wap"),
            ]:
                reply = await http.request(method, url, headers=headers, content=b"{}")
                assert (reply.status_code, reply.json()) == (401, {"error": "unauthorized"})
                assert reply.headers["www-authenticate"].startswith("Bearer")
        for public in ("/health", "/openapi.json", "/metrics", "/.well-known/openwop"):
            assert (await http.get(public)).status_code == 200


async def test_token_workspaces_are_created_at_startup(guarded: Gateway) -> None:
    for name in TOKENS.values():
        info = await guarded.quill.workspace(name).info()
        assert f"{info.tenant}/{info.workspace}" == name


async def test_rest_isolates_tenants_and_workspaces(guarded: Gateway) -> None:
    async with httpx.AsyncClient(base_url=guarded.url) as http:
        alpha = bearer("token-acme-alpha")
        mine = await http.put(f"{FILES}/SECRET.md", json={"content": "acme's plans"}, headers=alpha)
        assert mine.status_code == 200
        never = await http.get(f"{FILES}/NEVER.md", headers=bearer("token-globex-alpha"))
        for other in ("token-globex-alpha", "token-acme-beta"):
            who = bearer(other)
            theirs = await http.get(f"{FILES}/SECRET.md", headers=who)
            # exactly what a file that never existed gets: nothing to tell them apart
            assert (theirs.status_code, theirs.content) == (never.status_code, never.content)
            assert theirs.json() == {"error": "not_found"}
            old = await http.get(f"{FILES}/SECRET.md", params={"version": 1}, headers=who)
            assert (old.status_code, old.json()) == (404, {"error": "not_found"})
            assert (await http.get(FILES, headers=who)).json()["files"] == []
            assert (await http.delete(f"{FILES}/SECRET.md", headers=who)).status_code == 404
            overwrite = await http.put(f"{FILES}/SECRET.md", json={"content": other}, headers=who)
            assert (overwrite.status_code, overwrite.json()["version"]) == (200, 1)
        own = await http.get(f"{FILES}/SECRET.md", headers=alpha)
        assert (own.json()["content"], own.json()["version"]) == ("acme's plans", 1)


async def test_mcp_reaches_only_the_token_workspace(guarded: Gateway) -> None:
    await guarded.quill.workspace("acme/alpha").write("plan.md", "secret")
    async with mcp_client(guarded.url, token="token-acme-alpha") as alpha:
        assert await ok(alpha, "read_file", path="plan.md") == "secret"
        assert await ok(alpha, "read_file", path="plan.md", workspace="alpha") == "secret"
    async with mcp_client(guarded.url, token="token-acme-beta") as beta:
        missing = "Error: File not found: plan.md"
        assert await error(beta, "read_file", path="plan.md") == missing
        # naming a sibling workspace: "not found" as named, existing or not
        for name in ("alpha", "nowhere"):
            said = await error(beta, "read_file", path="plan.md", workspace=name)
            assert said == f"Error: Workspace not found: {name}"
        refused = await error(beta, "write_file", path="x.md", content="x", workspace="alpha")
        assert refused == "Error: Workspace not found: alpha"
        listing = await error(beta, "list_directory", path=".", workspace="alpha")
        assert listing == "Error: Workspace not found: alpha"
    async with mcp_client(guarded.url, "/mcp/wap", token="token-globex-alpha") as globex:
        result = await globex.call_tool("readFile", {"path": "plan.md"})
        assert result.is_error and result.structured_content is not None
        assert result.structured_content["code"] == "FILE_NOT_FOUND"
    assert [e.name for e in (await guarded.quill.workspace("acme/beta").list()).entries] == []


async def test_without_tokens_any_workspace_of_any_tenant(gateway: Gateway) -> None:
    async with mcp_client(gateway.url) as mcp:
        said = await ok(mcp, "write_file", path="s.md", content="scratch", workspace="scratch")
        assert said == "Successfully wrote 7 bytes to s.md"
        assert await ok(mcp, "read_file", path="s.md", workspace="scratch") == "scratch"
        assert await error(mcp, "read_file", path="s.md") == "Error: File not found: s.md"
        bad = await error(mcp, "read_file", path="s.md", workspace="Not/Valid")
        assert bad.startswith("Error: Invalid tenant id 'Not'")
        bad = await error(mcp, "read_file", path="s.md", workspace="acme/Nope")
        assert bad.startswith("Error: Invalid workspace id 'Nope'")
        # on loopback without tokens, tenant/workspace names any tenant's (the README's tour)
        await ok(mcp, "write_file", path="t.md", content="tour", workspace="acme/demo")
        assert await ok(mcp, "read_file", path="t.md", workspace="acme/demo") == "tour"
        assert await ok(mcp, "read_file", path="s.md", workspace="default/scratch") == "scratch"
    assert await gateway.quill.workspace("default/scratch").read_text("s.md") == "scratch"
    assert await gateway.quill.workspace("acme/demo").read_text("t.md") == "tour"


async def test_without_tokens_only_loopback_host_names_are_served(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        for host in ("localhost", f"127.0.0.1:{gateway.port}", "[::1]:8080"):
            assert (await http.get(FILES, headers={"Host": host})).status_code == 200, host
        for host in ("evil.example", "evil.example:80", "10.0.0.1"):  # DNS rebinding
            refused = await http.get(FILES, headers={"Host": host})
            assert (refused.status_code, refused.json()["error"]) == (403, "access_denied")
            mcp = await http.post("/mcp", headers={"Host": host}, content=b"{}")
            assert mcp.status_code == 403


async def test_with_tokens_any_host_name_is_served(guarded: Gateway) -> None:
    auth = {"Authorization": "Bearer token-acme-alpha", "Host": "quill.example:443"}
    async with httpx.AsyncClient(base_url=guarded.url) as http:
        assert (await http.get(FILES, headers=auth)).status_code == 200
        init = await http.post(
            "/mcp",
            headers={**auth, "Content-Type": "application/json", "Accept": "*/*"},
            content=b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}',
        )
        assert init.status_code == 200 and init.json()["result"]["tools"]


def test_public_address_needs_tokens(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs --tokens"):
        GatewayConfig("nats://127.0.0.1:4222", host="0.0.0.0").check()
    GatewayConfig("nats://127.0.0.1:4222", host="::1").check()  # loopback: fine


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not toml [", "cannot read tokens file"),
        ("[other]\nx = 1\n", "no [tokens"),
        ('[tokens."abcdefgh"]\ntenant = "acme"\n', "needs tenant = and workspace ="),
        ('[tokens."abcdefgh"]\ntenant = "a"\nworkspace = "w"\nrole = "x"\n', "maybe actor"),
        ('[tokens."abcdefgh"]\ntenant = "ACME"\nworkspace = "w"\n', "Invalid tenant id"),
        ('[tokens."short"]\ntenant = "a"\nworkspace = "w"\n', "at least 8 characters"),
    ],
)
def test_bad_tokens_files_are_refused(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=problem.replace("[", r"\[")):
        Tokens.load(path)


def test_tokens_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text('[tokens."tok-123456"]\ntenant = "acme"\nworkspace = "w1"\n')
    tokens = Tokens.load(path)
    principal = tokens.find("tok-123456")
    assert principal is not None and principal.name == "acme/w1"
    assert tokens.find("tok-1234567") is None


async def test_events_and_audit_name_the_token_s_actor(
    start: StartGateway, nats_url: str, tmp_path: Path
) -> None:
    from contextlib import AsyncExitStack

    from services.gateway.server import start_gateway

    tokens_file = tmp_path / "tokens.toml"
    tokens_file.write_text(
        '[tokens."named-token-1"]\ntenant = "acme"\nworkspace = "named"\nactor = "research-agent"\n'
        '[tokens."plain-token-2"]\ntenant = "acme"\nworkspace = "named"\n'
    )
    await start()  # the writer and reader
    async with AsyncExitStack() as stack:
        running = await start_gateway(
            GatewayConfig(nats_url, port=0, tokens=Tokens.load(tokens_file))
        )
        stack.push_async_callback(running.stop)
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as http:
            for token, body in (("named-token-1", "a"), ("plain-token-2", "b")):
                r = await http.put(
                    "/v1/host/workspace/files/notes.md",
                    json={"content": body},
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert r.status_code == 200, r.text
        history = await running.quill.workspace("acme/named").history("notes.md")
        actors = [rev.actor for rev in history.revisions]
        assert actors[0].startswith("token:") and len(actors[0]) == len("token:") + 8
        assert actors[1] == "research-agent"
        assert "plain-token-2" not in actors[0]
