"""What an MCP client reads in ``tools/list``: every tool's output schema (which each real
result, errors included, matches), its annotations, plain and short descriptions, and the size
of the whole list."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest_asyncio
from mcp import Client
from mcp.types import Tool

from services.executor.app import ExecutorConfig
from services.gateway.mcp import endpoints
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway
from tests.gateway.support import call, mcp_client
from tests.helpers import start_executor

LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
BUDGET = {"/mcp": 35_743, "/mcp/wap": 6_900}
"""Bytes of a ``tools/list`` answer. Before output schemas and annotations everywhere (and 4
more tools at /mcp) they were 27,360 and 6,279, and under 27,000 and 6,250 after. Issue 30 put
the ``workspace`` parameter's description in every tool's schema (clients such as LangChain
and pydantic-ai hand a model the tools, not the server's instructions, which said it once):
+2,500 bytes at /mcp (``archive_workspace`` no longer listed by default: -700; and
``file_history``'s ``follow``), +600 at WAP. Issue 30's ``wait_for_approval`` (how a client
without elicitation gets the outcome of a call parked for approval): +1,150 at /mcp.
Issue 32 (commands that outlive the call): ``running`` and ``cursor`` in the output schema of
``execute_command`` and ``bash`` (+100), their ``yield_ms`` (+250), ``read_command_output``'s
``cursor``/``wait_ms`` and its output schema admitting a poll (+450), and ``write_stdin``,
``send_signal``, ``list_commands`` (+1,950, descriptions cut to a line each): 33,154 bytes;
then a command's ``shell``, ``background`` and ``kept_conflicts`` (shells) and a poll's
``dropped`` in the output schemas (+340): 33,496. Each endpoint is kept under that size.
Issue 33's ``fork_workspace``: 33,469 bytes before, 34,278 after: the budget grew by the
tool's 809 bytes (its entry, schemas and description, and the comma before it; nothing
else). Its ``merge_workspace``: 34,278 before, 35,612 after: the budget grew by the tool's
1,334 bytes (with its comma; its output schema, the op's reply one level deep, is 494)."""
SIZE_BEFORE = {"/mcp": 35_793, "/mcp/wap": 6_950}
"""What the budget may not grow past without this docstring saying why."""
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082"
)

# One call per tool: a success, then a failure. Both must match the tool's outputSchema.
MCP_CALLS: dict[str, list[dict[str, Any]]] = {
    "read_file": [{"path": "a.txt", "line_numbers": True}, {"path": "nope"}],
    "write_file": [{"path": "w.txt", "content": "w"}, {"path": "../x", "content": ""}],
    "list_directory": [{"path": "."}, {"path": "nope"}],
    "create_directory": [{"path": "d"}, {"path": "a.txt"}],
    "get_file_info": [{"path": "a.txt"}, {"path": "nope"}],
    "search_files": [
        {"path": ".", "pattern": "*.txt", "exclude": ["w*"]},
        {"path": "x", "pattern": "*"},
    ],
    "edit_file": [
        {"path": "a.txt", "old_string": "two", "new_string": "2"},
        {"path": "a.txt", "edits": [{"old_string": "one", "new_string": "1"}], "dry_run": True},
        {"path": "a.txt", "old_string": "absent", "new_string": "x"},
    ],
    "modify_file": [
        {"path": "a.txt", "operations": [{"type": "insert", "after_line": 0, "new_content": "0"}]},
        {"path": "a.txt", "operations": [{"type": "delete", "start_line": 90, "end_line": 91}]},
    ],
    "grep": [{"pattern": "one"}, {"pattern": "(", "path": "."}],
    "explore_files": [{"recursive": True, "metadata": True}, {"path": "nope"}],
    "delete_file": [{"path": "w.txt"}, {"path": "nope"}],
    "move_file": [
        {"source": "m.txt", "destination": "n.txt"},
        {"source": "m.txt", "destination": "o"},
    ],
    "file_history": [{"path": "a.txt"}, {"path": "../x"}],
    "diff": [{"from_version": 1}, {"from_version": 999}],
    "restore": [{"version": 2, "path": "a.txt"}, {"version": 999}],
    "get_workspace_info": [{}, {"workspace": "Bad Name"}],
    "execute_command": [
        {"command": "echo hi; echo err >&2"},
        {"command": "true", "workdir": "../x"},
    ],
    "bash": [{"command": "git init -q -b main"}, {"command": "true", "workdir": "nope"}],
    "read_command_output": [{"command_id": "never-ran"}, {"command_id": "x", "cursor": ""}],
    "write_stdin": [{"command_id": "c0123456789abnope", "text": "x"}],
    "send_signal": [{"command_id": "c0123456789abnope", "signal": "TERM"}],
    "list_commands": [{}, {"workspace": "Bad Name"}],
    "wait_for_approval": [{"approval_id": "never-asked", "timeout_ms": 0}],
    "git": [{"action": "status"}, {"action": "commit"}],
    "read_multiple_files": [
        {"paths": ["a.txt", "nope", "pic.png"]},
        {"paths": ["a.txt"], "workspace": "Bad"},
    ],
    "read_media_file": [{"path": "pic.png"}, {"path": "a.txt"}],
    "directory_tree": [{}, {"path": "nope"}],
    "list_directory_with_sizes": [{"sort_by": "size"}, {"path": "nope"}],
    "attach_workspace": [{"uri": "server:/default/other"}, {"uri": "nonsense"}],
    "detach_workspace": [{"uri": "server:/default/other"}, {"uri": "server:/default/other"}],
    "list_workspaces": [{}, {"workspace": "Bad Name"}],
    "archive_workspace": [{"workspace": "other"}, {"workspace": "Bad Name"}],
    "fork_workspace": [{"name": "forked"}, {"name": "forked"}],
    "merge_workspace": [{"from": "forked", "dry_run": True}, {"from": "never-made"}],
}
WAP_CALLS: dict[str, list[dict[str, Any]]] = {
    "exploreFiles": [{"path": ".", "returnMetadata": True}, {"path": "nope"}],
    "readFile": [{"path": "a.txt", "startLine": 1}, {"path": "nope"}],
    "writeFile": [
        {"path": "v.txt", "content": "v"},
        {"path": "a.txt", "content": "", "mode": "create"},
    ],
    "modifyFile": [
        {
            "path": "a.txt",
            "operations": [{"type": "insert", "afterLine": 0, "newContent": "x"}],
        },
        {"path": "nope", "operations": [{"type": "delete", "startLine": 1, "endLine": 1}]},
    ],
    "searchFiles": [
        {"paths": ["."], "query": "o", "type": "literal"},
        {"paths": ["nope"], "query": "(", "type": "regex"},
    ],
    "executeCommand": [{"command": "echo wap"}, {"command": "true", "workingDirectory": "../x"}],
    "getWorkspaceInfo": [{}, {"workspace": "Bad Name"}],
}


@pytest_asyncio.fixture
async def executor(start: StartGateway, nats_url: str, tmp_path: Path) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        yield


async def listed(mcp: Client) -> dict[str, Tool]:
    return {t.name: t for t in (await mcp.list_tools()).tools}


async def test_every_result_matches_its_output_schema(start: StartGateway, executor: None) -> None:
    gateway = await start(operator_tools=tuple(endpoints.OPERATOR_TOOLS))  # every tool
    ws = gateway.quill.workspace("default/default")
    await ws.write("a.txt", "one\ntwo\n")
    await ws.write("m.txt", "m")
    await ws.write("pic.png", PNG)
    for endpoint, calls in (("/mcp", MCP_CALLS), ("/mcp/wap", WAP_CALLS)):
        async with mcp_client(gateway.url, endpoint) as mcp:
            tools = await listed(mcp)
            assert set(tools) == set(calls), endpoint  # a new tool needs its calls here
            for name, arguments in calls.items():
                schema = tools[name].output_schema
                assert schema is not None and schema["type"] == "object", name
                jsonschema.Draft202012Validator.check_schema(schema)
                outcomes = set()
                for args in arguments:
                    result = await call(mcp, name, **args)
                    outcomes.add(result.is_error)
                    assert isinstance(result.structured_content, dict), (name, args)
                    jsonschema.validate(result.structured_content, schema)
                    if result.is_error:  # the error form, saying what the text says
                        data = result.structured_content
                        assert {"error", "code"} <= set(data), (name, data)
                only_errors = ("read_command_output", "wait_for_approval", "write_stdin")
                only_errors += ("send_signal",)  # nothing to find: no command runs
                want = {True} if name in only_errors else {False, True}
                assert outcomes == want, name


async def test_annotations_say_what_each_tool_does(gateway: Gateway) -> None:
    for endpoint in ("/mcp", "/mcp/wap"):
        async with mcp_client(gateway.url, endpoint) as mcp:
            tools = await listed(mcp)
        for tool in tools.values():
            hints = tool.annotations
            assert hints is not None, tool.name
            assert hints.read_only_hint is not None and hints.open_world_hint is not None
            if not hints.read_only_hint:  # meaningful only for a tool that changes things
                assert hints.destructive_hint is not None, tool.name
                assert hints.idempotent_hint is not None, tool.name
    async with mcp_client(gateway.url) as mcp:
        tools = await listed(mcp)
    reads = {"read_file", "list_directory", "get_file_info", "search_files", "grep", "diff"}
    reads |= {"read_multiple_files", "read_media_file", "directory_tree", "file_history"}
    assert all(tools[name].annotations.read_only_hint for name in reads)  # type: ignore[union-attr]
    assert tools["write_file"].annotations.destructive_hint  # type: ignore[union-attr]
    assert not tools["create_directory"].annotations.destructive_hint  # type: ignore[union-attr]
    assert tools["git"].annotations.open_world_hint  # type: ignore[union-attr]
    # bash is an alias of execute_command: the same in everything but its name and description
    bash, command = tools["bash"], tools["execute_command"]
    assert bash.annotations == command.annotations
    assert bash.input_schema == command.input_schema
    assert bash.output_schema == command.output_schema
    assert "execute_command" in (bash.description or "")


async def test_descriptions_are_plain_short_and_the_list_small(gateway: Gateway) -> None:
    async with httpx.AsyncClient() as http:
        for endpoint, budget in BUDGET.items():
            reply = await http.post(gateway.url + endpoint, json=LIST, headers=HEADERS)
            raw = reply.content
            assert len(raw) <= budget, f"{endpoint} tools/list is {len(raw)} bytes"
            text = raw.decode()
            # reStructuredText does not belong in what a model reads
            assert "``" not in text and not re.search(r":(func|class|meth|data):`", text)
            for tool in reply.json()["result"]["tools"]:
                assert len(tool["description"]) <= 700, tool["name"]
                for name, prop in tool["inputSchema"]["properties"].items():
                    assert "title" not in prop, (tool["name"], name)


async def test_tail_and_head_say_their_own_thing(gateway: Gateway) -> None:
    async with mcp_client(gateway.url) as mcp:
        props = (await listed(mcp))["read_file"].input_schema["properties"]
    assert props["head"]["description"] == "Read only first N lines"  # seed 000's words
    assert props["tail"]["description"] == "Read only last N lines"
    assert "line_numbers" in props


def test_the_budget_is_below_the_size_before() -> None:
    """A budget raised past the old size would let the list grow back unnoticed."""
    assert all(BUDGET[endpoint] < SIZE_BEFORE[endpoint] for endpoint in BUDGET)


async def test_every_tools_workspace_says_what_it_is(gateway: Gateway) -> None:
    """Clients such as LangChain and pydantic-ai hand a model each tool's input schema but not
    the server's instructions: what ``workspace`` is must be said in the schema itself."""
    for endpoint in ("/mcp", "/mcp/wap"):
        async with mcp_client(gateway.url, endpoint) as mcp:
            tools = (await mcp.list_tools()).tools
        for tool in tools:
            workspace = tool.input_schema["properties"].get("workspace")
            assert workspace is not None, (endpoint, tool.name)
            assert "workspace" not in tool.input_schema.get("required", []), tool.name
            says = workspace.get("description", "")
            assert "Omit" in says or "your tenant" in says, (endpoint, tool.name, says)
