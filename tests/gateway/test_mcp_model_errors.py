"""What a model reads when an edit cannot be applied, and the answers that must agree with
themselves: a missing directory, a change that changes nothing, a Windows path, a write over
a file, a long listing, optional parameters. Through the official MCP client, on the text."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts import requests as rq
from quill.client import Quill, Workspace
from services.executor.app import ExecutorConfig
from services.gateway.server import Gateway
from tests.gateway.support import (
    agents_page_calls,
    assert_names_missing,
    call,
    mcp_client,
    model_view,
    ok,
)
from tests.helpers import start_executor

CODE = "".join(f"def handler_{i}():\n    return {i % 3}\n\n" for i in range(1, 16))


@pytest.fixture
async def ws(sdk: Quill) -> Workspace:
    """default/default with ``CODE`` at app.py, for the edits (each must leave it so)."""
    ws = sdk.workspace("default/default")
    await ws.write("app.py", CODE)
    return ws


async def test_an_ambiguous_old_string_names_the_lines(gateway: Gateway, ws: Workspace) -> None:
    async with mcp_client(gateway.url) as mcp:
        result = await call(
            mcp, "edit_file", path="app.py", old_string="    return 1\n", new_string="x"
        )
        view = model_view(result)
        assert view.startswith(
            "Error: Found multiple matches for oldString. Provide more surrounding lines in "
            "oldString to identify the correct match, or set replace_all to replace every "
            "occurrence. It occurs 5 times in app.py:\n"
        )
        for line in (2, 11, 20, 29, 38):
            assert f"\nline {line}:     return 1" in view
        details = result.structured_content["details"]  # type: ignore[index]
        assert details["occurrences"] == 5
        assert details["matches"][0] == {"line": 2, "excerpt": "    return 1"}
        many = model_view(
            await call(mcp, "edit_file", path="app.py", old_string="def ", new_string="x")
        )
        assert_names_missing(
            many,
            "It occurs 15 times",
            "listed up to line 28; 5 more after it",
            way_on="replace_all",
        )
    assert await ws.read_text("app.py") == CODE


async def test_a_near_miss_names_the_closest_text(gateway: Gateway, ws: Workspace) -> None:
    async with mcp_client(gateway.url) as mcp:
        stray = await call(
            mcp, "edit_file", path="app.py", old_string=" def handler_7():", new_string="x"
        )
        assert model_view(stray) == (
            "Error: oldString not found in content. The closest text in app.py is at line 19 "
            "(differs only in whitespace: oldString starts with 1 space, the file has none "
            "before it (leading whitespace)); nothing was changed. The file has there:\n"
            "def handler_7():"
        )
        closest = stray.structured_content["details"]["closest"]  # type: ignore[index]
        assert (closest["line"], closest["text"]) == (19, "def handler_7():")
        assert closest["difference"].startswith("differs only in whitespace")
        typo = model_view(
            await call(
                mcp,
                "edit_file",
                path="app.py",
                old_string="def handler_7():\n    retrun 1",
                new_string="x",
            )
        )
        assert typo.startswith(
            "Error: oldString not found in content. The closest text in app.py is at lines "
            "19-20 (differs: line 2 of oldString is '    retrun 1' where the file has "
            "'    return 1')"
        )
        assert typo.endswith("The file has there:\ndef handler_7():\n    return 1")
    assert await ws.read_text("app.py") == CODE  # shown, never applied


async def test_a_missing_directory_is_one_message(
    gateway: Gateway, sdk: Quill, nats_url: str, tmp_path: Path
) -> None:
    await sdk.workspace("default/default").write("a.txt", "a\n")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("explore_files", {"path": "nope"}),
        ("search_files", {"path": "nope", "pattern": "*"}),
        ("list_directory", {"path": "nope"}),
        ("execute_command", {"command": "true", "workdir": "nope"}),
        ("bash", {"command": "true", "workdir": "nope"}),
    ]
    async with AsyncExitStack() as stack:
        await start_executor(stack, nats_url, tmp_path / "executor", ExecutorConfig())
        async with mcp_client(gateway.url) as mcp:
            for tool, arguments in calls:
                result = await call(mcp, tool, **arguments)
                assert model_view(result) == "Error: Directory not found: nope", tool
                structured = result.structured_content or {}
                assert structured["error"] == "Directory not found: nope", tool
                assert structured["code"] == "FILE_NOT_FOUND", tool
            # grep searches a file or a directory: the same message names neither
            result = await call(mcp, "grep", pattern="a", path="nope")
            assert model_view(result) == "Error: Path not found: nope"
            assert (result.structured_content or {})["error"] == "Path not found: nope"


async def test_a_change_that_changes_nothing_says_so(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("notes.txt", "one\ntwo\n")
    version = (await ws.info()).version
    async with mcp_client(gateway.url) as mcp:
        insert = {"type": "insert", "after_line": 1, "new_content": ""}
        said = await ok(mcp, "modify_file", path="notes.txt", operations=[insert])
        assert said == (
            "No changes: notes.txt is as it was after 1 operation (file version 1); no new "
            "version was made"
        )
        same = await ok(mcp, "write_file", path="notes.txt", content="one\ntwo\n")
        assert same == (
            "No changes: notes.txt already has this content (8 bytes, file version 1); no new "
            "version was made"
        )
        assert (await ws.info()).version == version
        replaced = await ok(mcp, "write_file", path="notes.txt", content="three\n")
        assert replaced == (
            "Successfully wrote 6 bytes to notes.txt, replacing its previous content (8 bytes)"
        )
        new = await ok(mcp, "write_file", path="fresh.txt", content="x")
        assert new == "Successfully wrote 1 bytes to fresh.txt"


async def test_windows_paths_are_refused_at_every_door(
    gateway: Gateway, sdk: Quill, http: httpx.AsyncClient
) -> None:
    async with mcp_client(gateway.url) as mcp:
        wrote = model_view(await call(mcp, "write_file", path="C:\\notes.txt", content="x"))
        assert wrote == (
            "Error: Failed to write file - Invalid path 'C:\\notes.txt': 'C:' is a Windows "
            "drive, not a name: paths are POSIX paths relative to /workspace, with / between "
            "names (e.g. 'notes.txt')"
        )
        read = model_view(await call(mcp, "read_file", path="src\\app.py"))
        assert read.startswith("Error: Invalid path 'src\\app.py': a backslash is not a path")
        assert "write 'src/app.py'" in read
    reply = await http.put("/v1/host/workspace/files/C:%5Cnotes.txt", json={"content": "x"})
    assert reply.status_code == 400, reply.text
    assert "'C:' is a Windows drive" in reply.text
    names = [e.name async for e in sdk.workspace("default/default").list_all()]
    assert not any(":" in n or "\\" in n for n in names), names


async def test_a_long_listing_is_paged(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.apply([rq.PutChange(path=f"many/f{i:04}.txt", content="") for i in range(620)])
    async with mcp_client(gateway.url) as mcp:
        first = await ok(mcp, "list_directory", path="many")
        assert_names_missing(first, "500 of the 620 entries", way_on='after="f:many/f0499.txt"')
        second = await ok(mcp, "list_directory", path="many", after="f:many/f0499.txt")
        assert second.startswith("Contents of many:\n\n[FILE] f0500.txt\n")
        assert "more follow" not in second and second.endswith("[FILE] f0619.txt")
        past = await ok(mcp, "list_directory", path="many", after="f:many/f0619.txt")
        assert past == "No more entries in many after 'f:many/f0619.txt' (the directory has 620)"


async def test_optional_parameters_are_plain(gateway: Gateway, sdk: Quill) -> None:
    await sdk.workspace("default/default").write("a.txt", "a\nb\n")
    for endpoint in ("/mcp", "/mcp/wap"):
        async with mcp_client(gateway.url, endpoint) as mcp:
            for tool in (await mcp.list_tools()).tools:
                schema = tool.input_schema
                for name, prop in schema["properties"].items():
                    where = f"{endpoint} {tool.name}.{name}"
                    assert {"type": "null"} not in prop.get("anyOf", []), where
                    assert prop.get("type") != "null" and prop.get("default", 0) is not None, where
    async with mcp_client(gateway.url) as mcp:
        listed = {t.name: t.input_schema for t in (await mcp.list_tools()).tools}
        assert listed["grep"]["properties"]["max_results"]["type"] == "integer"
        assert listed["explore_files"]["properties"]["exclude"]["type"] == "array"
        assert "max_results" not in listed["grep"]["required"]
        # a client that still sends null for an optional parameter: taken as not given
        nulls = await call(mcp, "grep", pattern="a", max_results=None, workspace=None)
        assert model_view(nulls).startswith("Found 1 match for 'a'")
        # null where the parameter has a value of its own: refused, saying which and why
        refused = await call(mcp, "search_files", path=".", pattern="*", max_results=None)
        assert model_view(refused).startswith(
            "Error: Search failed - Invalid arguments: max_results: Input should be a valid integer"
        )


async def test_the_edit_errors_in_the_agents_page_are_what_a_model_reads(
    gateway: Gateway, ws: Workspace
) -> None:
    """docs/agents.md "### Edit errors": each ``edit_file(...)`` shown on ``CODE`` gives that
    text, and changes nothing."""
    calls = agents_page_calls("Edit errors", "edit_file")
    assert len(calls) == 4
    async with mcp_client(gateway.url) as mcp:
        for _, arguments, expected in calls:
            assert model_view(await call(mcp, "edit_file", **arguments)) == expected.strip("\n")
    assert await ws.read_text("app.py") == CODE
