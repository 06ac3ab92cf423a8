"""MCP at ``/mcp/wap``: the Workspace Agent Protocol's camelCase tools and JSON responses.

Each tool answers WAP's response object, JSON-encoded as its text and as ``structuredContent``;
a failure answers WAP's ``{"error", "code", "details"}`` the same way, with ``isError: true``.
The tools are the rows of ``TOOLS``, served by ``table`` (``endpoints`` assembles ``/mcp/wap``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from mcp.types import CallToolResult
from pydantic import Field, WithJsonSchema

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from contracts.paths import ROOT_DIR, normalize, parent
from contracts.requests import ModifyOperation
from quill.client import Workspace
from services.gateway import errors
from services.gateway.mcp import command_texts, table
from services.gateway.mcp.engine import (
    Done,
    Failure,
    answer,
    converted,
    error_data,
    text_read,
)
from services.gateway.mcp.schemas import obj
from services.gateway.mcp.table import CHANGES, OPEN, READ_ONLY, Arg, Args, Tool, workspace_arg

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
Excludes = Annotated[
    list[str] | None, Field(description="Glob patterns to exclude (default: WAP's defaults)")
]


def render(failure: Failure) -> CallToolResult:
    data = error_data(failure.error)
    data["code"] = errors.wap_code(failure.error.code)  # WAP's name of the code
    return answer(json.dumps(data), data, is_error=True)


def reply(data: dict[str, Any], result: Any = None) -> Done:
    """WAP's answer: its response object, as JSON text and as structured content."""
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


def explored(a: Args, r: rp.Tree) -> dict[str, Any]:
    files = []
    for e in r.entries:
        item: dict[str, Any] = {"path": e.path, "isDirectory": e.kind == "directory"}
        if a.returnMetadata:
            item["metadata"] = metadata(e.path, e.size or 0, e.kind == "directory", e.modified)
        files.append(item)
    return {"files": files, "isTruncated": r.truncated, "totalFound": r.total}


def lines(a: Args) -> tuple[int, int | None]:
    """``startLine``..``endLine`` as the first line and how many (None: to the end).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for an end before the start.
    """
    start = a.startLine or 1
    if a.endLine is not None and a.endLine < start:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "endLine is before startLine")
    return start, None if a.endLine is None else a.endLine - start + 1


async def read_lines(ws: Workspace, a: Args) -> rp.FileContent:
    start, limit = lines(a)
    return await ws.read(a.path, offset=start, limit=limit)


def read(a: Args, r: rp.FileContent) -> dict[str, Any]:
    text_read(r, a.path)
    start, limit = lines(a)
    available = max(r.total_lines - start + 1, 0)
    wanted = available if limit is None else min(limit, available)
    return {
        "content": r.content,
        "metadata": metadata(r.path, r.size, False, r.modified),
        "isTruncated": r.truncated and r.returned_lines < wanted,
        "totalLines": r.total_lines,
        "returnedLines": r.returned_lines,
    }


async def search(ws: Workspace, a: Args) -> dict[str, Any]:
    """WAP's search: a grep of each of ``paths`` (``recursive`` false: only the files right in
    it), the matches together."""
    matches: list[dict[str, Any]] = []
    total, truncated = 0, False
    for where in a.paths:
        r = await ws.grep(
            a.query,
            where,
            literal=a.type == "literal",
            exclude=a.excludePatterns,
            context_lines=a.contextLines,
        )
        found = r.matches
        if not a.recursive:
            top = normalize(where)
            found = [m for m in found if parent(m.path) == top or m.path == top]
        total += r.total if a.recursive else len(found)
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
    return {"matches": matches, "isTruncated": truncated, "totalMatches": total}


def executed(a: Args, r: rp.CommandResult) -> dict[str, Any]:
    return {
        "stdout": command_texts.head_and_tail(r.stdout, r.stdout_tail, r.stdout_omitted_bytes),
        "stderr": command_texts.head_and_tail(r.stderr, r.stderr_tail, r.stderr_omitted_bytes),
        "exitCode": r.exit_code,
        "isOutputTruncated": r.stdout_truncated or r.stderr_truncated,
        "durationMs": r.duration_ms,
        "timedOut": r.timed_out,
        "version": r.changes.version,
    }


def info(a: Args, r: rp.WorkspaceInfo) -> dict[str, Any]:
    limits = {
        "maxFileSize": r.limits.max_file_bytes,
        "maxDirectoryEntries": r.limits.max_directory_entries,
        "maxSearchResults": r.limits.max_search_results,
        "maxOutputSize": r.limits.max_output_bytes,
    }
    return {"root": r.root, "defaultExclusions": r.default_exclusions, "limits": limits}


WS = workspace_arg("Omit for your own; else another workspace of your tenant: its id")
TOOLS = (
    Tool(
        "exploreFiles",
        "qry.explore",
        "Lists files and directories in a path, optionally recursively (maxDepth levels, "
        "default 3); default exclusions (node_modules, .git...) apply.",
        (
            Arg("path", Path),
            Arg("recursive", bool, False),
            Arg("excludePatterns", Excludes, None, to="exclude"),
            Arg("maxDepth", Annotated[int, Field(ge=1, le=100)], 3, to="max_depth"),
            Arg("returnMetadata", bool, False, to="metadata"),
            WS,
        ),
        explored,
        READ_ONLY,
        output=obj({"files": "array", "isTruncated": "boolean", "totalFound": "integer"}),
    ),
    Tool(
        "readFile",
        "qry.read",
        "Reads a text file, whole or lines startLine..endLine (1-indexed, inclusive); "
        "isTruncated: a limit (2000 lines / 256 KiB) cut the content short.",
        (
            Arg("path", Path),
            Arg("startLine", Annotated[int | None, Field(ge=1)], None),
            Arg("endLine", Annotated[int | None, Field(ge=1)], None),
            WS,
        ),
        read,
        READ_ONLY,
        call=read_lines,
        output=obj(
            {
                "content": "string",
                "metadata": "object",
                "isTruncated": "boolean",
                "totalLines": "integer",
                "returnedLines": "integer",
            }
        ),
    ),
    Tool(
        "writeFile",
        "cmd.write",
        "Writes content to a file: mode overwrite (default), create (fails if it exists) "
        "or append. Parent directories are created unless createDirectories is false.",
        (
            Arg("path", Path),
            Arg("content", str),
            Arg("mode", Literal["create", "overwrite", "append"], "overwrite"),
            Arg("createDirectories", bool, True, to="create_parents"),
            WS,
        ),
        lambda a, r: {"success": True, "path": r.path, "bytesWritten": r.bytes_written},
        CHANGES,
        output=obj({"success": "boolean", "path": "string", "bytesWritten": "integer"}),
    ),
    Tool(
        "modifyFile",
        "cmd.modify",
        "Targeted changes to a file, all or nothing: replace/delete lines "
        "startLine..endLine, insert newContent after afterLine (0: at the top), or "
        "regexReplace pattern with replacement ($1 names a group; flags g i m s x). Line "
        "numbers refer to the file before the call.",
        (
            Arg("path", Path),
            Arg(
                "operations",
                Annotated[list[dict[str, Any]], WithJsonSchema(OPERATION_SCHEMA)],
                send=wap_operations,
            ),
            WS,
        ),
        lambda a, r: {"success": True, "path": r.path},
        CHANGES,
        output=obj({"success": "boolean", "path": "string"}),
    ),
    Tool(
        "searchFiles",
        "qry.grep",
        "Searches file contents under each of paths for query, a regex or literal text.",
        (
            Arg("paths", Annotated[list[str], Field(min_length=1, max_length=100)]),
            Arg("query", Annotated[str, Field(min_length=1)]),
            Arg("type", Literal["regex", "literal"]),
            Arg("recursive", bool, True),
            Arg("excludePatterns", Excludes, None),
            Arg("contextLines", Annotated[int, Field(ge=0, le=50)], 0),
            WS,
        ),
        lambda a, data: data,
        READ_ONLY,
        path=None,  # WAP's errors name no path
        call=search,
        output=obj({"matches": "array", "isTruncated": "boolean", "totalMatches": "integer"}),
    ),
    Tool(
        "executeCommand",
        "exec.run",
        "Executes a shell command in the workspace (bash, in a sandbox without network; "
        "default working directory: the workspace root; timeout in ms, default 30000); a "
        "non-zero exitCode is not an error. Files it changes become a new workspace version.",
        (
            Arg("command", Annotated[str, Field(min_length=1)]),
            Arg("workingDirectory", str, "", to="workdir"),
            Arg("timeout", Annotated[int | None, Field(ge=1, le=600_000)], None, to="timeout_ms"),
            Arg("environment", dict[str, str] | None, None, to="env"),
            WS,
        ),
        executed,
        OPEN,
        path="workingDirectory",
        output=obj(
            {
                "stdout": "string",
                "stderr": "string",
                "exitCode": ["integer", "null"],
                "isOutputTruncated": "boolean",
                "durationMs": ["integer", "null"],
                "timedOut": "boolean",
                "version": ["integer", "null"],
            }
        ),
    ),
    Tool(
        "getWorkspaceInfo",
        "qry.info",
        "Workspace root, default exclusion patterns and limits (maxFileSize, "
        "maxDirectoryEntries, maxSearchResults, maxOutputSize).",
        (WS,),
        info,
        READ_ONLY,
        output=obj({"root": "string", "defaultExclusions": "array", "limits": "object"}),
    ),
)
"""WAP's tools; ``readFile`` and ``searchFiles`` are not one call of their op (``call``)."""
TOOL_OPS = table.ops_of(TOOLS)
"""The op each ``/mcp/wap`` tool is."""
