"""MCP at ``/mcp``: the workspace tool's six tools (seed 000), with its parameters and texts.

Quill's own tools (edit, modify, grep, history, diff, restore...) are ``quill_tools.TOOLS``, the
session's (attach, detach, list workspaces) ``sessions.TOOLS``; ``table`` serves them all and
``endpoints`` assembles ``/mcp`` from them. Every tool takes an optional ``workspace``: another
workspace of the caller's tenant (with a pinned token: only the token's own) or an attached
one's URI; without it, the session decides (``sessions``). Calls parked for approval are put to
the client's user where it can be asked (``elicitation``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from contracts.limits import DEFAULT_EXCLUSIONS
from services.gateway.mcp import texts
from services.gateway.mcp.engine import text_read
from services.gateway.mcp.table import ADDS, READ_ONLY, REPLACES, Arg, Tool, workspace_arg

P_FILE = "File path relative to /workspace (or absolute path within /workspace)"
P_DIR = "Directory path relative to /workspace (or absolute path within /workspace)"
P_ANY = "File or directory path relative to /workspace (or absolute path within /workspace)"

FilePath = Annotated[str, Field(description=P_FILE)]
DirPath = Annotated[str, Field(description=P_DIR)]
AnyPath = Annotated[str, Field(description=P_ANY)]
Content = Annotated[
    str, Field(description="Complete file contents to write (replaces any existing content)")
]
StartPath = Annotated[str, Field(description="Starting directory path relative to /workspace")]
Pattern = Annotated[str, Field(description="Glob pattern to match (e.g., '*.rb', '**/*.txt')")]
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
                Content,
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
            Arg("path", StartPath),
            Arg("pattern", Pattern),
            Arg("max_results", MostResults, 100),
            Arg("exclude", Excluded, None, send=excluding),
            WS,
        ),
        lambda a, r: texts.matches_text(a.pattern, a.path, r),
        READ_ONLY,
    ),
)
"""The six tools of the workspace tool."""
