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
from mcp.types import CallToolResult
from pydantic import Field

from contracts.limits import DEFAULT_EXCLUSIONS
from services.gateway import (
    VERSION,
    approvals,
    mcp_approvals,
    mcp_quill,
    mcp_reference,
    mcp_sessions,
    optable,
    texts,
)
from services.gateway.access import Access
from services.gateway.optable import ADDS, READ_ONLY, REPLACES, Arg, Tool, described, workspace_arg
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
/workspace is refused. Every tool takes an optional workspace: another workspace than yours \
(its id, tenant/id without tokens, or an attached one's URI). Every change is recorded: \
file_history and diff show what changed, restore brings back an earlier version. The file \
tools see committed files only. Errors are tool results starting with `Error:`."""

P_FILE = "File path relative to /workspace (or absolute path within /workspace)"
P_DIR = "Directory path relative to /workspace (or absolute path within /workspace)"
P_ANY = "File or directory path relative to /workspace (or absolute path within /workspace)"

FilePath = Annotated[str, Field(description=P_FILE)]
DirPath = Annotated[str, Field(description=P_DIR)]
AnyPath = Annotated[str, Field(description=P_ANY)]
Head = Annotated[int, Field(ge=0, description="Read only first N lines")]
Tail = Annotated[int, Field(ge=0, description="Read only last N lines")]
Offset = Annotated[int, Field(ge=1, description="First line to read (1-based)")]
Limit = Annotated[int, Field(ge=0, description="Lines to read from offset (0: up to the limit)")]
LineNumbers = Annotated[bool, Field(description="Prefix each line with its number: 12: text")]
CharOffset = Annotated[
    int, Field(ge=0, description="Start at this character of line offset (a long line's rest)")
]
After = Annotated[
    str | None, Field(min_length=1, description="The after value a page gave, for the next")
]
MostResults = Annotated[
    int,
    Field(ge=1, le=10_000, description="Maximum number of results to return (default: 100)"),
]
Excluded = Annotated[list[str] | None, Field(description="More glob patterns to skip")]
READ_FILE = (
    "Read complete file contents from workspace. A read returns at most 2000 lines / 256 "
    "KiB: a cut answer ends with a [truncated: ...] note giving the call for the rest. "
    "Binary files: read_media_file."
)


def render(failure: Failure) -> CallToolResult:
    """A failure as the workspace tool words it (``Error: ...``)."""
    error = texts.workspace_unknown(failure.error, failure.workspace)
    text = texts.error_text(failure.tool, error, failure.path, failure.workspace)
    return answer(text, error_data(error), is_error=True)


def said(text: str, result: Any) -> Done:
    """``/mcp``'s answer: the text for the model, the result as JSON for programs."""
    return Done(text, builtins(result))


def excluding(patterns: list[str] | None) -> list[str] | None:
    """The default exclusions and ``patterns`` (None: the defaults, as the reader takes it)."""
    return [*DEFAULT_EXCLUSIONS, *patterns] if patterns else None


def unset(n: int) -> int | None:
    """A count a model gives as 0 for "not used"."""
    return n or None


WS = workspace_arg()
TOOLS = (
    Tool(
        "read_file",
        "qry.read",
        READ_FILE,
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
        "Create new file or completely overwrite existing file in workspace (UTF-8 text; "
        "parent directories are created). To append, read the file and write the whole "
        "text, or use edit_file. Writing what a file holds answers 'No changes'.",
        (
            Arg("path", FilePath),
            Arg(
                "content",
                described(str, "Complete file contents to write (replaces any existing content)"),
            ),
            WS,
        ),
        lambda a, r: texts.write_text(a.path, r),
        REPLACES,
    ),
    Tool(
        "list_directory",
        "qry.list",
        "List directory contents with file/directory indicators: [DIR] lines, then [FILE] "
        "lines, 500 a page (a longer one gives the after value for the next).",
        (Arg("path", DirPath), Arg("after", After, None), WS),
        lambda a, r: texts.listing_text(a.path, r, a.after),
        READ_ONLY,
    ),
    Tool(
        "create_directory",
        "cmd.mkdir",
        "Create new directory in workspace (creates parent directories as needed); an "
        "existing one is fine.",
        (Arg("path", DirPath), WS),
        lambda a, r: texts.mkdir_text(a.path, r),
        ADDS,
    ),
    Tool(
        "get_file_info",
        "qry.stat",
        "Get detailed file or directory metadata: type, size, permissions, times (UTC), entries.",
        (Arg("path", AnyPath), WS),
        lambda a, r: texts.file_info_text(a.path, r),
        READ_ONLY,
    ),
    Tool(
        "search_files",
        "qry.glob",
        "Recursively search for files and directories matching a glob pattern (* ** ? "
        "[abc] {a,b}), newest first. node_modules, .git, .venv and the like are skipped; "
        "exclude skips more.",
        (
            Arg("path", described(str, "Starting directory path relative to /workspace")),
            Arg("pattern", described(str, "Glob pattern to match (e.g., '*.rb', '**/*.txt')")),
            Arg("max_results", MostResults, 100),
            Arg("exclude", Excluded, None, send=excluding),
            WS,
        ),
        lambda a, r: texts.matches_text(a.pattern, a.path, r),
        READ_ONLY,
    ),
)
"""The six tools of the workspace tool."""
MCP_TOOLS = TOOLS + mcp_quill.TOOLS + mcp_approvals.TOOLS + mcp_reference.TOOLS + mcp_sessions.TOOLS
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
    "qry.events": "the log: the SDK's and quill log (file_history is the model's view)",
    "qry.tree": "the executors' (a checkout's first build); list_files is the model's view",
    **mcp_sessions.workspaces.NO_TOOL,
}
"""The ops no ``/mcp`` tool is, and why: with ``TOOL_OPS``, every op of ``contracts.ops``."""
OPERATOR_TOOLS: dict[str, str] = {
    "archive_workspace": "archives any workspace of the tenant: an operator's decision",
}
"""Tools of ``/mcp`` for operators, not models: offered only when the gateway is told to
(``GatewayConfig.operator_tools``, ``quill gateway --operator-tool NAME``). A model picks its
tools from what ``tools/list`` offers; one it does not see it does not call."""


def offered(operator_tools: tuple[str, ...] = ()) -> tuple[Tool, ...]:
    """The tools ``/mcp`` lists: every one, but the operators' not named in
    ``operator_tools``."""
    return tuple(t for t in MCP_TOOLS if t.name not in OPERATOR_TOOLS or t.name in operator_tools)


def build(access: Access, operator_tools: tuple[str, ...] = ()) -> MCPServer:
    """The MCP server of ``/mcp`` with its tools registered (``offered``)."""
    server: MCPServer = MCPServer(
        "quill-workspace",
        title="Quill workspace",
        version=VERSION,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        request_state_security=approvals.security(),
    )
    sessions = mcp_sessions.Sessions(access)
    tools = Tools(access, "mcp", render, sessions.target, elicit=True, told=mcp_approvals.told)
    server.middleware.append(ArgumentErrors(tools))
    optable.register(server, tools, offered(operator_tools), said, sessions)
    plain_schemas(server)
    return server
