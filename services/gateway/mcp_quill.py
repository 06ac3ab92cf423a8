"""MCP at ``/mcp``: Quill's tools beyond the workspace tool's six (edits, search, history,
commands, git), as rows of ``optable`` (each is one op)."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.types import ToolAnnotations
from pydantic import Field, WithJsonSchema

from contracts.requests import GitAction, ModifyOperation, OutputStream
from services.gateway import texts
from services.gateway.optable import Arg, Tool, described
from services.gateway.tooling import converted, inline_schema

P_FILE = "File path relative to /workspace (or absolute path within /workspace)"
P_DIR = "Directory path relative to /workspace; . is the root"
P_WS = "Optional: another workspace of your tenant (its id). Omit to use your own."

FilePath = Annotated[str, Field(description=P_FILE)]
WorkspaceName = Annotated[str | None, Field(description=P_WS)]
Globs = Annotated[
    list[str] | None,
    Field(description="Glob patterns to leave out (default: node_modules, .git, dist...)"),
]
Version = Annotated[int, Field(ge=1, description="A workspace version (1 is its creation)")]
Operations = Annotated[
    list[dict[str, Any]],
    WithJsonSchema(inline_schema(list[ModifyOperation])),
    Field(
        description=(
            "Operations, each an object tagged by type: "
            '{"type": "replace", "start_line", "end_line", "new_content"}, '
            '{"type": "insert", "after_line", "new_content"} (after_line 0: at the top), '
            '{"type": "delete", "start_line", "end_line"}, '
            '{"type": "regex_replace", "pattern", "replacement", "flags"} (flags: g i m s x; '
            "$1 and $<name> in the replacement name groups). Line numbers are 1-based and refer "
            "to the file before the call; line operations must not overlap."
        )
    ),
]
Command = Annotated[str, Field(min_length=1, description="The shell command line")]
Workdir = Annotated[str, Field(description="Working directory inside /workspace (default: root)")]
Timeout = Annotated[int | None, Field(ge=1, le=600_000, description="Milliseconds (default 30000)")]
Env = Annotated[dict[str, str] | None, Field(description="Extra environment variables")]
CommandId = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9._:-]{1,128}$",
        description="The command's id, as execute_command's answer gives it",
    ),
]
OutputLength = Annotated[
    int, Field(ge=1, le=1024 * 1024, description="Most bytes to read (default 65536)")
]
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
CHANGES = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)
OPEN = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=True)


COMMAND = (
    "Run a shell command (bash -c) in the workspace's sandbox: the workspace is the "
    "current directory (/workspace), there is no network, and the command is stopped at "
    "timeout_ms (SIGTERM, then SIGKILL 5 s later). Answers the exit code and stdout and "
    "stderr separately; a stream over 50 KB shows its first and last 25 KB with the size "
    "of the middle left out, which read_command_output reads (the answer gives the exact "
    "call; kept for an hour). A non-zero exit code is an answer, not an error. Files the "
    "command creates, changes or deletes are committed to the workspace as one new "
    "version (node_modules, .venv, __pycache__ and the like are kept out). Each command "
    "is a fresh shell: cd, export and /tmp do not carry over to the next one (chain steps "
    "with && in one command); processes left running (cmd &) are killed when it ends "
    "(the answer says so); stdin is closed, so a prompt (read -p, input()) gets end of "
    "file (the answer says so: pass input with a pipe or a --yes flag); python is "
    "python3."
    " Only committed files are visible to the file tools; files a command made that "
    "could not be committed (too large, symlinks, invalid names) are listed in its reply."
)
Only = Annotated[str | None, Field(description="Omit for the workspace")]
Depth = Annotated[int, Field(ge=1, le=100)]
MostResults = Annotated[int | None, Field(ge=1, le=10_000)]
DIR = Arg("path", described(str, P_DIR), ".")
WS = Arg("workspace", WorkspaceName, None)
COMMAND_ARGS = (
    Arg("command", Command),
    Arg("workdir", Workdir, ""),
    Arg("timeout_ms", Timeout, None),
    Arg("env", Env, None),
    WS,
)
TOOLS = (
    Tool(
        "edit_file",
        "cmd.edit",
        "Replace an exact piece of text in a file. old_string must match exactly "
        "(whitespace and indentation included) and occur once, unless replace_all is true. "
        "Errors: 'oldString not found in content', followed by the closest text in the "
        "file, its line and how it differs (e.g. whitespace: copy the text exactly as the "
        "file has it; it is never applied for you); 'Found multiple matches for oldString', "
        "followed by the lines it occurs on (add surrounding lines to old_string, or set "
        "replace_all).",
        (
            Arg("path", FilePath),
            Arg("old_string", described(str, "The exact text to replace", min_length=1)),
            Arg("new_string", described(str, "The replacement text (used literally)")),
            Arg("replace_all", described(bool, "Replace every occurrence"), False),
            WS,
        ),
        lambda a, r: texts.edited_text(a.path, r),
        CHANGES,
    ),
    Tool(
        "modify_file",
        "cmd.modify",
        "Change a text file by line numbers or regular expressions, all operations at once "
        "(all or nothing): replace, insert or delete line ranges, or regex_replace. Read "
        "the file first to know its line numbers. Operations that leave the text as it was "
        "(inserting an empty text) answer 'No changes' and make no new version.",
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
        "Search file contents for a regular expression (Python syntax) or, with literal, "
        "plain text. Answers one 'path:line: text' line per match (100 at most by default), "
        "with context_lines lines around each as 'path-line- text'. include limits the "
        "search to files matching globs (*.py matches at any depth).",
        (
            Arg("pattern", described(str, "Regular expression or text", min_length=1)),
            DIR,
            Arg("literal", described(bool, "Match pattern as plain text"), False),
            Arg("ignore_case", bool, False),
            Arg("include", described(list[str] | None, "Only files matching"), None),
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
        "Show the tree under a directory: its entries, or with recursive everything down "
        "to max_depth levels, directories before files. metadata adds sizes and times. "
        "node_modules, .git and other build directories are skipped unless exclude is [].",
        (
            DIR,
            Arg("recursive", bool, False),
            Arg("max_depth", Depth, 3),
            Arg("exclude", Globs, None),
            Arg("metadata", described(bool, "Include sizes and times"), False),
            Arg("max_results", MostResults, None),
            WS,
        ),
        lambda a, r: texts.tree_text(a.path, r),
        READ_ONLY,
    ),
    Tool(
        "delete_file",
        "cmd.delete",
        "Delete a file, or a directory (a non-empty one only with recursive). The content "
        "stays in the history: restore can bring it back.",
        (
            Arg("path", described(str, "File or directory to delete")),
            Arg("recursive", described(bool, "Delete a directory's contents"), False),
            WS,
        ),
        lambda a, r: texts.deleted_text(a.path, r),
        CHANGES,
    ),
    Tool(
        "move_file",
        "cmd.move",
        "Move or rename a file or directory (with everything below it); missing parents of "
        "the destination are created. An existing destination file is replaced only with "
        "overwrite; a directory never is.",
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
        "The history of a file (every version: created, modified, moved, deleted, with "
        "sizes and etags) or, without path, of the whole workspace; newest first. The "
        "version numbers are what diff and restore take.",
        (
            Arg("path", Only, None),
            Arg("limit", Annotated[int, Field(ge=1, le=1000)], 20),
            Arg("before", described(int | None, "Older than this version", ge=1), None),
            WS,
        ),
        lambda a, r: texts.history_text(a.path, r),
        READ_ONLY,
    ),
    Tool(
        "diff",
        "qry.diff",
        "Unified diff of a file, a directory or (without path) the whole workspace between "
        "two workspace versions (to_version defaults to the latest). Versions come from "
        "file_history.",
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
        "Bring a file, a directory or (without path) the whole workspace back to how it was "
        "at a workspace version. This is a new change: nothing is lost, and it can itself "
        "be undone.",
        (Arg("version", Version), Arg("path", Only, None), WS),
        lambda a, r: texts.restored_text(a.path, a.version, r),
        CHANGES,
    ),
    Tool(
        "get_workspace_info",
        "qry.info",
        "The workspace's version, file and directory counts, size, limits (largest file, "
        "read and search limits) and the directories searches skip.",
        (WS,),
        lambda a, r: texts.info_text(r),
        READ_ONLY,
    ),
    Tool(
        "execute_command",
        "exec.run",
        COMMAND,
        COMMAND_ARGS,
        lambda a, r: texts.command_text(r),
        OPEN,
        path="workdir",
        detail=lambda a: a.command,
    ),
    Tool(
        "bash",
        "exec.run",
        COMMAND + " (The same tool as execute_command.)",
        COMMAND_ARGS,
        lambda a, r: texts.command_text(r),
        path="workdir",
        detail=lambda a: a.command,
    ),
    Tool(
        "read_command_output",
        "exec.output",
        "Read a part of a command's whole output by the command's id (execute_command "
        "shows a long stream's first and last part and gives the exact call for the middle): "
        "length bytes from byte offset of stdout or stderr. Output is kept for an hour "
        "after the command ends.",
        (
            Arg("command_id", CommandId),
            Arg("stream", described(OutputStream, "stdout or stderr"), "stdout"),
            Arg("offset", described(int, "First byte to read", ge=0), 0),
            Arg("length", OutputLength, 64 * 1024),
            WS,
        ),
        lambda a, r: texts.command_output_text(r),
        READ_ONLY,
        path=None,
        detail=lambda a: a.command_id,
    ),
    Tool(
        "git",
        "exec.git",
        "Git on the repository in the workspace (its .git is part of the workspace). "
        "action: status (staged, unstaged, untracked files, branch), diff (staged and "
        "unstaged), commit (message; files to stage, default all changes), checkout "
        "(branch; created if missing), branch (list), log (limit), push / pull (remote, "
        "branch; credentials are the service's, never yours to see), clone (url into "
        "workdir).",
        (
            Arg("action", GitAction),
            Arg("message", described(str | None, "commit: the message"), None),
            Arg("files", described(list[str] | None, "commit: paths to stage"), None),
            Arg("branch", described(str | None, "checkout/push/pull"), None),
            Arg("remote", described(str, "push/pull"), "origin"),
            Arg("url", described(str | None, "clone: the repository URL"), None),
            Arg("path", described(str | None, "diff/log: only this path"), None),
            Arg("limit", described(int, "log: commits", ge=1, le=1000), 20),
            Arg("workdir", described(str, "The repository's directory"), ""),
            WS,
        ),
        lambda a, r: texts.git_text(r),
        OPEN,
        path="workdir",
        detail=lambda a: f"git {a.action}",
    ),
)
"""Quill's tools: edit_file, modify_file, grep, explore_files, delete_file, move_file,
file_history, diff, restore, get_workspace_info, execute_command (and bash),
read_command_output, git."""
