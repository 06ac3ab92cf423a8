"""MCP at /mcp as the workspace tool (seed 000): its curl session, tools, formats and errors."""

from __future__ import annotations

import re

import httpx
import msgspec

from quill.client import Quill
from services.gateway.server import Gateway
from tests.gateway.support import call, error, mcp_client, ok

CURL = {"User-Agent": "curl/8.5.0", "Accept": "*/*", "Content-Type": "application/json"}
SEED_SESSION = [
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05",'
    b'"capabilities":{},"clientInfo":{"name":"test","version":"1.0"}}}',
    b'{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}',
    b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read_file",'
    b'"arguments":{"path":"README.md"}}}',
    b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"list_directory",'
    b'"arguments":{"path":"."}}}',
]
SEED_PARAMETERS = {
    "read_file": ({"path"}, {"head", "tail", "offset", "limit", "line_numbers", "char_offset"}),
    "write_file": ({"path", "content"}, set()),
    "list_directory": ({"path"}, {"after"}),
    "create_directory": ({"path"}, set()),
    "get_file_info": ({"path"}, set()),
    "search_files": ({"path", "pattern"}, {"max_results", "exclude"}),
}
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


async def test_seed_curl_session_gets_json_answers(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("README.md", "# Team notes\n")
    await ws.mkdir("docs")
    async with httpx.AsyncClient() as curl:
        replies = []
        for body in SEED_SESSION:  # exactly the seed's requests: no session id, Accept */*
            reply = await curl.post(gateway.url + "/mcp", content=body, headers=CURL)
            assert reply.status_code == 200, reply.text  # no redirect, no 406
            assert reply.headers["content-type"].startswith("application/json")
            replies.append(reply.json())
    init, listed, read, listing = replies
    assert [r["id"] for r in replies] == [1, 2, 3, 4]
    assert init["result"]["protocolVersion"] == "2024-11-05"
    assert "tools" in init["result"]["capabilities"]
    tools = {t["name"]: t for t in listed["result"]["tools"]}
    for name, (required, optional) in SEED_PARAMETERS.items():
        schema = tools[name]["inputSchema"]
        assert set(schema["required"]) == required, name
        assert set(schema["properties"]) == required | optional | {"workspace"}, name
        assert tools[name]["description"]
    assert read["result"]["content"] == [{"type": "text", "text": "# Team notes\n"}]
    assert read["result"]["isError"] is False
    assert read["result"]["structuredContent"]["etag"] == "v1"
    assert (
        listing["result"]["content"][0]["text"] == "Contents of .:\n\n[DIR] docs\n[FILE] README.md"
    )


async def test_read_file_whole_head_tail_and_errors(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("logs/app.log", "".join(f"line {i}\n" for i in range(1, 11)))
    await ws.write("blob.bin", b"\x00\xff\xfe")
    await ws.write("long.txt", "x\n" * 2500)
    async with mcp_client(gateway.url) as mcp:
        assert await ok(mcp, "read_file", path="logs/app.log", head=2) == "line 1\nline 2\n"
        assert await ok(mcp, "read_file", path="/workspace/logs/app.log", tail=1) == "line 10\n"
        cut = await ok(mcp, "read_file", path="long.txt")
        assert cut.endswith(
            "[truncated: 2000 of 2500 lines shown, the file has 5000 bytes; showing lines "
            "1-2000 (a read returns at most 2000 lines). Not shown: lines 2001-2500; to read "
            "them, call read_file again with offset=2001 limit=500]"
        )
        assert await error(mcp, "read_file", path="nope.txt") == "Error: File not found: nope.txt"
        assert await error(mcp, "read_file", path="logs") == "Error: Not a file: logs"
        invalid = "Error: File contains invalid UTF-8 encoding"
        assert await error(mcp, "read_file", path="blob.bin") == invalid
        denied = "Error: Access denied. Path must be within /workspace"
        assert await error(mcp, "read_file", path="../etc/passwd") == denied
        assert await error(mcp, "read_file", path="/etc/passwd") == denied
        result = await call(mcp, "read_file", path="logs/app.log")
        sdk_view = msgspec.to_builtins(await ws.read("logs/app.log"))
        assert result.structured_content == sdk_view


async def test_write_file_reports_bytes_and_fails_as_the_seed_says(
    gateway: Gateway, sdk: Quill
) -> None:
    async with mcp_client(gateway.url) as mcp:
        said = await ok(mcp, "write_file", path="data/metrics.json", content='{"count": 42}')
        assert said == "Successfully wrote 13 bytes to data/metrics.json"
        assert await ok(mcp, "write_file", path="empty.txt", content="") == (
            "Successfully wrote 0 bytes to empty.txt"
        )
        assert await ok(mcp, "write_file", path="data/metrics.json", content="{}") == (
            "Successfully wrote 2 bytes to data/metrics.json, replacing its previous content "
            "(13 bytes)"  # replaced, not appended
        )
        for path, refused in (
            (
                "empty.txt/inner.txt",
                "Failed to create parent directory - Not a directory: empty.txt",
            ),
            ("data", "Failed to write file - Not a file: data"),
            ("../x.txt", "Access denied. Path must be within /workspace"),
        ):
            assert await error(mcp, "write_file", path=path, content="x") == f"Error: {refused}"
        missing = await error(mcp, "write_file")  # no arguments: a tool error, not a failure
        assert missing == (
            "Error: Failed to write file - Invalid arguments: "
            "path: Field required; content: Field required"
        )
        wrong = await error(mcp, "read_file", path="a.txt", head="ten")
        assert wrong.startswith("Error: Invalid arguments: head: Input should be a valid integer")
    assert await sdk.workspace("default/default").read_text("data/metrics.json") == "{}"


async def test_list_directory_formats(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    for path in ("data/reports/summary.txt", "data/reports/README.md"):
        await ws.write(path, "x")
    await ws.mkdir("data/reports/2025-10")
    await ws.mkdir("data/reports/2025-11")
    await ws.mkdir("empty")
    async with mcp_client(gateway.url) as mcp:
        assert await ok(mcp, "list_directory", path="data/reports") == (
            "Contents of data/reports:\n\n"
            "[DIR] 2025-10\n[DIR] 2025-11\n[FILE] README.md\n[FILE] summary.txt"
        )
        assert await ok(mcp, "list_directory", path="empty") == "Directory is empty: empty"
        assert await error(mcp, "list_directory", path="nope") == "Error: Directory not found: nope"
        not_dir = await error(mcp, "list_directory", path="data/reports/README.md")
        assert not_dir == "Error: Not a directory: data/reports/README.md"
        denied = await error(mcp, "list_directory", path="..")
        assert denied == "Error: Access denied. Path must be within /workspace"


async def test_create_directory_is_idempotent_and_refuses_files(
    gateway: Gateway, sdk: Quill
) -> None:
    await sdk.workspace("default/default").write("notes.txt", "x")
    async with mcp_client(gateway.url) as mcp:
        made = await ok(mcp, "create_directory", path="data/reports/2025-11")
        assert made == "Successfully created directory: data/reports/2025-11"
        again = await ok(mcp, "create_directory", path="data/reports/2025-11")
        assert again == "Directory exists: data/reports/2025-11"
        blocked = await error(mcp, "create_directory", path="notes.txt")
        assert blocked == "Error: Path exists but is not a directory: notes.txt"
    listing = await sdk.workspace("default/default").list("data/reports")
    assert [e.name for e in listing.entries] == ["2025-11"]


async def test_get_file_info_blocks(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("data/metrics.json", "x" * 1260)
    await ws.write("data/other.txt", "y")
    async with mcp_client(gateway.url) as mcp:
        info = (await ok(mcp, "get_file_info", path="data/metrics.json")).splitlines()
        assert info[:6] == [
            "Path: data/metrics.json",
            "Type: file",
            "Size: 1.23 KB",
            "Permissions: 644",
            "Owner UID: 1000",
            "Owner GID: 1000",
        ]
        assert [re.sub(STAMP, "<t>", line) for line in info[6:]] == [
            "Created: <t>",
            "Modified: <t>",
            "Accessed: <t>",
        ]
        block = (await ok(mcp, "get_file_info", path="data")).splitlines()
        assert block[:2] == ["Path: data", "Type: directory"]
        assert "Size" not in "".join(block) and block[2] == "Permissions: 755"
        assert block[-1] == "Entries: 2"
        assert await error(mcp, "get_file_info", path="ghost") == "Error: Path not found: ghost"


async def test_search_files_formats(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    for path in ("data/metrics.json", "config/settings.json", "notes.txt"):
        await ws.write(path, "{}")
    await ws.mkdir("app/config")
    async with mcp_client(gateway.url) as mcp:
        found = (await ok(mcp, "search_files", path=".", pattern="**/*.json")).splitlines()
        assert found[:2] == ["Found 2 match(es) for '**/*.json':", ""]
        assert sorted(found[2:]) == ["[FILE] config/settings.json", "[FILE] data/metrics.json"]
        dirs = await ok(mcp, "search_files", path=".", pattern="**/config")
        assert sorted(dirs.splitlines()[2:]) == ["[DIR] app/config", "[DIR] config"]
        one = await ok(mcp, "search_files", path=".", pattern="**/*.json", max_results=1)
        assert one.startswith("Found 2 match(es)") and "(showing 1 of 2" in one
        none = await ok(mcp, "search_files", path="data", pattern="*.log")
        assert none == "No matches found for pattern '*.log' in data"
        missing = await error(mcp, "search_files", path="logs", pattern="*.log")
        assert missing == "Error: Directory not found: logs"
        not_dir = await error(mcp, "search_files", path="notes.txt", pattern="*")
        assert not_dir == "Error: Not a directory: notes.txt"
