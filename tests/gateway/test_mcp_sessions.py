"""Sessions at /mcp (seed 003) over real HTTP with the MCP client: attach/list/detach, where a
call goes (the resolution flowchart case by case), who may attach what, and approvals asked of
the client's user by elicitation."""

from __future__ import annotations

import re
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from mcp.types import ElicitRequestParams, ElicitResult

from quill.client import Quill
from services.executor.app import ExecutorConfig
from services.gateway.access import Tokens
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway
from tests.gateway.support import call, error, mcp_client, ok, text
from tests.helpers import start_executor

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "gateway.md").read_text()


class User:
    """The person at an MCP client: answers each elicitation as told, and remembers it."""

    def __init__(self, action: str, reason: str | None = None) -> None:
        self.action, self.reason = action, reason
        self.asked: list[str] = []

    async def __call__(self, context: Any, params: ElicitRequestParams) -> ElicitResult:
        self.asked.append(params.message)
        content = {"reason": self.reason} if self.reason and self.action == "accept" else {}
        return ElicitResult(action=self.action, content=content)  # type: ignore[arg-type]


async def test_attach_list_detach(gateway: Gateway, sdk: Quill) -> None:
    async with mcp_client(gateway.url) as mcp:
        said = await ok(mcp, "list_workspaces")
        assert said.split("\n\n")[0] == (
            "Primary workspace: server:/default/default\nNo workspaces attached"
        )
        attached = await call(mcp, "attach_workspace", uri="server:/default/shared")
        assert text(attached) == (
            "Attached server:/default/shared\n"
            "Primary workspace: server:/default/default\n"
            "Attached (tools that name no workspace try them in this order):\n"
            "  server:/default/shared -> default/shared (server)"
        )
        assert attached.structured_content == {
            "primary": "default/default",
            "attached": [
                {"uri": "server:/default/shared", "target": "default/shared", "kind": "server"}
            ],
        }
        assert "server:/default/shared" in await ok(mcp, "list_workspaces")
        detached = await ok(mcp, "detach_workspace", uri="server:/default/shared")
        assert detached.startswith("Detached server:/default/shared\n")
        assert detached.endswith("No workspaces attached")
        again = await error(mcp, "detach_workspace", uri="server:/default/shared")
        assert again == "Error: server:/default/shared is not attached"
        bad = await error(mcp, "attach_workspace", uri="no uri here")
        assert bad.startswith("Error: Invalid workspace URI 'no uri here'")
    # The session is the primary workspace's log: attaching and detaching are events in it.
    kinds = [e.type for e in (await sdk.workspace("default/default").events()).events]
    assert kinds.count("workspace_attached") == 1 and kinds.count("workspace_detached") == 1


async def test_resolution_case_by_case(
    gateway: Gateway, sdk: Quill, nats_url: str, tmp_path: Path
) -> None:
    primary = sdk.workspace("default/default")
    await primary.write("notes.md", "mine\n")
    await primary.set_trust("restricted")  # restricted without commands: no exec.run
    careful, shared = sdk.workspace("default/careful"), sdk.workspace("default/shared")
    await careful.create(trust="restricted")
    await shared.create()
    await shared.write("facts.md", "water is wet\n")
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        async with mcp_client(gateway.url) as mcp:
            await ok(mcp, "attach_workspace", uri="server:/default/careful")
            await ok(mcp, "attach_workspace", uri="server:/default/shared")
            # Named: it goes there.
            named = await ok(mcp, "read_file", path="facts.md", workspace="server:/default/shared")
            assert named == "water is wet\n"
            assert await ok(mcp, "read_file", path="facts.md", workspace="shared") == named
            # Not named, the primary offers it: the primary.
            assert await ok(mcp, "read_file", path="notes.md") == "mine\n"
            # The primary does not offer it: the first attached workspace that does.
            ran = await ok(mcp, "execute_command", command="cat facts.md")
            assert ran.startswith("Exit code: 0\n\n--- stdout ---\nwater is wet")
            # Nobody offers it: Tool not found.
            await ok(mcp, "detach_workspace", uri="server:/default/shared")
            missing = await call(mcp, "bash", command="true")
            assert missing.is_error
            assert text(missing) == (
                "Error: Tool not found: no workspace of session default offers exec.run"
            )
            assert missing.structured_content is not None
            assert missing.structured_content["code"] == "INVALID_ARGUMENT"
            # A URI names an attached workspace only.
            gone = await error(
                mcp, "read_file", path="facts.md", workspace="server:/default/shared"
            )
            assert gone == "Error: File not found: facts.md"


async def test_a_pinned_token_attaches_nothing(start: StartGateway) -> None:
    gateway = await start({"agents-token-1": "acme/agents"})
    await gateway.quill.workspace("globex/secret").create()
    async with mcp_client(gateway.url, token="agents-token-1") as mcp:
        refusals = {
            await error(mcp, "attach_workspace", uri=uri)
            for uri in ("server:/acme/other", "server:/globex/secret", "server:/globex/none")
        }
        assert refusals == {
            "Error: Access denied: this token reaches only its own workspace (acme/agents) and "
            "cannot attach others"
        }
        result = await call(mcp, "attach_workspace", uri="server:/globex/secret")
        assert result.structured_content is not None
        assert result.structured_content["code"] == "ACCESS_DENIED"
        assert result.structured_content["details"] == {"uri": "server:/globex/secret"}
        listing = (await ok(mcp, "list_workspaces")).split("\n\n")[0]
        assert listing == "Primary workspace: server:/acme/agents\nNo workspaces attached"
        await ok(mcp, "write_file", path="a.md", content="a\n", workspace="server:/acme/agents")
        assert await ok(mcp, "read_file", path="a.md") == "a\n"
        other = await error(mcp, "list_workspaces", workspace="other")
        assert other == "Error: Workspace not found: other"


def test_a_tokens_file_scope_is_workspace_or_tenant(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(re.findall(r"```toml\n(.*?)```", PAGE, re.S)[1])  # the page's example
    assert [(p.name, p.pinned) for p in Tokens.load(path).principals()] == [("acme/lead", False)]
    path.write_text(
        '[tokens."lead-token-123"]\ntenant = "acme"\nworkspace = "lead"\nscope = "tenant"\n\n'
        '[tokens."pinned-token-1"]\ntenant = "acme"\nworkspace = "ci"\nscope = "workspace"\n'
    )
    assert [(p.name, p.pinned) for p in Tokens.load(path).principals()] == [
        ("acme/ci", True),
        ("acme/lead", False),
    ]
    path.write_text('[tokens."lead-token-123"]\ntenant = "acme"\nworkspace = "w"\nscope = "all"\n')
    with pytest.raises(ValueError, match='scope must be "workspace" or "tenant", not \'all\''):
        Tokens.load(path)


async def test_a_tenant_scoped_token_attaches_in_its_tenant_only(
    start: StartGateway, tmp_path: Path
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(
        '[tokens."lead-token-123"]\ntenant = "acme"\nworkspace = "lead"\nscope = "tenant"\n'
    )
    gateway = await start(Tokens.load(path))
    sdk = gateway.quill
    await sdk.workspace("acme/shared").create()
    await sdk.workspace("acme/shared").write("plan.md", "ship it\n")
    await sdk.workspace("globex/secret").create()
    async with mcp_client(gateway.url, token="lead-token-123") as mcp:
        listing = await ok(mcp, "attach_workspace", uri="server:/acme/shared")
        assert listing.endswith("server:/acme/shared -> acme/shared (server)")
        shared = await ok(mcp, "read_file", path="plan.md", workspace="server:/acme/shared")
        assert shared == "ship it\n"
        # Another tenant's: "not found", the same whether it exists or not.
        for uri in ("server:/globex/secret", "server:/globex/none"):
            assert (
                await error(mcp, "attach_workspace", uri=uri)
                == f"Error: Workspace not found: {uri}"
            )
        theirs = await error(mcp, "read_file", path="x", workspace="server:/globex/secret")
        assert theirs == "Error: File not found: x"
        assert "globex" not in await ok(mcp, "list_workspaces")


async def restricted(sdk: Quill) -> Any:
    ws = sdk.workspace("default/default")
    await ws.set_trust("restricted", commands=True)
    return ws


async def test_elicitation_accepted_gives_the_real_result(
    gateway: Gateway, sdk: Quill, nats_url: str, tmp_path: Path
) -> None:
    ws = await restricted(sdk)
    user = User("accept", reason="looks fine")
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        async with mcp_client(gateway.url, elicitation_callback=user) as mcp:
            written = await ok(mcp, "write_file", path="plan.md", content="the plan\n")
            assert written == "Successfully wrote 9 bytes to plan.md"
            ran = await ok(mcp, "execute_command", command="echo ran > out.txt; cat plan.md")
            assert ran.startswith("Exit code: 0\n\n--- stdout ---\nthe plan")
    [write, run] = user.asked
    assert write.startswith(
        "Allow write_file (cmd.write) on plan.md in restricted workspace default/default? "
        "(approval "
    )
    assert run.startswith(
        "Allow execute_command (exec.run): echo ran > out.txt; cat plan.md in restricted "
        "workspace default/default?"
    )
    assert await ws.read_text("plan.md") == "the plan\n"
    assert await ws.read_text("out.txt") == "ran\n"
    events = (await ws.events()).events
    decided = [e for e in events if e.type == "approval_decided"]
    assert len(decided) == 2 and [e.type for e in events].count("approval_requested") == 2
    assert {e.actor for e in decided} == {"mcp via MCP elicitation"}  # the client's own name
    assert (await ws.approvals()).pending == []


async def test_elicitation_declined_is_denied(gateway: Gateway, sdk: Quill) -> None:
    ws = await restricted(sdk)
    user = User("decline")
    async with mcp_client(gateway.url, elicitation_callback=user) as mcp:
        result = await call(mcp, "write_file", path="plan.md", content="the plan\n")
        user.action = "cancel"
        also = await error(mcp, "create_directory", path="docs")
    assert result.is_error and result.structured_content is not None
    assert result.structured_content["code"] == "DENIED"
    assert text(result) == (
        "Error: Failed to write file - Denied by mcp via MCP elicitation: declined in the MCP "
        "client"
    )
    assert also == (
        "Error: Failed to create directory - Denied by mcp via MCP elicitation: declined in "
        "the MCP client"
    )
    assert [e.type for e in (await ws.events()).events].count("approval_decided") == 2
    assert (await ws.list(".")).entries == []


async def test_without_elicitation_approval_required_with_its_id(
    gateway: Gateway, sdk: Quill
) -> None:
    ws = await restricted(sdk)
    for options in ({}, {"mode": "legacy", "elicitation_callback": User("accept")}):
        async with mcp_client(gateway.url, **options) as mcp:
            result = await call(mcp, "write_file", path="plan.md", content="the plan\n")
        assert result.is_error and result.structured_content is not None
        assert result.structured_content["code"] == "APPROVAL_REQUIRED"
        approval_id = result.structured_content["details"]["approval_id"]
        assert approval_id in text(result)
        decided = await ws.approve(approval_id)  # `quill approve <id>` decides it
        assert (decided.approval_id, decided.approved) == (approval_id, True)
