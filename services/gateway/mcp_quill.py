"""MCP at ``/mcp``: Quill's tools beyond the workspace tool's six (edits, search, history,
commands, git)."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field, WithJsonSchema

from contracts.requests import GitAction, ModifyOperation, OutputStream
from quill.client import Workspace
from services.gateway import texts
from services.gateway.tooling import (
    Answer,
    Ctx,
    Done,
    Tools,
    builtins,
    converted,
    inline_schema,
)

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
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
CHANGES = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)
OPEN = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=True)


def register(server: MCPServer, tools: Tools) -> None:
    """Quill's tools: edit_file, modify_file, grep, explore_files, delete_file, move_file,
    file_history, diff, restore, get_workspace_info, execute_command (and bash),
    read_command_output, git."""

    @server.tool(
        description=(
            "Replace an exact piece of text in a file. old_string must match exactly "
            "(whitespace and indentation included) and occur once, unless replace_all is true. "
            "Errors: 'oldString not found in content', followed by the closest text in the "
            "file, its line and how it differs (e.g. whitespace: copy the text exactly as the "
            "file has it; it is never applied for you); 'Found multiple matches for oldString', "
            "followed by the lines it occurs on (add surrounding lines to old_string, or set "
            "replace_all)."
        ),
        annotations=CHANGES,
    )
    async def edit_file(
        ctx: Ctx,
        path: FilePath,
        old_string: Annotated[str, Field(min_length=1, description="The exact text to replace")],
        new_string: Annotated[str, Field(description="The replacement text (used literally)")],
        replace_all: Annotated[bool, Field(description="Replace every occurrence")] = False,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.edit(path, old_string, new_string, replace_all=replace_all)
            if not r.committed:
                return Done(texts.unchanged_text(path, "the edit", r.file_version), builtins(r))
            text = (
                f"Edited {path}: {texts.plural(r.replacements, 'replacement')}, "
                f"{texts.plural(r.lines_changed, 'line')} changed (file version {r.file_version})"
            )
            return Done(text, builtins(r))

        return await tools.call(ctx, "edit_file", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "Change a text file by line numbers or regular expressions, all operations at once "
            "(all or nothing): replace, insert or delete line ranges, or regex_replace. Read "
            "the file first to know its line numbers. Operations that leave the text as it was "
            "(inserting an empty text) answer 'No changes' and make no new version."
        ),
        annotations=CHANGES,
    )
    async def modify_file(
        ctx: Ctx, path: FilePath, operations: Operations, workspace: WorkspaceName = None
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            ops = converted(operations, list[ModifyOperation], "operations")
            r = await ws.modify(path, ops)
            if not r.committed:
                what = texts.plural(r.operations, "operation")
                return Done(texts.unchanged_text(path, what, r.file_version), builtins(r))
            text = (
                f"Modified {path}: {texts.plural(r.operations, 'operation')}, "
                f"{texts.plural(r.replacements, 'regex replacement')}, {r.lines_before} -> "
                f"{r.lines_after} lines (file version {r.file_version})"
            )
            return Done(text, builtins(r))

        return await tools.call(ctx, "modify_file", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "Search file contents for a regular expression (Python syntax) or, with literal, "
            "plain text. Answers one 'path:line: text' line per match (100 at most by default), "
            "with context_lines lines around each as 'path-line- text'. include limits the "
            "search to files matching globs (*.py matches at any depth)."
        ),
        annotations=READ_ONLY,
    )
    async def grep(
        ctx: Ctx,
        pattern: Annotated[str, Field(min_length=1, description="Regular expression or text")],
        path: Annotated[str, Field(description=P_DIR)] = ".",
        literal: Annotated[bool, Field(description="Match pattern as plain text")] = False,
        ignore_case: bool = False,
        include: Annotated[list[str] | None, Field(description="Only files matching")] = None,
        exclude: Globs = None,
        context_lines: Annotated[int, Field(ge=0, le=50)] = 0,
        max_results: Annotated[int | None, Field(ge=1, le=10_000)] = None,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.grep(
                pattern,
                path,
                literal=literal,
                ignore_case=ignore_case,
                include=include,
                exclude=exclude,
                context_lines=context_lines,
                max_results=max_results,
            )
            return Done(texts.grep_text(pattern, path, r), builtins(r))

        return await tools.call(ctx, "grep", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "Show the tree under a directory: its entries, or with recursive everything down "
            "to max_depth levels, directories before files. metadata adds sizes and times. "
            "node_modules, .git and other build directories are skipped unless exclude is []."
        ),
        annotations=READ_ONLY,
    )
    async def explore_files(
        ctx: Ctx,
        path: Annotated[str, Field(description=P_DIR)] = ".",
        recursive: bool = False,
        max_depth: Annotated[int, Field(ge=1, le=100)] = 3,
        exclude: Globs = None,
        metadata: Annotated[bool, Field(description="Include sizes and times")] = False,
        max_results: Annotated[int | None, Field(ge=1, le=10_000)] = None,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.explore(
                path,
                recursive=recursive,
                max_depth=max_depth,
                exclude=exclude,
                metadata=metadata,
                max_results=max_results,
            )
            return Done(texts.tree_text(path, r), builtins(r))

        return await tools.call(ctx, "explore_files", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "Delete a file, or a directory (a non-empty one only with recursive). The content "
            "stays in the history: restore can bring it back."
        ),
        annotations=CHANGES,
    )
    async def delete_file(
        ctx: Ctx,
        path: Annotated[str, Field(description="File or directory to delete")],
        recursive: Annotated[bool, Field(description="Delete a directory's contents")] = False,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.delete(path, recursive=recursive)
            return Done(f"Deleted {path} ({texts.plural(r.deleted, 'entry')} removed)", builtins(r))

        return await tools.call(ctx, "delete_file", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "Move or rename a file or directory (with everything below it); missing parents of "
            "the destination are created. An existing destination file is replaced only with "
            "overwrite; a directory never is."
        ),
        annotations=CHANGES,
    )
    async def move_file(
        ctx: Ctx,
        source: Annotated[str, Field(description="The path to move")],
        destination: Annotated[str, Field(description="Its new path")],
        overwrite: bool = False,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.move(source, destination, overwrite=overwrite)
            return Done(f"Moved {r.path} to {r.to} ({texts.plural(r.moved, 'entry')})", builtins(r))

        return await tools.call(
            ctx, "move_file", go, path=source, workspace=workspace, detail=f"to {destination}"
        )

    @server.tool(
        description=(
            "The history of a file (every version: created, modified, moved, deleted, with "
            "sizes and etags) or, without path, of the whole workspace; newest first. The "
            "version numbers are what diff and restore take."
        ),
        annotations=READ_ONLY,
    )
    async def file_history(
        ctx: Ctx,
        path: Annotated[str | None, Field(description="Omit for the workspace")] = None,
        limit: Annotated[int, Field(ge=1, le=1000)] = 20,
        before: Annotated[int | None, Field(ge=1, description="Older than this version")] = None,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.history(path, limit=limit, before=before)
            return Done(texts.history_text(path, r), builtins(r))

        return await tools.call(ctx, "file_history", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "Unified diff of a file, a directory or (without path) the whole workspace between "
            "two workspace versions (to_version defaults to the latest). Versions come from "
            "file_history."
        ),
        annotations=READ_ONLY,
    )
    async def diff(
        ctx: Ctx,
        from_version: Version,
        to_version: Annotated[int | None, Field(ge=1)] = None,
        path: Annotated[str | None, Field(description="Omit for the workspace")] = None,
        context_lines: Annotated[int, Field(ge=0, le=100)] = 3,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.diff(from_version, to_version, path, context_lines=context_lines)
            if not r.files:
                text = f"No changes between version {r.from_version} and {r.to_version}"
            else:
                text = (
                    f"Diff of {path or 'the workspace'} from version {r.from_version} to "
                    f"{r.to_version} ({texts.plural(len(r.files), 'file')} changed):\n\n{r.diff}"
                )
                if r.truncated:
                    text += "\n\n(diff truncated at the read limit: diff one file at a time)"
            return Done(text, builtins(r))

        return await tools.call(ctx, "diff", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "Bring a file, a directory or (without path) the whole workspace back to how it was "
            "at a workspace version. This is a new change: nothing is lost, and it can itself "
            "be undone."
        ),
        annotations=CHANGES,
    )
    async def restore(
        ctx: Ctx,
        version: Version,
        path: Annotated[str | None, Field(description="Omit for the workspace")] = None,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.restore(version, path)
            what = path or "the workspace"
            if r.committed:
                text = (
                    f"Restored {what} to version {version}: "
                    f"{texts.plural(r.changed_total, 'path')} changed"
                )
            else:
                text = f"Nothing to restore: {what} is already as it was at version {version}"
            return Done(text, builtins(r))

        return await tools.call(ctx, "restore", go, path=path, workspace=workspace)

    @server.tool(
        description=(
            "The workspace's version, file and directory counts, size, limits (largest file, "
            "read and search limits) and the directories searches skip."
        ),
        annotations=READ_ONLY,
    )
    async def get_workspace_info(ctx: Ctx, workspace: WorkspaceName = None) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.info()
            return Done(texts.info_text(r), builtins(r))

        return await tools.call(ctx, "get_workspace_info", go, workspace=workspace)

    command_description = (
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

    async def run_command(
        ctx: Ctx,
        tool: str,
        command: str,
        workdir: str,
        timeout_ms: int | None,
        env: dict[str, str] | None,
        workspace: str | None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.exec(command, workdir=workdir, timeout_ms=timeout_ms, env=env)
            return Done(texts.command_text(r), builtins(r))

        return await tools.call(
            ctx, tool, go, path=workdir or None, workspace=workspace, detail=command
        )

    @server.tool(description=command_description, annotations=OPEN)
    async def execute_command(
        ctx: Ctx,
        command: Command,
        workdir: Workdir = "",
        timeout_ms: Timeout = None,
        env: Env = None,
        workspace: WorkspaceName = None,
    ) -> Answer:
        return await run_command(
            ctx, "execute_command", command, workdir, timeout_ms, env, workspace
        )

    @server.tool(description=command_description + " (The same tool as execute_command.)")
    async def bash(
        ctx: Ctx,
        command: Command,
        workdir: Workdir = "",
        timeout_ms: Timeout = None,
        env: Env = None,
        workspace: WorkspaceName = None,
    ) -> Answer:
        return await run_command(ctx, "bash", command, workdir, timeout_ms, env, workspace)

    @server.tool(
        description=(
            "Read a part of a command's whole output by the command's id (execute_command "
            "shows a long stream's first and last part and gives the exact call for the middle): "
            "length bytes from byte offset of stdout or stderr. Output is kept for an hour "
            "after the command ends."
        ),
        annotations=READ_ONLY,
    )
    async def read_command_output(
        ctx: Ctx,
        command_id: Annotated[
            str,
            Field(
                pattern=r"^[A-Za-z0-9._:-]{1,128}$",
                description="The command's id, as execute_command's answer gives it",
            ),
        ],
        stream: Annotated[OutputStream, Field(description="stdout or stderr")] = "stdout",
        offset: Annotated[int, Field(ge=0, description="First byte to read")] = 0,
        length: Annotated[
            int, Field(ge=1, le=1024 * 1024, description="Most bytes to read (default 65536)")
        ] = 64 * 1024,
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.command_output(command_id, stream=stream, offset=offset, length=length)
            return Done(texts.command_output_text(r), builtins(r))

        return await tools.call(
            ctx, "read_command_output", go, workspace=workspace, detail=command_id
        )

    @server.tool(
        description=(
            "Git on the repository in the workspace (its .git is part of the workspace). "
            "action: status (staged, unstaged, untracked files, branch), diff (staged and "
            "unstaged), commit (message; files to stage, default all changes), checkout "
            "(branch; created if missing), branch (list), log (limit), push / pull (remote, "
            "branch; credentials are the service's, never yours to see), clone (url into "
            "workdir)."
        ),
        annotations=OPEN,
    )
    async def git(
        ctx: Ctx,
        action: GitAction,
        message: Annotated[str | None, Field(description="commit: the message")] = None,
        files: Annotated[list[str] | None, Field(description="commit: paths to stage")] = None,
        branch: Annotated[str | None, Field(description="checkout/push/pull")] = None,
        remote: Annotated[str, Field(description="push/pull")] = "origin",
        url: Annotated[str | None, Field(description="clone: the repository URL")] = None,
        path: Annotated[str | None, Field(description="diff/log: only this path")] = None,
        limit: Annotated[int, Field(ge=1, le=1000, description="log: commits")] = 20,
        workdir: Annotated[str, Field(description="The repository's directory")] = "",
        workspace: WorkspaceName = None,
    ) -> Answer:
        async def go(ws: Workspace) -> Done:
            r = await ws.git(
                action,
                workdir=workdir,
                message=message,
                files=files,
                branch=branch,
                remote=remote,
                url=url,
                path=path,
                limit=limit,
            )
            return Done(texts.git_text(r), builtins(r))

        return await tools.call(
            ctx, "git", go, path=workdir or None, workspace=workspace, detail=f"git {action}"
        )
