"""MCP at ``/mcp/wap``: the Workspace Agent Protocol's camelCase tools and JSON responses.

Each tool answers WAP's response object, JSON-encoded as its text and as ``structuredContent``;
a failure answers WAP's ``{"error", "code", "details"}`` the same way, with ``isError: true``.
``executeCommand`` is not offered (Quill has no executor yet).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult
from pydantic import Field, WithJsonSchema

from contracts.errors import ErrorCode, QuillError
from contracts.paths import ROOT_DIR, normalize, parent
from contracts.requests import ModifyOperation
from quill.client import Workspace
from services.gateway import VERSION, texts
from services.gateway.principals import Access
from services.gateway.tooling import (
    Answer,
    ArgumentErrors,
    Ctx,
    Done,
    Failure,
    Tools,
    answer,
    converted,
    error_data,
    plain_schemas,
)

CODES: dict[str, str] = {ErrorCode.ACCESS_DENIED: "PERMISSION_DENIED"}
"""Quill codes WAP names differently; every other code is WAP's own."""

_LINE = {"type": "integer", "minimum": 1}
_TEXT = {"type": "string"}
OPERATION_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 1,
    "items": {
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "type": {"const": "replace"},
                    "startLine": _LINE,
                    "endLine": _LINE,
                    "newContent": _TEXT,
                },
                "required": ["type", "startLine", "endLine", "newContent"],
            },
            {
                "type": "object",
                "properties": {
                    "type": {"const": "insert"},
                    "afterLine": {"type": "integer", "minimum": 0},
                    "newContent": _TEXT,
                },
                "required": ["type", "afterLine", "newContent"],
            },
            {
                "type": "object",
                "properties": {"type": {"const": "delete"}, "startLine": _LINE, "endLine": _LINE},
                "required": ["type", "startLine", "endLine"],
            },
            {
                "type": "object",
                "properties": {
                    "type": {"const": "regexReplace"},
                    "pattern": _TEXT,
                    "replacement": _TEXT,
                    "flags": {"type": "string", "pattern": "^[gimsx]*$"},
                },
                "required": ["type", "pattern", "replacement"],
            },
        ]
    },
}
WAP_FIELDS = {
    "startLine": "start_line",
    "endLine": "end_line",
    "afterLine": "after_line",
    "newContent": "new_content",
}
WAP_TYPES = {"regexReplace": "regex_replace"}

Path = Annotated[str, Field(description="Path relative to the workspace root")]
WorkspaceName = Annotated[
    str | None, Field(description="Optional: another workspace of your tenant (its id)")
]
Excludes = Annotated[
    list[str] | None, Field(description="Glob patterns to exclude (default: WAP's defaults)")
]


def render(failure: Failure) -> CallToolResult:
    data = error_data(failure.error)
    data["code"] = CODES.get(str(failure.error.code), data["code"])
    return answer(json.dumps(data), data, is_error=True)


def reply(data: dict[str, Any]) -> Done:
    return Done(json.dumps(data), data)


def metadata(path: str, size: int, directory: bool, modified: datetime | None) -> dict[str, Any]:
    stamp = modified.isoformat().replace("+00:00", "Z") if modified else None
    absolute = f"{ROOT_DIR}/{path}" if path not in ("", ".") else ROOT_DIR
    return {"path": absolute, "size": size, "isDirectory": directory, "lastModified": stamp}


def wap_operations(items: list[dict[str, Any]]) -> list[ModifyOperation]:
    """WAP's camelCase operations as the contract's (``regexReplace`` → ``regex_replace``).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a malformed operation.
    """
    snake = [
        {WAP_FIELDS.get(k, k): (WAP_TYPES.get(v, v) if k == "type" else v) for k, v in op.items()}
        for op in items
    ]
    result: list[ModifyOperation] = converted(snake, list[ModifyOperation], "operations")
    return result


def build(access: Access) -> MCPServer:
    """The MCP server of ``/mcp/wap``."""
    server: MCPServer = MCPServer(
        "quill-wap",
        title="Quill workspace (Workspace Agent Protocol)",
        version=VERSION,
        instructions="Workspace Agent Protocol 1.0 tools over a Quill workspace.",
        log_level="WARNING",
    )
    tools = Tools(access, "wap", render)
    server.middleware.append(ArgumentErrors(tools))

    @server.tool(
        name="exploreFiles",
        description=(
            "Lists files and directories in a path, optionally recursively (maxDepth levels, "
            "default 3). Returns {files: [{path, isDirectory, metadata?}], isTruncated, "
            "totalFound}; default exclusions (node_modules, .git...) apply."
        ),
    )
    async def explore_files(
        ctx: Ctx,
        path: Path,
        recursive: bool = False,
        excludePatterns: Excludes = None,  # noqa: N803 - WAP's parameter names
        maxDepth: Annotated[int, Field(ge=1, le=100)] = 3,  # noqa: N803
        returnMetadata: bool = False,  # noqa: N803
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.explore(
                path,
                recursive=recursive,
                max_depth=maxDepth,
                exclude=excludePatterns,
                metadata=returnMetadata,
            )
            files = []
            for e in r.entries:
                item: dict[str, Any] = {"path": e.path, "isDirectory": e.kind == "directory"}
                if returnMetadata:
                    item["metadata"] = metadata(
                        e.path, e.size or 0, e.kind == "directory", e.modified
                    )
                files.append(item)
            return reply({"files": files, "isTruncated": r.truncated, "totalFound": r.total})

        return await tools.call(ctx, "exploreFiles", go, path=path, workspace=workspace)

    @server.tool(
        name="readFile",
        description=(
            "Reads a text file, whole or lines startLine..endLine (1-indexed, inclusive). "
            "Returns {content, metadata, isTruncated, totalLines, returnedLines}; isTruncated "
            "means a size limit (2000 lines / 256 KiB) cut the content short."
        ),
    )
    async def read_file(
        ctx: Ctx,
        path: Path,
        startLine: Annotated[int | None, Field(ge=1)] = None,  # noqa: N803
        endLine: Annotated[int | None, Field(ge=1)] = None,  # noqa: N803
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            start = startLine or 1
            if endLine is not None and endLine < start:
                raise QuillError(ErrorCode.INVALID_ARGUMENT, "endLine is before startLine")
            limit = None if endLine is None else endLine - start + 1
            r = await ws.read(path, offset=start, limit=limit)
            if r.kind == "directory":
                raise QuillError(ErrorCode.NOT_A_FILE, f"Not a file: {path}", {"path": path})
            if r.content is None:
                raise QuillError(ErrorCode.INVALID_ENCODING, "File contains invalid UTF-8 encoding")
            available = max(r.total_lines - start + 1, 0)
            wanted = available if limit is None else min(limit, available)
            return reply(
                {
                    "content": r.content,
                    "metadata": metadata(r.path, r.size, False, r.modified),
                    "isTruncated": r.truncated and r.returned_lines < wanted,
                    "totalLines": r.total_lines,
                    "returnedLines": r.returned_lines,
                }
            )

        return await tools.call(ctx, "readFile", go, path=path, workspace=workspace)

    @server.tool(
        name="writeFile",
        description=(
            "Writes content to a file: mode overwrite (default), create (fails if it exists) "
            "or append. Parent directories are created unless createDirectories is false. "
            "Returns {success, path, bytesWritten}."
        ),
    )
    async def write_file(
        ctx: Ctx,
        path: Path,
        content: str,
        mode: Literal["create", "overwrite", "append"] = "overwrite",
        createDirectories: bool = True,  # noqa: N803
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.write(path, content, mode=mode, create_parents=createDirectories)
            return reply({"success": True, "path": r.path, "bytesWritten": r.bytes_written})

        return await tools.call(ctx, "writeFile", go, path=path, workspace=workspace)

    @server.tool(
        name="modifyFile",
        description=(
            "Targeted changes to a file, all or nothing: replace/delete lines "
            "startLine..endLine, insert newContent after afterLine (0: at the top), or "
            "regexReplace pattern with replacement ($1 names a group; flags g i m s x). Line "
            "numbers refer to the file before the call. Returns {success, path}."
        ),
    )
    async def modify_file(
        ctx: Ctx,
        path: Path,
        operations: Annotated[list[dict[str, Any]], WithJsonSchema(OPERATION_SCHEMA)],
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.modify(path, wap_operations(operations))
            return reply({"success": True, "path": r.path})

        return await tools.call(ctx, "modifyFile", go, path=path, workspace=workspace)

    @server.tool(
        name="searchFiles",
        description=(
            "Searches file contents under each of paths for query, a regex or literal text. "
            "Returns {matches: [{path, line, matchText, contextBefore, contextAfter}], "
            "isTruncated, totalMatches}."
        ),
    )
    async def search_files(
        ctx: Ctx,
        paths: Annotated[list[str], Field(min_length=1, max_length=100)],
        query: Annotated[str, Field(min_length=1)],
        type: Literal["regex", "literal"],
        recursive: bool = True,
        excludePatterns: Excludes = None,  # noqa: N803
        contextLines: Annotated[int, Field(ge=0, le=50)] = 0,  # noqa: N803
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            matches: list[dict[str, Any]] = []
            total, truncated = 0, False
            for where in paths:
                r = await ws.grep(
                    query,
                    where,
                    literal=type == "literal",
                    exclude=excludePatterns,
                    context_lines=contextLines,
                )
                found = r.matches
                if not recursive:
                    top = normalize(where)
                    found = [m for m in found if parent(m.path) == top or m.path == top]
                total += r.total if recursive else len(found)
                truncated = truncated or r.truncated
                matches += [
                    {
                        "path": m.path,
                        "line": m.line,
                        "matchText": m.text,
                        "contextBefore": m.before,
                        "contextAfter": m.after,
                    }
                    for m in found
                ]
            return reply({"matches": matches, "isTruncated": truncated, "totalMatches": total})

        return await tools.call(ctx, "searchFiles", go, path=paths[0], workspace=workspace)

    @server.tool(
        name="executeCommand",
        description=(
            "Executes a shell command in the workspace (bash, in a sandbox without network; "
            "default working directory: the workspace root; timeout in ms, default 30000). "
            "Returns {stdout, stderr, exitCode, isOutputTruncated, durationMs}; a non-zero "
            "exitCode is not an error. Files it changes become a new workspace version."
        ),
    )
    async def execute_command(
        ctx: Ctx,
        command: Annotated[str, Field(min_length=1)],
        workingDirectory: str = "",  # noqa: N803 - WAP's parameter names
        timeout: Annotated[int | None, Field(ge=1, le=600_000)] = None,
        environment: dict[str, str] | None = None,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.exec(
                command, workdir=workingDirectory, timeout_ms=timeout, env=environment
            )
            return reply(
                {
                    "stdout": texts.head_and_tail(r.stdout, r.stdout_tail, r.stdout_omitted_bytes),
                    "stderr": texts.head_and_tail(r.stderr, r.stderr_tail, r.stderr_omitted_bytes),
                    "exitCode": r.exit_code,
                    "isOutputTruncated": r.stdout_truncated or r.stderr_truncated,
                    "durationMs": r.duration_ms,
                    "timedOut": r.timed_out,
                    "version": r.changes.version,
                }
            )

        path = workingDirectory or None
        return await tools.call(ctx, "executeCommand", go, path=path, workspace=workspace)

    @server.tool(
        name="getWorkspaceInfo",
        description=(
            "Workspace root, default exclusion patterns and limits: {root, defaultExclusions, "
            "limits: {maxFileSize, maxDirectoryEntries, maxSearchResults, maxOutputSize}}."
        ),
    )
    async def get_workspace_info(ctx: Ctx, workspace: WorkspaceName = None) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.info()
            limits = {
                "maxFileSize": r.limits.max_file_bytes,
                "maxDirectoryEntries": r.limits.max_directory_entries,
                "maxSearchResults": r.limits.max_search_results,
                "maxOutputSize": r.limits.max_output_bytes,
            }
            data = {"root": r.root, "defaultExclusions": r.default_exclusions, "limits": limits}
            return reply(data)

        return await tools.call(ctx, "getWorkspaceInfo", go, workspace=workspace)

    plain_schemas(server)
    return server
