"""The reference filesystem server's tools at /mcp (read_multiple_files, read_media_file,
directory_tree, list_directory_with_sizes, edit_file's edits and dry run, search_files'
exclude), used as a model and a hostile client would; and errors across every tool that takes a
workspace, with a pinned token."""

from __future__ import annotations

import base64
import json

import pytest
from mcp.types import AudioContent, ImageContent

from quill.client import Quill
from services.gateway.mcp import endpoints
from services.gateway.mcp import reference as mcp_reference
from services.gateway.server import Gateway
from tests.gateway.conftest import StartGateway
from tests.gateway.support import call, error, mcp_client, model_view, ok

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082"
)


async def test_read_multiple_files_reads_each_and_says_why_not(
    gateway: Gateway, sdk: Quill
) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("a.txt", "alpha\n")
    await ws.write("b/c.md", "gamma\n")
    await ws.write("blob.bin", b"\x00\xff")
    async with mcp_client(gateway.url) as mcp:
        paths = ["a.txt", "/workspace/b/c.md", "nope.txt", "blob.bin", "b", "../etc/passwd"]
        result = await call(mcp, "read_multiple_files", paths=paths)
        assert not result.is_error
        assert model_view(result) == (
            "a.txt:\nalpha\n\n---\n/workspace/b/c.md:\ngamma\n\n---\n"
            "nope.txt: Error - File not found: nope.txt\n---\n"
            "blob.bin: Error - File contains invalid UTF-8 encoding\n---\n"
            "b: Error - Not a file: b\n---\n"
            "../etc/passwd: Error - Access denied. Path must be within /workspace"
        )
        files = result.structured_content["files"]  # type: ignore[index]
        assert [f.get("code") for f in files] == [
            None,
            None,
            "FILE_NOT_FOUND",
            "INVALID_ENCODING",
            "NOT_A_FILE",
            "ACCESS_DENIED",
        ]
        too_many = await error(mcp, "read_multiple_files", paths=["a.txt"] * 51)
        assert too_many.startswith("Error: Invalid arguments: paths")
        assert (await error(mcp, "read_multiple_files", paths=[])).startswith("Error: Invalid")


async def test_read_media_file_answers_image_content(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("pics/dot.png", PNG)
    await ws.write("sound.wav", b"RIFF\x00\x00\x00\x00WAVE")
    await ws.write("notes.txt", "text\n")
    async with mcp_client(gateway.url) as mcp:
        image = await call(mcp, "read_media_file", path="pics/dot.png")
        assert not image.is_error and len(image.content) == 1
        block = image.content[0]
        assert isinstance(block, ImageContent) and block.mime_type == "image/png"
        assert base64.b64decode(block.data) == PNG
        assert image.structured_content == {
            "path": "pics/dot.png",
            "mime_type": "image/png",
            "size": len(PNG),
            "etag": "v1",
        }
        audio = await call(mcp, "read_media_file", path="sound.wav")
        assert isinstance(audio.content[0], AudioContent)
        assert audio.content[0].mime_type.startswith("audio/")
        text = await error(mcp, "read_media_file", path="notes.txt")
        assert (
            text
            == "Error: Not an image or audio file: notes.txt (text/plain); read_file reads text"
        )
        assert await error(mcp, "read_media_file", path="pics") == "Error: Not a file: pics"
        assert await error(mcp, "read_media_file", path="../x.png") == (
            "Error: Access denied. Path must be within /workspace"
        )


async def test_read_media_file_refuses_a_file_over_its_limit(
    gateway: Gateway, sdk: Quill, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("big.png", PNG * 100)
    monkeypatch.setattr(mcp_reference, "MAX_MEDIA_BYTES", 1000)  # the gateway is in-process
    async with mcp_client(gateway.url) as mcp:
        result = await call(mcp, "read_media_file", path="big.png")
    assert result.is_error and result.structured_content["code"] == "SIZE_LIMIT_EXCEEDED"  # type: ignore[index]
    assert "read_media_file returns at most 1000" in model_view(result)


async def test_directory_tree_is_nested_json_and_bounded(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("src/app.py", "x")
    await ws.write("src/lib/util.py", "y")
    await ws.write("README.md", "r")
    await ws.write("node_modules/x/index.js", "n")
    async with mcp_client(gateway.url) as mcp:
        tree = json.loads(await ok(mcp, "directory_tree"))
        assert tree == [
            {
                "name": "src",
                "type": "directory",
                "children": [
                    {
                        "name": "lib",
                        "type": "directory",
                        "children": [{"name": "util.py", "type": "file"}],
                    },
                    {"name": "app.py", "type": "file"},
                ],
            },
            {"name": "README.md", "type": "file"},
        ]
        shallow = json.loads(await ok(mcp, "directory_tree", path="src", max_depth=1))
        assert shallow == [
            {"name": "lib", "type": "directory", "children": []},
            {"name": "app.py", "type": "file"},
        ]
        assert await error(mcp, "directory_tree", path="nope") == "Error: Directory not found: nope"
        too_deep = await error(mcp, "directory_tree", max_depth=1000)
        assert too_deep.startswith("Error: Invalid arguments: max_depth")


async def test_list_directory_with_sizes(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("small.txt", "x")
    await ws.write("big.txt", "x" * 2048)
    await ws.mkdir("sub")
    async with mcp_client(gateway.url) as mcp:
        by_size = await ok(mcp, "list_directory_with_sizes", sort_by="size")
        assert by_size == (
            "[FILE] big.txt       2.00 KB\n"
            "[FILE] small.txt         1 B\n"
            "[DIR]  sub\n"
            "\nTotal: 2 files, 1 directory\nCombined size: 2.00 KB"
        )
        by_name = await ok(mcp, "list_directory_with_sizes")
        assert by_name.splitlines()[0] == "[FILE] big.txt       2.00 KB"
        assert by_name.splitlines()[2] == "[DIR]  sub"
        empty = await ok(mcp, "list_directory_with_sizes", path="sub")
        assert empty == "Directory is empty: sub"
        bad = await error(mcp, "list_directory_with_sizes", sort_by="mtime")
        assert bad.startswith("Error: Invalid arguments: sort_by")


async def test_edit_file_with_several_edits_is_all_or_nothing(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("app.py", "a = 1\nb = 2\nc = 3\n")
    before = (await ws.info()).version
    async with mcp_client(gateway.url) as mcp:
        edits = [
            {"old_string": "a = 1", "new_string": "a = 10"},
            {"old_string": "c = 3", "new_string": "c = 30"},
        ]
        dry = await ok(mcp, "edit_file", path="app.py", edits=edits, dry_run=True)
        assert dry == (
            "Dry run: 2 edits, 2 replacements would change app.py as follows (nothing "
            "written):\n--- a/app.py\n+++ b/app.py\n@@ -1,3 +1,3 @@\n-a = 1\n+a = 10\n b = 2\n"
            "-c = 3\n+c = 30\n"
        )
        assert (await ws.info()).version == before  # a dry run changes nothing
        # the second edit fails: the first is not applied either
        failing = [*edits[:1], {"old_string": "zzz", "new_string": "y"}]
        refused = await error(mcp, "edit_file", path="app.py", edits=failing)
        assert refused.startswith("Error: Edit 2 of 2: oldString not found in content.")
        assert await ws.read_text("app.py") == "a = 1\nb = 2\nc = 3\n"
        done = await call(mcp, "edit_file", path="app.py", edits=edits)
        assert model_view(done).startswith(
            "Edited app.py: 2 edits, 2 replacements (file version 2):"
        )
        assert done.structured_content["committed"] is True  # type: ignore[index]
        assert (await ws.info()).version == before + 1  # one event for all the edits
        assert await ws.read_text("app.py") == "a = 10\nb = 2\nc = 30\n"
        # later edits see the earlier ones' result; an ambiguous one names its lines
        chained = [
            {"old_string": "b = 2", "new_string": "x = 0"},
            {"old_string": "x = 0", "new_string": "x = 1"},
        ]
        await ok(mcp, "edit_file", path="app.py", edits=chained)
        assert await ws.read_text("app.py") == "a = 10\nx = 1\nc = 30\n"
        ambiguous = [{"old_string": "0", "new_string": "9"}]
        said = await error(mcp, "edit_file", path="app.py", edits=ambiguous)
        assert said.startswith("Error: Found multiple matches for oldString")
        # both ways at once, neither, half of one, an item without its strings: refused
        both = await error(
            mcp, "edit_file", path="app.py", old_string="a", new_string="b", edits=chained
        )
        assert both == "Error: Give old_string and new_string, or edits (not both)"
        assert await error(mcp, "edit_file", path="app.py") == both
        assert await error(mcp, "edit_file", path="app.py", old_string="a") == both
        broken = await error(mcp, "edit_file", path="app.py", edits=[{"new_string": "x"}])
        assert broken == "Error: old_string and new_string are required"
        junk = await error(mcp, "edit_file", path="app.py", edits=["x"])
        assert junk.startswith("Error: Invalid arguments: edits")
        same = await error(
            mcp, "edit_file", path="app.py", edits=[{"old_string": "a", "new_string": "a"}]
        )
        assert same == "Error: oldString and newString must be different"
        # a single edit without dry_run is the edit it always was
        one = await ok(mcp, "edit_file", path="app.py", old_string="a = 10", new_string="a = 1")
        assert one == "Edited app.py: 1 replacement, 1 line changed (file version 4)"
        await ws.write("blob.bin", b"\x00\xff")
        binary = await error(mcp, "edit_file", path="blob.bin", edits=edits, dry_run=True)
        assert binary == "Error: File contains invalid UTF-8 encoding"


async def test_search_files_excludes_more_and_keeps_the_defaults(
    gateway: Gateway, sdk: Quill
) -> None:
    ws = sdk.workspace("default/default")
    for path in ("a.log", "keep.txt", "node_modules/x.txt", "tmp/skip.txt"):
        await ws.write(path, "x")
    async with mcp_client(gateway.url) as mcp:
        found = await ok(mcp, "search_files", path=".", pattern="**/*.txt", exclude=["tmp"])
        assert "[FILE] keep.txt" in found and "skip" not in found and "node_modules" not in found


WORKSPACE_TOOLS = {
    name: args
    for name, args in {
        "read_file": {"path": "a.txt"},
        "write_file": {"path": "a.txt", "content": "x"},
        "list_directory": {"path": "."},
        "create_directory": {"path": "d"},
        "get_file_info": {"path": "a.txt"},
        "search_files": {"path": ".", "pattern": "*"},
        "edit_file": {"path": "a.txt", "old_string": "a", "new_string": "b"},
        "modify_file": {
            "path": "a.txt",
            "operations": [{"type": "delete", "start_line": 1, "end_line": 1}],
        },
        "grep": {"pattern": "a"},
        "explore_files": {},
        "delete_file": {"path": "a.txt"},
        "move_file": {"source": "a.txt", "destination": "b.txt"},
        "file_history": {},
        "diff": {"from_version": 1},
        "restore": {"version": 1},
        "get_workspace_info": {},
        "execute_command": {"command": "true"},
        "bash": {"command": "true"},
        "read_command_output": {"command_id": "x"},
        "write_stdin": {"command_id": "c0123456789abXY", "data": "x"},
        "send_signal": {"command_id": "c0123456789abXY"},
        "list_commands": {},
        "git": {"action": "status"},
        "read_multiple_files": {"paths": ["a.txt"]},
        "read_media_file": {"path": "a.png"},
        "directory_tree": {},
        "list_directory_with_sizes": {},
        "list_workspaces": {},
        "attach_workspace": {"uri": "server:/acme/other"},
        "detach_workspace": {"uri": "server:/acme/other"},
        "archive_workspace": {},
        "fork_workspace": {"name": "stolen"},
        "merge_workspace": {"from": "mine"},
        "wait_for_approval": {"approval_id": "req-1:approval", "timeout_ms": 0},
    }.items()
}


async def test_a_pinned_token_naming_another_workspace_learns_nothing(
    start: StartGateway,
) -> None:
    guarded = await start({"token-acme-mine": "acme/mine"}, operator_tools=("archive_workspace",))
    other = guarded.quill.workspace("acme/elsewhere")
    await other.create()
    await other.write("a.txt", "secret")
    takes = {t.name for t in endpoints.MCP_TOOLS if any(a.name == "workspace" for a in t.args)}
    assert takes == set(WORKSPACE_TOOLS)  # every tool that takes a workspace is tried
    async with mcp_client(guarded.url, token="token-acme-mine") as mcp:
        for tool, args in WORKSPACE_TOOLS.items():
            answers = []
            for name in ("elsewhere", "ghost"):  # one exists, one does not: the same answer
                result = await call(mcp, tool, **args, workspace=name)
                data = result.structured_content
                assert result.is_error and isinstance(data, dict), tool
                assert model_view(result) == f"Error: {data['error']}", tool  # the same words
                if tool in ("attach_workspace", "archive_workspace", "fork_workspace"):
                    # a pinned token may not (merge_workspace: its target is not reached)
                    assert data["code"] == "ACCESS_DENIED", data
                else:
                    assert data == {
                        "error": f"Workspace not found: {name}",
                        "code": "WORKSPACE_NOT_FOUND",
                        "details": {"workspace": name},
                    }, tool
                answers.append(model_view(result).replace(name, "<name>"))
            assert answers[0] == answers[1], tool
    assert await other.read_text("a.txt") == "secret"
