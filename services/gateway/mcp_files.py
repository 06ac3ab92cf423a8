"""MCP at ``/mcp``: the workspace tool's six tools (seed 000), with its parameters and texts.

Quill's own tools (edit, modify, grep, history, diff, restore...) are added by
``mcp_quill.register``, the session's (attach, detach, list workspaces) by
``mcp_sessions.register``. Every tool takes an optional ``workspace``: another workspace of the
caller's tenant (with a pinned token: only the token's own) or an attached one's URI; without
it, the session decides (``mcp_sessions``). Calls parked for approval are put to the client's
user where it can be asked (``approvals``).
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from contracts.errors import ErrorCode, QuillError
from quill.client import Workspace
from services.gateway import VERSION, approvals, mcp_quill, mcp_sessions, texts
from services.gateway.principals import Access
from services.gateway.tooling import (
    Answer,
    ArgumentErrors,
    Ctx,
    Done,
    Failure,
    Tools,
    answer,
    builtins,
    error_data,
    plain_schemas,
)

INSTRUCTIONS = """\
A persistent, shared, versioned workspace of files. Paths are relative to /workspace \
(`notes.txt`, `data/report.md`); `/workspace/notes.txt` is the same file, and any path outside \
/workspace is refused. Every change is recorded: file_history and diff show what changed, \
restore brings back an earlier version. Errors are tool results starting with `Error:`."""

P_FILE = "File path relative to /workspace (or absolute path within /workspace), e.g. notes.txt"
P_DIR = "Directory path relative to /workspace (or absolute path within /workspace); . is the root"
P_ANY = "File or directory path relative to /workspace (or absolute path within /workspace)"
P_WS = (
    "Optional: another workspace of your tenant to work in (its id, e.g. scratch). "
    "Omit to use your own workspace."
)

FilePath = Annotated[str, Field(description=P_FILE)]
DirPath = Annotated[str, Field(description=P_DIR)]
AnyPath = Annotated[str, Field(description=P_ANY)]
WorkspaceName = Annotated[str | None, Field(description=P_WS)]
Head = Annotated[int, Field(ge=0, description="Read only the first N lines (0: not used)")]
Tail = Annotated[int, Field(ge=0, description="Read only the last N lines (0: not used)")]
Offset = Annotated[
    int, Field(ge=1, description="First line to read, 1-based (with limit: a line range)")
]
Limit = Annotated[
    int,
    Field(ge=0, description="Most lines to read from offset (0: as many as one read returns)"),
]
LineNumbers = Annotated[bool, Field(description="Prefix each line with its number: `12: text`")]
CharOffset = Annotated[
    int,
    Field(
        ge=0,
        description=(
            "Start at this character (0-based) of line offset: to read a line longer than "
            "one read returns in parts, as a [truncated: ...] note says"
        ),
    ),
]
READ_FILE = (
    "Read a text file from the workspace and return its contents. Use head or tail to read "
    "only the first or last N lines, or offset and limit for a line range (offset=2001 "
    "limit=2000 reads lines 2001-4000); line_numbers=true prefixes each line with `<n>: `. "
    "One read returns at most 2000 lines / 256 KiB (a workspace may set other limits): when "
    "a limit cuts what you asked for, the text ends with a [truncated: ...] note saying which "
    "lines are shown, which are not, and the read_file call that reads them (a tail keeps the "
    "LAST lines). A line longer than one read returns is read in parts with char_offset. "
    "Errors: 'File not found' (check with list_directory), 'Not a file' (a directory), "
    "'invalid UTF-8' (a binary file)."
)
COMMITTED_ONLY = (
    " Only committed files are visible to the file tools: a file a command made that could "
    "not be committed (over max_file_bytes, a symlink, an invalid name) answers 'not found' "
    "with why."
)
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)
ADDS = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)


def render(failure: Failure) -> CallToolResult:
    """A failure as the workspace tool words it (``Error: ...``)."""
    text = texts.error_text(failure.tool, failure.error, failure.path, failure.workspace)
    return answer(text, error_data(failure.error), is_error=True)


def build(access: Access) -> MCPServer:
    """The MCP server of ``/mcp`` with every tool registered."""
    server: MCPServer = MCPServer(
        "quill-workspace",
        title="Quill workspace",
        version=VERSION,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        request_state_security=approvals.security(),
    )
    sessions = mcp_sessions.Sessions(access)
    tools = Tools(access, "mcp", render, sessions.target, elicit=True)
    server.middleware.append(ArgumentErrors(tools))
    register(server, tools)
    mcp_quill.register(server, tools)
    mcp_sessions.register(server, tools, sessions)
    plain_schemas(server)
    return server


def register(server: MCPServer, tools: Tools) -> None:
    """The six tools of the workspace tool."""

    @server.tool(description=READ_FILE + COMMITTED_ONLY, annotations=READ_ONLY)
    async def read_file(
        ctx: Ctx,
        path: FilePath,
        head: Head = 0,
        tail: Tail = 0,
        offset: Offset = 1,
        limit: Limit = 0,
        line_numbers: LineNumbers = False,
        char_offset: CharOffset = 0,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            result = await ws.read(
                path,
                head=head or None,
                tail=tail or None,
                offset=offset if offset > 1 else None,
                limit=limit or None,
                line_numbers=line_numbers,
                char_offset=char_offset,
            )
            if result.kind == "directory":
                raise QuillError(ErrorCode.NOT_A_FILE, f"Not a file: {path}", {"path": path})
            if result.content is None:
                raise QuillError(ErrorCode.INVALID_ENCODING, "File contains invalid UTF-8 encoding")
            return Done(texts.read_text(result), builtins(result))

        return await tools.call(ctx, "read_file", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "Create a file or completely replace its contents (UTF-8 text); missing parent "
            "directories are created. This REPLACES the whole file: to add to a file, read it, "
            "combine, and write the combined text (or use edit_file). An empty content creates "
            "an empty file. Files are limited to 4 MiB by default. Returns the bytes written "
            "and, over an existing file, the size of what it replaced; writing the content a "
            "file already has answers 'No changes' (no new version)."
        ),
        annotations=WRITES,
    )
    async def write_file(
        ctx: Ctx,
        path: FilePath,
        content: Annotated[str, Field(description="The complete new contents of the file")],
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            result = await ws.write(path, content)
            return Done(texts.write_text(path, result), builtins(result))

        return await tools.call(ctx, "write_file", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "List a directory: 'Contents of <path>:' then one line per entry, [DIR] name lines "
            "first, then [FILE] name lines. An empty directory answers 'Directory is empty'. "
            "At most 500 entries are shown a page: a longer listing ends with how many entries "
            "there are and the after value to call again with for the next page."
        ),
        annotations=READ_ONLY,
    )
    async def list_directory(
        ctx: Ctx,
        path: DirPath,
        after: Annotated[
            str | None,
            Field(
                min_length=1,
                description="Optional: the after value a listing's last line gives, to get "
                "its next page",
            ),
        ] = None,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            listing = await ws.list(path, after=after)
            return Done(texts.listing_text(path, listing, after), builtins(listing))

        return await tools.call(ctx, "list_directory", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "Create a directory and any missing parents (like mkdir -p). Succeeds if it already "
            "exists; fails with 'Path exists but is not a directory' if a file is in the way."
        ),
        annotations=ADDS,
    )
    async def create_directory(ctx: Ctx, path: DirPath, workspace: WorkspaceName = None) -> Answer:
        async def go(ws: Workspace) -> Done:
            result = await ws.mkdir(path)
            verb = "Successfully created directory" if result.created else "Directory exists"
            return Done(f"{verb}: {path}", builtins(result))

        return await tools.call(ctx, "create_directory", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "Metadata of a file or directory: Path, Type, Size (files), Permissions, owner, "
            "Created/Modified/Accessed times in UTC, and Entries (directories)."
        )
        + COMMITTED_ONLY,
        annotations=READ_ONLY,
    )
    async def get_file_info(ctx: Ctx, path: AnyPath, workspace: WorkspaceName = None) -> Answer:
        async def go(ws: Workspace) -> Done:
            info = await ws.stat(path)
            return Done(texts.file_info_text(path, info), builtins(info))

        return await tools.call(ctx, "get_file_info", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "Find files and directories whose path matches a glob, searching recursively from "
            "a directory. Glob syntax: * (any characters but /), ** (any characters including "
            "/), ? (one character), [abc] (a set), {a,b} (alternatives); e.g. **/*.json, *.log, "
            "**/config. Answers 'Found N match(es)' and one [FILE] or [DIR] line per path "
            "(newest first). node_modules, .git, dist, build, .venv, target, __pycache__ and "
            "vendor are skipped."
        ),
        annotations=READ_ONLY,
    )
    async def search_files(
        ctx: Ctx,
        path: Annotated[str, Field(description="Directory to search from; . is the root")],
        pattern: Annotated[str, Field(description="Glob pattern, e.g. **/*.txt")],
        max_results: Annotated[
            int, Field(ge=1, le=10_000, description="Most results to return (default 100)")
        ] = 100,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            matches = await ws.glob(pattern, path, max_results=max_results)
            return Done(texts.matches_text(pattern, path, matches), builtins(matches))

        return await tools.call(ctx, "search_files", go, path=path, workspace=workspace)
