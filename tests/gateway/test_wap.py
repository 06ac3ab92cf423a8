"""MCP at /mcp/wap: WAP's camelCase tools, JSON responses and error format."""

from __future__ import annotations

from quill.client import Quill
from services.gateway.server import Gateway
from tests.gateway.support import mcp_client, wap

WAP_TOOLS = {
    "exploreFiles",
    "readFile",
    "writeFile",
    "modifyFile",
    "searchFiles",
    "getWorkspaceInfo",
    "executeCommand",
}


async def test_wap_offers_the_camel_case_tools(gateway: Gateway) -> None:
    async with mcp_client(gateway.url, "/mcp/wap") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == WAP_TOOLS
    assert set(tools["executeCommand"].input_schema["properties"]) == {
        "command",
        "workingDirectory",
        "timeout",
        "environment",
        "workspace",
    }
    assert set(tools["readFile"].input_schema["properties"]) == {
        "path",
        "startLine",
        "endLine",
        "workspace",
    }
    assert set(tools["writeFile"].input_schema["required"]) == {"path", "content"}
    ops = tools["modifyFile"].input_schema["properties"]["operations"]["items"]["oneOf"]
    assert [op["properties"]["type"]["const"] for op in ops] == [
        "replace",
        "insert",
        "delete",
        "regexReplace",
    ]


async def test_wap_write_read_modify(gateway: Gateway, sdk: Quill) -> None:
    async with mcp_client(gateway.url, "/mcp/wap") as client:
        failed, written = await wap(
            client, "writeFile", path="src/app.js", content="a\nb\nc\n", createDirectories=True
        )
        assert (failed, written) == (
            False,
            {"success": True, "path": "src/app.js", "bytesWritten": 6},
        )
        failed, appended = await wap(
            client, "writeFile", path="src/app.js", content="d\n", mode="append"
        )
        assert appended["bytesWritten"] == 2
        failed, part = await wap(client, "readFile", path="src/app.js", startLine=2, endLine=3)
        assert not failed
        assert part["content"] == "b\nc\n"
        assert (part["totalLines"], part["returnedLines"], part["isTruncated"]) == (4, 2, False)
        assert part["metadata"]["path"] == "/workspace/src/app.js"
        assert part["metadata"]["size"] == 8 and part["metadata"]["isDirectory"] is False
        assert part["metadata"]["lastModified"].endswith("Z")
        operations = [
            {"type": "replace", "startLine": 1, "endLine": 1, "newContent": "A"},
            {"type": "insert", "afterLine": 4, "newContent": "e"},
            {"type": "regexReplace", "pattern": "^b$", "replacement": "B", "flags": "m"},
        ]
        failed, modified = await wap(client, "modifyFile", path="src/app.js", operations=operations)
        assert (failed, modified) == (False, {"success": True, "path": "src/app.js"})
        failed, refused = await wap(
            client, "writeFile", path="src/app.js", content="x", mode="create"
        )
        assert failed and refused["code"] == "ALREADY_EXISTS"
    assert await sdk.workspace("default/default").read_text("src/app.js") == "A\nB\nc\nd\ne\n"


async def test_wap_explore_and_search(gateway: Gateway, sdk: Quill) -> None:
    ws = sdk.workspace("default/default")
    await ws.write("src/api/client.js", "api.get(1)\n// TODO: retry\n")
    await ws.write("src/main.js", "// TODO: start\n")
    await ws.write("node_modules/lib/index.js", "// TODO: not ours\n")
    async with mcp_client(gateway.url, "/mcp/wap") as client:
        _, top = await wap(client, "exploreFiles", path=".")
        assert top == {
            "files": [{"path": "src", "isDirectory": True}],
            "isTruncated": False,
            "totalFound": 1,
        }
        _, deep = await wap(client, "exploreFiles", path="src", recursive=True, returnMetadata=True)
        assert [f["path"] for f in deep["files"]] == ["src/api", "src/api/client.js", "src/main.js"]
        meta = deep["files"][1]["metadata"]
        assert meta["path"] == "/workspace/src/api/client.js" and meta["size"] == 26
        _, found = await wap(
            client, "searchFiles", paths=["src"], query="TODO:", type="literal", contextLines=1
        )
        assert found["totalMatches"] == 2 and found["isTruncated"] is False
        hit = next(m for m in found["matches"] if m["path"] == "src/api/client.js")
        assert hit == {
            "path": "src/api/client.js",
            "line": 2,
            "matchText": "// TODO: retry",
            "contextBefore": ["api.get(1)"],
            "contextAfter": [],
        }
        _, shallow = await wap(
            client, "searchFiles", paths=["src"], query="TODO", type="regex", recursive=False
        )
        assert [m["path"] for m in shallow["matches"]] == ["src/main.js"]
        _, info = await wap(client, "getWorkspaceInfo")
        assert info["root"] == "/workspace"
        assert "**/node_modules/**" in info["defaultExclusions"]
        assert info["limits"] == {
            "maxFileSize": 4194304,
            "maxDirectoryEntries": 500,
            "maxSearchResults": 100,
            "maxOutputSize": 51200,
        }


async def test_wap_errors_are_error_code_details(gateway: Gateway) -> None:
    async with mcp_client(gateway.url, "/mcp/wap") as client:
        failed, missing = await wap(client, "readFile", path="ghost.txt")
        assert failed
        assert missing == {
            "error": "File not found: ghost.txt",
            "code": "FILE_NOT_FOUND",
            "details": {"path": "ghost.txt"},
        }
        failed, escape = await wap(client, "readFile", path="../../etc/passwd")
        assert failed and escape["code"] == "PERMISSION_DENIED"
        assert escape["error"] == "Access denied. Path must be within /workspace"
        failed, bad = await wap(
            client, "modifyFile", path="x.txt", operations=[{"type": "replace", "startLine": 1}]
        )
        assert failed and bad["code"] == "INVALID_ARGUMENT"
        failed, empty = await wap(client, "readFile")
        assert (failed, empty) == (
            True,
            {
                "error": "Invalid arguments: path: Field required",
                "code": "INVALID_ARGUMENT",
                "details": {},
            },
        )
