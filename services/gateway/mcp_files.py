"""MCP at ``/mcp``: the workspace tool's six tools (seed 000), with its parameters and texts.

Quill's own tools (edit, modify, grep, history, diff, restore...) are ``mcp_quill.TOOLS``, the
session's (attach, detach, list workspaces) ``mcp_sessions.TOOLS``; ``optable`` serves them
all. Every tool takes an optional ``workspace``: another workspace of the caller's tenant (with
a pinned token: only the token's own) or an attached one's URI; without it, the session
decides (``mcp_sessions``). Calls parked for approval are put to the client's
user where it can be asked (``approvals``).
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from services.gateway import VERSION, approvals, mcp_quill, mcp_sessions, optable, texts
from services.gateway.optable import Arg, Tool, described
from services.gateway.principals import Access
from services.gateway.tooling import (
    ArgumentErrors,
    Done,
    Failure,
    Tools,
    answer,
    builtins,
    error_data,
    plain_schemas,
    text_read,
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
After = Annotated[
    str | None,
    Field(
        min_length=1,
        description="Optional: the after value a listing's last line gives, to get its next page",
    ),
]
MostResults = Annotated[
    int, Field(ge=1, le=10_000, description="Most results to return (default 100)")
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


def said(text: str, result: Any) -> Done:
    """``/mcp``'s answer: the text for the model, the result as JSON for programs."""
    return Done(text, builtins(result))


def unset(n: int) -> int | None:
    """A count a model gives as 0 for "not used"."""
    return n or None


WS = Arg("workspace", WorkspaceName, None)
TOOLS = (
    Tool(
        "read_file",
        "qry.read",
        READ_FILE + COMMITTED_ONLY,
        (
            Arg("path", FilePath),
            Arg("head", Head, 0, send=unset),
            Arg("tail", Tail, 0, send=unset),
            Arg("offset", Offset, 1, send=lambda n: n if n > 1 else None),
            Arg("limit", Limit, 0, send=unset),
            Arg("line_numbers", LineNumbers, False),
            Arg("char_offset", CharOffset, 0),
            WS,
        ),
        lambda a, r: texts.read_text(text_read(r, a.path)),
        READ_ONLY,
    ),
    Tool(
        "write_file",
        "cmd.write",
        "Create a file or completely replace its contents (UTF-8 text); missing parent "
        "directories are created. This REPLACES the whole file: to add to a file, read it, "
        "combine, and write the combined text (or use edit_file). An empty content creates "
        "an empty file. Files are limited to 4 MiB by default. Returns the bytes written "
        "and, over an existing file, the size of what it replaced; writing the content a "
        "file already has answers 'No changes' (no new version).",
        (
            Arg("path", FilePath),
            Arg(
                "content",
                Annotated[str, Field(description="The complete new contents of the file")],
            ),
            WS,
        ),
        lambda a, r: texts.write_text(a.path, r),
        WRITES,
    ),
    Tool(
        "list_directory",
        "qry.list",
        "List a directory: 'Contents of <path>:' then one line per entry, [DIR] name lines "
        "first, then [FILE] name lines. An empty directory answers 'Directory is empty'. "
        "At most 500 entries are shown a page: a longer listing ends with how many entries "
        "there are and the after value to call again with for the next page.",
        (Arg("path", DirPath), Arg("after", After, None), WS),
        lambda a, r: texts.listing_text(a.path, r, a.after),
        READ_ONLY,
    ),
    Tool(
        "create_directory",
        "cmd.mkdir",
        "Create a directory and any missing parents (like mkdir -p). Succeeds if it already "
        "exists; fails with 'Path exists but is not a directory' if a file is in the way.",
        (Arg("path", DirPath), WS),
        lambda a, r: texts.mkdir_text(a.path, r),
        ADDS,
    ),
    Tool(
        "get_file_info",
        "qry.stat",
        "Metadata of a file or directory: Path, Type, Size (files), Permissions, owner, "
        "Created/Modified/Accessed times in UTC, and Entries (directories)." + COMMITTED_ONLY,
        (Arg("path", AnyPath), WS),
        lambda a, r: texts.file_info_text(a.path, r),
        READ_ONLY,
    ),
    Tool(
        "search_files",
        "qry.glob",
        "Find files and directories whose path matches a glob, searching recursively from "
        "a directory. Glob syntax: * (any characters but /), ** (any characters including "
        "/), ? (one character), [abc] (a set), {a,b} (alternatives); e.g. **/*.json, *.log, "
        "**/config. Answers 'Found N match(es)' and one [FILE] or [DIR] line per path "
        "(newest first). node_modules, .git, dist, build, .venv, target, __pycache__ and "
        "vendor are skipped.",
        (
            Arg(
                "path", Annotated[str, Field(description="Directory to search from; . is the root")]
            ),
            Arg("pattern", described(str, "Glob pattern, e.g. **/*.txt")),
            Arg("max_results", MostResults, 100),
            WS,
        ),
        lambda a, r: texts.matches_text(a.pattern, a.path, r),
        READ_ONLY,
    ),
)
"""The six tools of the workspace tool."""
MCP_TOOLS = TOOLS + mcp_quill.TOOLS + mcp_sessions.TOOLS
"""Every tool at ``/mcp``, in the order ``tools/list`` lists them."""
TOOL_OPS = optable.ops_of(MCP_TOOLS)
"""The op each ``/mcp`` tool is (the session tools' included)."""
NO_TOOL: dict[str, str] = {
    "cmd.create": "a caller's workspace is created on its first call (principals.Access)",
    "cmd.apply": "several changes against a base version: for syncing clients (SDK, bridge)",
    "cmd.run_start": "runs are an agent framework's (SDK, quill run)",
    "cmd.run_end": "runs are an agent framework's (SDK, quill run)",
    "qry.run": "runs are an agent framework's (SDK, quill run)",
    "cmd.lock": "a session's lock is its client's (SDK, quill lock)",
    "cmd.unlock": "a session's lock is its client's (SDK, quill lock)",
    "cmd.set_trust": "an operator's (quill trust): a model must not lift its own restriction",
    "cmd.decide": "a person's (elicitation, quill approve): a model must not approve itself",
    "qry.approvals": "an operator's (quill approvals)",
    "cmd.request_approval": "the executors' (asked before a command runs)",
    "qry.read_bytes": "binary content: REST and the SDK (read_file reads text)",
    "qry.events": "the log: the SDK's and quill log (file_history is the model's view)",
    **mcp_sessions.workspaces.NO_TOOL,
}
"""The ops no ``/mcp`` tool is, and why: with ``TOOL_OPS``, every op of ``contracts.ops``."""


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
    optable.register(server, tools, MCP_TOOLS, said, sessions)
    plain_schemas(server)
    return server
