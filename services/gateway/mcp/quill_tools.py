"""MCP at ``/mcp``: Quill's tools beyond the workspace tool's six (edits, search, history,
commands, git), as rows of ``table`` (each is one op); the tools of a command's output and of
commands that run on are ``commands``'s."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, WithJsonSchema

from contracts import replies as rp
from contracts.limits import LIVE_YIELD_MAX_MS
from contracts.requests import GitAction, ModifyOperation
from quill.client import Workspace
from services.gateway.access import Principal
from services.gateway.mcp import command_texts, commands, reference, terminal, texts
from services.gateway.mcp.engine import Done, builtins, converted, inline_schema
from services.gateway.mcp.table import (
    CHANGES,
    OPEN,
    READ_ONLY,
    REPLACES,
    Arg,
    Args,
    Tool,
    described,
    workspace_arg,
)

P_FILE = "File path in /workspace"
P_DIR = "Directory path relative to /workspace; . is the root"

FilePath = Annotated[str, Field(description=P_FILE)]
Globs = Annotated[
    list[str] | None,
    Field(description="Glob patterns to skip (default: node_modules, .git, dist...)"),
]
Version = Annotated[int, Field(ge=1, description="A workspace version (1: its creation)")]
Operations = Annotated[
    list[dict[str, Any]],
    WithJsonSchema(inline_schema(list[ModifyOperation])),
    Field(
        description=(
            "insert after_line 0 is the top; regex_replace groups are $1 or $<name>. "
            "Line ranges must not overlap."
        )
    ),
]
Command = Annotated[str, Field(min_length=1, description="The shell command line")]
Workdir = Annotated[str, Field(description="Working directory in /workspace (default: root)")]
Timeout = Annotated[int | None, Field(ge=1, le=600_000, description="Milliseconds (default 30000)")]
Env = Annotated[dict[str, str] | None, Field(description="Extra environment variables")]
YieldMs = Annotated[
    int,
    Field(
        ge=0,
        le=LIVE_YIELD_MAX_MS,
        description="Answer then if still running (default 10000)",
    ),
]
YIELD_MS = 10_000
"""``execute_command``'s default ``yield_ms``: a model's turn stays short, and a command that
waits (a server, a prompt) does not hold it until its timeout."""


COMMAND = (
    "Run a shell command (bash -c) in the workspace's sandbox (/workspace, no network) "
    "until timeout_ms. Answers the exit code (non-zero is no error), stdout and stderr (over "
    "50 KB: first and last 25 KB; read_command_output reads the rest). Still running after "
    "yield_ms, it runs on: the answer gives its command_id and cursor for "
    "read_command_output, write_stdin and send_signal. Its changes are committed as one "
    "version when it ends. An MCP session's commands share its own shell: cd, export, "
    "functions and /tmp carry over (with workdir or env, or without a session, each call is "
    "a fresh shell); python is python3. Only committed files are visible to the file tools: "
    "it lists those it could not commit."
)
ALIAS = "The same tool as execute_command (an alias: same arguments, answer and hints)."
Only = Annotated[str | None, Field(description="Omit for the whole workspace")]
Depth = Annotated[int, Field(ge=1, le=100)]
MostResults = Annotated[int | None, Field(ge=1, le=10_000)]
DIR = Arg("path", described(str, P_DIR), ".")
WS = workspace_arg()
COMMAND_ARGS = (
    Arg("command", Command),
    Arg("workdir", Workdir, ""),
    Arg("timeout_ms", Timeout, None),
    Arg("env", Env, None),
    Arg("yield_ms", YieldMs, YIELD_MS),
    WS,
)


def command_tool(name: str, description: str) -> Tool:
    """``execute_command``, or an alias of it: one row, so they cannot drift apart."""
    return Tool(
        name,
        "exec.run",
        description,
        COMMAND_ARGS,
        lambda a, r: ran_text(r),
        OPEN,
        path="workdir",
        detail=lambda a: a.command,
        waits=True,
        session_call=in_session,
    )


async def in_session(host: Any, principal: Principal, ws: Workspace, a: Args) -> terminal.Ran:
    """``execute_command`` in the caller's session's shell (``terminal``)."""
    shells: terminal.SessionShells = host.shells
    return await shells.execute(principal, ws, a)


def ran_text(r: rp.CommandResult | terminal.Ran) -> Done:
    """The command's answer, the session shell's note first (``terminal``)."""
    ran = r if isinstance(r, terminal.Ran) else terminal.Ran(r)
    text = command_texts.command_or_running_text(ran.result)
    return Done(f"{ran.note}\n\n{text}" if ran.note else text, builtins(ran.result))


TOOLS = (
    Tool(
        "edit_file",
        "cmd.edit",
        "Replace exact text in a file: old_string (as the file has it, whitespace included) "
        "must occur once, unless replace_all; if not, the error shows the closest text or "
        "the lines it is on.",
        (
            Arg("path", FilePath),
            Arg(
                "old_string", described(str | None, "The exact text to replace", min_length=1), None
            ),
            Arg("new_string", described(str | None, "The replacement text (used literally)"), None),
            Arg("replace_all", described(bool, "Replace every occurrence"), False),
            *reference.EDIT_ARGS,
            WS,
        ),
        reference.edit_text,
        CHANGES,
        call=reference.edit_many,
        output=reference.EDIT_OUTPUT,
    ),
    Tool(
        "modify_file",
        "cmd.modify",
        "Change a text file by line numbers (replace, insert, delete line ranges) or "
        "regex_replace, all operations at once or none. Line numbers are 1-based, of the file "
        "before the call: read_file with line_numbers shows them.",
        (
            Arg("path", FilePath),
            Arg(
                "operations",
                Operations,
                send=lambda ops: converted(ops, list[ModifyOperation], "operations"),
            ),
            WS,
        ),
        lambda a, r: texts.modified_text(a.path, r),
        CHANGES,
    ),
    Tool(
        "grep",
        "qry.grep",
        "Search file contents for a regular expression (Python syntax), or plain text with "
        "literal. Answers 'path:line: text' per match (100 by default), with context_lines "
        "around each as 'path-line- text'.",
        (
            Arg("pattern", described(str, "Regular expression, or text", min_length=1)),
            DIR,
            Arg("literal", described(bool, "Match pattern as plain text"), False),
            Arg("ignore_case", bool, False),
            Arg("include", described(list[str] | None, "Only files matching (*.py)"), None),
            Arg("exclude", Globs, None),
            Arg("context_lines", Annotated[int, Field(ge=0, le=50)], 0),
            Arg("max_results", MostResults, None),
            WS,
        ),
        lambda a, r: texts.grep_text(a.pattern, a.path, r),
        READ_ONLY,
    ),
    Tool(
        "explore_files",
        "qry.explore",
        "The entries under a directory, or with recursive all to max_depth, directories "
        "first; metadata adds sizes and times. node_modules, .git... are skipped unless "
        "exclude is [].",
        (
            DIR,
            Arg("recursive", bool, False),
            Arg("max_depth", Depth, 3),
            Arg("exclude", Globs, None),
            Arg("metadata", bool, False),
            Arg("max_results", MostResults, None),
            WS,
        ),
        lambda a, r: texts.tree_text(a.path, r),
        READ_ONLY,
    ),
    Tool(
        "delete_file",
        "cmd.delete",
        "Delete a file, or a directory (a non-empty one with recursive). It stays in the "
        "history: restore brings it back.",
        (
            Arg("path", described(str, "File or directory to delete")),
            Arg("recursive", described(bool, "Delete a directory's contents"), False),
            WS,
        ),
        lambda a, r: texts.deleted_text(a.path, r),
        REPLACES,
    ),
    Tool(
        "move_file",
        "cmd.move",
        "Move or rename a file or directory; missing parents are created. An existing "
        "destination file is replaced only with overwrite, a directory never.",
        (
            Arg("source", described(str, "The path to move"), to="path"),
            Arg("destination", described(str, "Its new path"), to="to"),
            Arg("overwrite", bool, False),
            WS,
        ),
        lambda a, r: texts.moved_text(r),
        CHANGES,
        path="source",
        detail=lambda a: f"to {a.destination}",
    ),
    Tool(
        "file_history",
        "qry.history",
        "The versions of a file across its moves (created, modified, moved, deleted) or, "
        "without path, of the workspace, newest first: the numbers diff and restore take.",
        (
            Arg("path", Only, None),
            Arg("limit", Annotated[int, Field(ge=1, le=1000)], 20),
            Arg("before", described(int | None, "Older than this version", ge=1), None),
            Arg("follow", bool, True),
            WS,
        ),
        lambda a, r: texts.history_text(a.path, r),
        READ_ONLY,
    ),
    Tool(
        "diff",
        "qry.diff",
        "Unified diff of a file, a directory or (without path) the workspace between two "
        "versions (to_version: default the latest).",
        (
            Arg("from_version", Version),
            Arg("to_version", Annotated[int | None, Field(ge=1)], None),
            Arg("path", Only, None),
            Arg("context_lines", Annotated[int, Field(ge=0, le=100)], 3),
            WS,
        ),
        lambda a, r: texts.diff_text(a.path, r),
        READ_ONLY,
    ),
    Tool(
        "restore",
        "cmd.restore",
        "Bring a file, a directory or (without path) the workspace back to how it was at a "
        "version, as a new version (nothing is lost; it can be undone).",
        (Arg("version", Version), Arg("path", Only, None), WS),
        lambda a, r: texts.restored_text(a.path, a.version, r),
        REPLACES,
    ),
    Tool(
        "get_workspace_info",
        "qry.info",
        "The workspace's version, counts, size, limits and the directories searches skip.",
        (WS,),
        lambda a, r: texts.info_text(r),
        READ_ONLY,
    ),
    command_tool("execute_command", COMMAND),
    command_tool("bash", ALIAS),
    *commands.TOOLS,
    Tool(
        "git",
        "exec.git",
        "Git in the workspace. action: status, diff, commit (message; files, default all), "
        "checkout (branch; created if missing), branch, log (limit), push / pull (remote, "
        "branch; the service's credentials), clone (url, into workdir).",
        (
            Arg("action", GitAction),
            Arg("message", str | None, None),
            Arg("files", list[str] | None, None),
            Arg("branch", str | None, None),
            Arg("remote", str, "origin"),
            Arg("url", str | None, None),
            Arg("path", described(str | None, "diff/log: only this path"), None),
            Arg("limit", Annotated[int, Field(ge=1, le=1000)], 20),
            Arg("workdir", described(str, "The repository's directory"), ""),
            WS,
        ),
        lambda a, r: command_texts.git_text(r),
        OPEN,
        path="workdir",
        detail=lambda a: f"git {a.action}",
    ),
)
"""Quill's tools: edit_file, modify_file, grep, explore_files, delete_file, move_file,
file_history, diff, restore, get_workspace_info, execute_command (and its alias bash),
read_command_output, write_stdin, send_signal, list_commands (``commands``), git."""
