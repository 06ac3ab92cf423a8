"""MCP at /mcp: Quill's tools beyond the workspace tool's six, over real HTTP."""

from __future__ import annotations

import msgspec

from quill.client import Quill
from services.gateway.mcp import quill_tools
from services.gateway.server import Gateway
from tests.gateway.support import call, error, mcp_client, ok, text

QUILL_TOOLS = {
    "edit_file",
    "modify_file",
    "grep",
    "explore_files",
    "delete_file",
    "move_file",
    "file_history",
    "diff",
    "restore",
    "get_workspace_info",
    "execute_command",
    "bash",
    "git",
}


async def test_every_tool_is_described_for_a_model(gateway: Gateway) -> None:
    async with mcp_client(gateway.url) as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
    assert QUILL_TOOLS <= set(tools)
    for tool in tools.values():
        if tool.name == "bash":  # an alias: says so, and that is all
            assert tool.description == quill_tools.ALIAS
            continue
        assert tool.description and len(tool.description) > 60, tool.name
        assert "workspace" in tool.input_schema["properties"], tool.name
    ops = tools["modify_file"].input_schema["properties"]["operations"]
    kinds = {item["properties"]["type"]["enum"][0] for item in ops["items"]["anyOf"]}
    assert kinds == {"replace", "insert", "delete", "regex_replace"}


async def test_edit_file_replaces_exact_text(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("app.py", "a = 1\nb = 1\nprint(a)\n")
    async with mcp_client(gateway.url) as mcp:
        said = await ok(mcp, "edit_file", path="app.py", old_string="a = 1", new_string="a = 2")
        assert said == "Edited app.py: 1 replacement, 1 line changed (file version 2)"
        missing = await error(mcp, "edit_file", path="app.py", old_string="zzz", new_string="y")
        assert missing.startswith("Error: oldString not found in content")
        twice = await error(mcp, "edit_file", path="app.py", old_string="= ", new_string="=")
        assert twice.startswith("Error: Found multiple matches for oldString")
        every = await call(
            mcp, "edit_file", path="app.py", old_string="= ", new_string="=", replace_all=True
        )
        assert every.structured_content is not None
        assert every.structured_content["replacements"] == 2
        ghost = await error(mcp, "edit_file", path="nope.py", old_string="a", new_string="b")
        assert ghost == "Error: File not found: nope.py"
    assert await ws.read_text("app.py") == "a =2\nb =1\nprint(a)\n"


async def test_modify_file_applies_line_and_regex_operations(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("list.txt", "one\ntwo\nthree\nfour\n")
    operations = [
        {"type": "replace", "start_line": 1, "end_line": 1, "new_content": "ONE"},
        {"type": "delete", "start_line": 3, "end_line": 3},
        {"type": "insert", "after_line": 4, "new_content": "five"},
        {"type": "regex_replace", "pattern": "(t)wo", "replacement": "$1WO", "flags": "g"},
    ]
    async with mcp_client(gateway.url) as mcp:
        said = await ok(mcp, "modify_file", path="list.txt", operations=operations)
        assert said == (
            "Modified list.txt: 4 operations, 1 regex replacement, 4 -> 4 lines (file version 2)"
        )
        bad = await error(
            mcp, "modify_file", path="list.txt", operations=[{"type": "explode", "line": 1}]
        )
        assert bad.startswith("Error: Invalid operations:")
    assert await ws.read_text("list.txt") == "ONE\ntWO\nfour\nfive\n"


async def test_grep_and_explore_files(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("src/app.py", "import os\n# TODO: tidy\nprint(os.name)\n")
    await ws.write("src/util/io.py", "# TODO: more\n")
    await ws.write("node_modules/x/index.js", "// TODO: ignored\n")
    async with mcp_client(gateway.url) as mcp:
        found = await ok(mcp, "grep", pattern="TODO", path="src", literal=True)
        assert found.splitlines()[0] == "Found 2 matches for 'TODO' in 2 files:"
        assert sorted(found.splitlines()[2:]) == [
            "src/app.py:2: # TODO: tidy",
            "src/util/io.py:1: # TODO: more",
        ]
        context = await ok(mcp, "grep", pattern="TODO: t", path="src", context_lines=1)
        assert "src/app.py-1- import os\nsrc/app.py:2: # TODO: tidy\nsrc/app.py-3- print" in context
        assert await ok(mcp, "grep", pattern="nothing here") == (
            "No matches found for 'nothing here' in ."
        )
        tree = await ok(mcp, "explore_files", path=".", recursive=True)
        assert tree.splitlines() == [
            "Contents of . (4 entries):",
            "",
            "[DIR] src",
            "  [DIR] src/util",
            "    [FILE] src/util/io.py",
            "  [FILE] src/app.py",
        ]
        sized = await ok(mcp, "explore_files", path="src", metadata=True)
        assert "[FILE] src/app.py (38 B, " in sized
        missing = await error(mcp, "explore_files", path="nope")
        assert missing == "Error: Directory not found: nope"


async def test_delete_move_history_diff_restore(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("notes/todo.md", "- ship\n")
    first = ws.last_version
    await ws.write("notes/todo.md", "- ship\n- test\n")
    async with mcp_client(gateway.url) as mcp:
        moved = await ok(mcp, "move_file", source="notes/todo.md", destination="done/todo.md")
        assert moved == "Moved notes/todo.md to done/todo.md (1 entry)"
        history = (await ok(mcp, "file_history", path="notes/todo.md")).splitlines()
        assert history[0] == "History of notes/todo.md (newest first):"
        assert [line.split()[5] for line in history[2:]] == ["deleted", "modified", "created"]
        changes = await ok(mcp, "diff", from_version=first, path="notes")
        assert changes == (
            f"Diff of notes from version {first} to {first + 2} (1 file changed):\n\n"
            "--- a/notes/todo.md\n+++ /dev/null\n@@ -1 +0,0 @@\n-- ship\n"
        )
        deleted = await ok(mcp, "delete_file", path="done", recursive=True)
        assert deleted == "Deleted done (2 entries removed)"
        gone = await error(mcp, "delete_file", path="done")
        assert gone == "Error: Path not found: done"
        restored = await ok(mcp, "restore", version=first, path="notes/todo.md")
        assert restored == f"Restored notes/todo.md to version {first}: 1 path changed"
        same = await ok(mcp, "restore", version=first, path="notes/todo.md")
        assert same.startswith("Nothing to restore")
        workspace_log = await ok(mcp, "file_history")
        assert workspace_log.startswith("History of the workspace (newest first):")
    assert await ws.read_text("notes/todo.md") == "- ship\n"


async def test_get_workspace_info(gateway: Gateway, sdk: Quill) -> None:
    await sdk.workspace("default/default").write("a.txt", "hello")
    async with mcp_client(gateway.url) as mcp:
        result = await call(mcp, "get_workspace_info")
    info = text(result).splitlines()
    assert info[0] == "Workspace: default (tenant default)"
    assert "Root: /workspace" in info and "Files: 1, directories: 0, total size: 5 B" in info
    assert any(line.startswith("Limits: files up to 4.00 MB, 100000 files") for line in info)
    expected = msgspec.to_builtins(await sdk.workspace("default/default").info())
    assert result.structured_content is not None
    assert result.structured_content["limits"] == expected["limits"]
