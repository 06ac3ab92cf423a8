"""What the MCP tools say to a model: the workspace tool's output formats and error texts.

The text a tool answers a ``QuillError`` with (seed 000's wording) is, the most specific
first: the tool's own words for the code (``TOOL_TEXTS[(code, tool)]``), the code's text in
the gateway's one error table (``services/gateway/errors.py``, every door's), the tool's words
for any failure (``TOOL_TEXTS[("*", tool)]``), then ``Error: <message>``. A workspace the
caller may not reach reads "Workspace not found: <as named>" whether or not it exists, in the
text as in ``structuredContent`` (``workspace_unknown``).

Why one module of ~500 lines: everything a model reads (each tool's answer, every error) is
here, so that the wording is reviewed and kept consistent in one place, and the tool tables
(``files``, ``quill_tools``) only point at it; split by tool, one voice would be scattered
over a dozen files that each hold a few lines.
"""

from __future__ import annotations

from datetime import datetime

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from contracts.uncommitted import said
from core.words import plural
from services.gateway import errors

E = ErrorCode
ANY = "*"

TOOL_TEXTS: dict[tuple[str, str], str] = {
    (E.FILE_NOT_FOUND, "list_directory"): "Error: Directory not found: {path}",
    (E.FILE_NOT_FOUND, "search_files"): "Error: Directory not found: {path}",
    (E.FILE_NOT_FOUND, "explore_files"): "Error: Directory not found: {path}",
    (E.FILE_NOT_FOUND, "directory_tree"): "Error: Directory not found: {path}",
    (E.FILE_NOT_FOUND, "list_directory_with_sizes"): "Error: Directory not found: {path}",
    (E.FILE_NOT_FOUND, "grep"): "Error: Path not found: {path}",  # a file or a directory
    (E.FILE_NOT_FOUND, "execute_command"): "Error: Directory not found: {path}",
    (E.FILE_NOT_FOUND, "bash"): "Error: Directory not found: {path}",
    (E.FILE_NOT_FOUND, "git"): "Error: Directory not found: {path}",
    (E.FILE_NOT_FOUND, "get_file_info"): "Error: Path not found: {path}",
    (E.FILE_NOT_FOUND, "delete_file"): "Error: Path not found: {path}",
    (E.FILE_NOT_FOUND, "move_file"): "Error: {message}",
    (E.FILE_NOT_FOUND, "get_workspace_info"): "Error: Workspace not found: {workspace}",
    (E.FILE_NOT_FOUND, "write_file"): "Error: Failed to write file - {message}",
    (E.FILE_NOT_FOUND, "create_directory"): "Error: Failed to create directory - {message}",
    (E.FILE_NOT_FOUND, "attach_workspace"): "Error: {message}",
    (E.FILE_NOT_FOUND, "detach_workspace"): "Error: {message}",
    (E.ACCESS_DENIED, "attach_workspace"): "Error: {message}",
    (E.ACCESS_DENIED, "archive_workspace"): "Error: {message}",
    (E.FILE_NOT_FOUND, "list_workspaces"): "Error: Workspace not found: {workspace}",
    (E.FILE_NOT_FOUND, "read_command_output"): "Error: {message}",
    (E.FILE_NOT_FOUND, "wait_for_approval"): "Error: {message}",
    (E.NOT_A_FILE, "write_file"): "Error: Failed to write file - {message}",
    (E.NOT_A_DIRECTORY, "create_directory"): "Error: Path exists but is not a directory: {path}",
    (E.NOT_A_DIRECTORY, "write_file"): "Error: Failed to create parent directory - {message}",
    (E.NOT_A_DIRECTORY, "move_file"): "Error: {message}",
    (ANY, "write_file"): "Error: Failed to write file - {message}",
    (ANY, "create_directory"): "Error: Failed to create directory - {message}",
    (ANY, "get_file_info"): "Error: Failed to get file info - {message}",
    (ANY, "search_files"): "Error: Search failed - {message}",
}
"""A tool's own words: for one code (``(code, tool)``) or for any failure (``("*", tool)``)."""
ANY_TEXT = "Error: {message}"
"""The text of a failure nothing else words."""


def error_text(tool: str, error: QuillError, path: str | None, workspace: str) -> str:
    """The text ``tool`` answers ``error`` with; ``path`` as the caller gave it."""
    code = str(error.code)
    template = (
        TOOL_TEXTS.get((code, tool))
        or (errors.TABLE[code].text if code in errors.TABLE else None)
        or TOOL_TEXTS.get((ANY, tool))
        or ANY_TEXT
    )
    shown = path if path not in (None, "") else "."
    text = template.format(path=shown, message=error.message, workspace=workspace)
    asked = error.details.get("path") if error.details else None
    extra = said(error.details, str(asked)) if "{message}" not in template else None
    return f"{text}: {extra}" if extra else text


def workspace_unknown(error: QuillError, workspace: str) -> QuillError:
    """A workspace the caller may not reach, said as the caller named it and nothing more (the
    same whether or not it exists, and whoever refused it); other errors as they are."""
    if error.code != E.WORKSPACE_NOT_FOUND:
        return error
    details = error.details or {}
    key = "uri" if "uri" in details else "workspace"
    named = str(details.get(key) or workspace)
    return QuillError(E.WORKSPACE_NOT_FOUND, f"Workspace not found: {named}", {key: named})


# ---------------------------------------------------------------- output formats


def size_text(size: int) -> str:
    """Human size, as the workspace tool prints it: ``512 B``, ``1.23 KB``, ``4.00 MB``."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KB", "MB", "GB", "TB"):
        value /= 1024
        if value < 1024 or unit == "TB":
            break
    return f"{value:.2f} {unit}"


def stamp(moment: datetime) -> str:
    """``YYYY-MM-DD HH:MM:SS UTC``."""
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def listing_text(path: str, listing: rp.Listing, after: str | None = None) -> str:
    """``Contents of <path>:``, a blank line, ``[DIR]`` lines then ``[FILE]`` lines; a page
    that is not the last says how many entries there are and how to get the next page."""
    if not listing.entries:
        if after is not None:
            return f"No more entries in {path} after {after!r} (the directory has {listing.total})"
        return f"Directory is empty: {path}"
    dirs = [f"[DIR] {e.name}" for e in listing.entries if e.kind == "directory"]
    files = [f"[FILE] {e.name}" for e in listing.entries if e.kind == "file"]
    text = f"Contents of {path}:\n\n" + "\n".join(dirs + files)
    if listing.truncated:
        text += (
            f"\n\n(this page shows {len(listing.entries)} of the {listing.total} entries; more "
            f'follow: call list_directory again with after="{listing.next}" for the next page)'
        )
    return text


def write_text(path: str, r: rp.FileWritten) -> str:
    """``write_file``'s answer: the bytes written and what they replaced, or that the file
    already had this content (no new version)."""
    if not r.committed:
        return (
            f"No changes: {path} already has this content ({plural(r.size, 'byte')}, file "
            f"version {r.file_version}); no new version was made"
        )
    text = f"Successfully wrote {r.bytes_written} bytes to {path}"
    if r.previous_size is not None:
        text += f", replacing its previous content ({plural(r.previous_size, 'byte')})"
    return text


def unchanged_text(path: str, what: str, file_version: int) -> str:
    """A change that changes nothing: the file is as it was after ``what`` (``the edit``)."""
    return (
        f"No changes: {path} is as it was after {what} (file version {file_version}); no new "
        "version was made"
    )


def mkdir_text(path: str, r: rp.DirectoryMade) -> str:
    """``create_directory``'s answer: made, or already there."""
    verb = "Successfully created directory" if r.created else "Directory exists"
    return f"{verb}: {path}"


def edited_text(path: str, r: rp.FileEdited) -> str:
    """``edit_file``'s answer: how many replacements and lines, or no change."""
    if not r.committed:
        return unchanged_text(path, "the edit", r.file_version)
    return (
        f"Edited {path}: {plural(r.replacements, 'replacement')}, "
        f"{plural(r.lines_changed, 'line')} changed (file version {r.file_version})"
    )


def modified_text(path: str, r: rp.FileModified) -> str:
    """``modify_file``'s answer: operations, regex replacements, lines before and after."""
    if not r.committed:
        return unchanged_text(path, plural(r.operations, "operation"), r.file_version)
    return (
        f"Modified {path}: {plural(r.operations, 'operation')}, "
        f"{plural(r.replacements, 'regex replacement')}, {r.lines_before} -> "
        f"{r.lines_after} lines (file version {r.file_version})"
    )


def deleted_text(path: str, r: rp.PathDeleted) -> str:
    """``delete_file``'s answer."""
    return f"Deleted {path} ({plural(r.deleted, 'entry')} removed)"


def moved_text(r: rp.PathMoved) -> str:
    """``move_file``'s answer."""
    return f"Moved {r.path} to {r.to} ({plural(r.moved, 'entry')})"


def diff_text(path: str | None, r: rp.Diff) -> str:
    """``diff``'s answer: the unified diff, or that nothing changed."""
    if not r.files:
        return f"No changes between version {r.from_version} and {r.to_version}"
    text = (
        f"Diff of {path or 'the workspace'} from version {r.from_version} to "
        f"{r.to_version} ({plural(len(r.files), 'file')} changed):\n\n{r.diff}"
    )
    if r.truncated:
        text += "\n\n(diff truncated at the read limit: diff one file at a time)"
    return text


def restored_text(path: str | None, version: int, r: rp.Restored) -> str:
    """``restore``'s answer: how many paths changed, or that none had to."""
    what = path or "the workspace"
    if r.committed:
        return f"Restored {what} to version {version}: {plural(r.changed_total, 'path')} changed"
    return f"Nothing to restore: {what} is already as it was at version {version}"


def file_info_text(path: str, info: rp.FileInfo) -> str:
    """The ``get_file_info`` block (``Size`` for files, ``Entries`` for directories)."""
    lines = [f"Path: {path}", f"Type: {info.kind}"]
    if info.kind == "file":
        lines.append(f"Size: {size_text(info.size)}")
    lines += [
        f"Permissions: {info.permissions}",
        "Owner UID: 1000",
        "Owner GID: 1000",
        f"Created: {stamp(info.created)}",
        f"Modified: {stamp(info.modified)}",
        f"Accessed: {stamp(info.modified)}",
    ]
    if info.kind == "directory":
        lines.append(f"Entries: {info.entries or 0}")
    return "\n".join(lines)


def matches_text(pattern: str, path: str, matches: rp.Matches) -> str:
    """``Found N match(es) for '<pattern>':`` and ``[FILE]``/``[DIR]`` lines, or no matches."""
    if not matches.entries:
        return f"No matches found for pattern '{pattern}' in {path}"
    lines = [f"[{'DIR' if e.kind == 'directory' else 'FILE'}] {e.path}" for e in matches.entries]
    total = f"{matches.total}" if matches.total_exact else f"at least {matches.total}"
    text = f"Found {total} match(es) for '{pattern}':\n\n" + "\n".join(lines)
    if matches.truncated:
        text += (
            f"\n\n(showing {len(matches.entries)} of {total}: raise max_results or "
            "narrow the pattern)"
        )
    return text


def read_text(result: rp.FileContent) -> str:
    """A file's text, then, when a read limit cut the lines asked for, a ``[truncated: ...]``
    note: what is shown, what is not, and the ``read_file`` call that reads it (cut in turn,
    that call's note names the next)."""
    text = result.content or ""
    if result.returned_lines == 0 and result.total_lines:
        return f"{text}[no lines in this range: the file has {result.total_lines} lines]"
    cut = result.cut
    if cut is None:
        return text
    call = f"call read_file again with offset={cut.offset} limit={cut.limit}"
    if cut.char_offset:
        call += f" char_offset={cut.char_offset}"
    size = f"the file has {result.total_lines} lines, {result.size} bytes"
    if cut.line is not None:  # one line longer than a read returns, shown in part
        length = cut.line_length or 0
        shown_to = result.end_char if result.end_char is not None else length
        note = (
            f"[truncated: part of line {cut.line} shown ({size}); line {cut.line} has "
            f"{length} characters, more than one read returns ({cut.max} bytes): showing "
            f"characters {result.start_char}-{shown_to - 1} of it. Not shown: "
        )
        rest = _lines(cut.first_missing, cut.last_missing, but=cut.line)
        if result.start_char:  # a tail kept the line's end: its start, the lines before
            note += f"{rest}characters 0-{result.start_char - 1} of line {cut.line}"
            return f"{text}\n\n{note}; to read them, {call}]"
        note += f"characters {shown_to}-{length - 1} of line {cut.line}"
        note += f", {rest.removesuffix(', ')}" if rest else ""
        return f"{text}\n\n{note}; to read them, {call}]"
    last = result.start_line + result.returned_lines - 1
    note = (
        f"[truncated: {result.returned_lines} of {result.total_lines} lines shown, "
        f"the file has {result.size} bytes; "
    )
    limit = f"a read returns at most {cut.max} {cut.by}"
    note += f"showing lines {result.start_line}-{last} ({limit}). "
    missing = f"lines {cut.first_missing}-{cut.last_missing}"
    if cut.first_missing == cut.last_missing:
        missing = f"line {cut.first_missing}"
    return f"{text}\n\n{note}Not shown: {missing}; to read them, {call}]"


def _lines(first: int, last: int, but: int) -> str:
    """``lines a-b, `` of ``first..last`` without line ``but`` (at either end), or nothing."""
    if but == first:
        first += 1
    if but == last:
        last -= 1
    if first > last:
        return ""
    return f"line {first}, " if first == last else f"lines {first}-{last}, "


def grep_text(pattern: str, path: str, r: rp.GrepResult) -> str:
    if not r.matches:
        return f"No matches found for '{pattern}' in {path}"
    lines = [
        f"Found {plural(r.total, 'match')} for '{pattern}' in {plural(r.files_matched, 'file')}:",
        "",
    ]
    for m in r.matches:
        if m.before or m.after:
            lines.append("--")
        first = m.line - len(m.before)
        lines += [f"{m.path}-{first + i}- {text}" for i, text in enumerate(m.before)]
        lines.append(f"{m.path}:{m.line}: {m.text}")
        lines += [f"{m.path}-{m.line + 1 + i}- {text}" for i, text in enumerate(m.after)]
    if r.truncated:
        lines += ["", f"(showing {len(r.matches)} of {r.total}: narrow the pattern or the path)"]
    return "\n".join(lines)


def tree_text(path: str, r: rp.Tree) -> str:
    if not r.entries:
        return f"Directory is empty: {path}"
    lines = [f"Contents of {path} ({plural(r.total, 'entry')}):", ""]
    for e in r.entries:
        label = f"{'  ' * (e.depth - 1)}[{'DIR' if e.kind == 'directory' else 'FILE'}] {e.path}"
        if e.kind == "file" and e.size is not None:
            label += f" ({size_text(e.size)}"
            label += f", {stamp(e.modified)})" if e.modified else ")"
        lines.append(label)
    if r.truncated:
        lines += ["", f"(showing {len(r.entries)} of {r.total}: explore a subdirectory)"]
    return "\n".join(lines)


def history_text(path: str | None, r: rp.HistoryPage) -> str:
    if not r.revisions:
        return f"No history for {path or 'the workspace'}"
    lines = [f"History of {path or 'the workspace'} (newest first):", ""]
    for v in r.revisions:
        line = f"v{v.version} {stamp(v.at)} {v.op} {v.change} by {v.actor or '-'}"
        if v.size is not None:
            line += f", {size_text(v.size)}, etag {v.etag}"
        if v.moved_from:
            line += f", from {v.moved_from}"
        if v.path:
            line += f" (as {v.path})"
        if v.paths:
            line += f": {', '.join(v.paths[:10])}" + (" ..." if len(v.paths) > 10 else "")
        lines.append(line)
    if r.truncated:
        before = r.revisions[-1].version
        where = f'path="{r.next_path}", ' if r.next_path and r.next_path != path else ""
        lines += ["", f"(older revisions: call again with {where}before={before})"]
    return "\n".join(lines)


def info_text(r: rp.WorkspaceInfo) -> str:
    limits = r.limits
    return "\n".join(
        [
            f"Workspace: {r.workspace} (tenant {r.tenant})",
            f"Root: {r.root}",
            f"Version: {r.version}",
            f"Files: {r.files}, directories: {r.directories}, "
            f"total size: {size_text(r.total_bytes)}",
            f"Created: {stamp(r.created)}",
            f"Updated: {stamp(r.updated)}",
            f"Limits: files up to {size_text(limits.max_file_bytes)}, "
            f"{limits.max_files} files, reads up to {limits.max_read_lines} lines / "
            f"{size_text(limits.max_read_bytes)}, "
            f"{limits.max_directory_entries} entries per listing, "
            f"{limits.max_search_results} search results",
            f"Skipped by searches: {', '.join(r.default_exclusions)}",
        ]
    )


def changes_text(changes: rp.CapturedChanges | None) -> str:
    """What a command or git action did to the workspace's files."""
    if changes is None:
        return ""
    lines: list[str] = []
    if changes.committed:
        shown = ", ".join(f"{p.path} ({p.change})" for p in changes.paths[:20])
        more = changes.total - min(len(changes.paths), 20)
        lines.append(
            f"Committed {plural(changes.total, 'changed path')} as version {changes.version}: "
            f"{shown}{f' and {more} more' if more > 0 else ''}"
        )
    for c in changes.conflicts:
        lines.append(f"Not committed: {c.path} ({c.reason}; someone changed it meanwhile)")
    for s in changes.skipped:
        lines.append(f"Not committed: {s.path} ({s.reason})")
    if changes.ignored:
        total = max(changes.ignored_total, len(changes.ignored))
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(changes.ignored_reasons.items()))
        more = total - len(changes.ignored)
        lines.append(
            f"Ignored (kept out of the workspace's history): {plural(total, 'path')}"
            f"{f' ({why})' if why else ''}: {', '.join(changes.ignored)}"
            f"{f' and {more} more' if more > 0 else ''}"
        )
    for warning in changes.warnings:
        lines.append(f"Warning: {warning}")
    if changes.error:
        lines.append(f"Nothing committed: {changes.error}")
    return "\n".join(lines)


def command_text(r: rp.CommandResult) -> str:
    """``execute_command``'s answer: exit code, both streams (each labelled; a long one as its
    head and tail, with what is left out between and the exact call that reads it), what the
    command left running or tried to read, what changed."""
    parts = [f"Exit code: {r.exit_code}" + (" (timed out)" if r.timed_out else "")]
    if r.timed_out:
        parts.append(
            f"The command ran past its timeout ({r.duration_ms / 1000:.1f}s): it was stopped "
            "(SIGTERM, then SIGKILL); the output below is what it wrote until then."
        )
    streams: tuple[tuple[str, str, str, int, int, int, bool], ...] = (
        ("stdout", r.stdout, r.stdout_tail, r.stdout_omitted_bytes, r.stdout_omitted_offset,
         r.stdout_bytes, r.stdout_truncated),
        ("stderr", r.stderr, r.stderr_tail, r.stderr_omitted_bytes, r.stderr_omitted_offset,
         r.stderr_bytes, r.stderr_truncated),
    )  # fmt: skip
    for name, head, tail, omitted, offset, total, truncated in streams:
        if omitted:
            parts.append(
                f"--- {name} ({total} bytes: the first and the last part; {omitted} bytes "
                f"in the middle left out) ---\n{head}"
                + _omitted_note(r, name, omitted, offset)
                + f"\n{tail.rstrip(chr(10))}"
            )
        elif truncated:  # only its beginning (a local workspace's command)
            parts.append(
                f"--- {name} ---\n{head.rstrip(chr(10))}\n[{name} truncated: the first "
                f"{len(head.encode())} of {total} bytes shown; the rest was not kept: run the "
                "command again with its output redirected to a file (cmd > out.log 2>&1) and "
                "read the file]"
            )
        elif head:
            parts.append(f"--- {name} ---\n{head.rstrip(chr(10))}")
    if r.stdin_read:
        parts.append(
            "Note: the command tried to read standard input, which is closed (a prompt such "
            "as `read -p` or input() cannot be answered): it got end of file. Give the input "
            "in the command (`echo yes | cmd`, `cmd < answers.txt`) or use a non-interactive "
            "option (`-y`, `--yes`)."
        )
    if r.background_killed:
        n = r.background_killed
        parts.append(
            f"Note: the command left {n} process{'' if n == 1 else 'es'} running in "
            "the background, killed when it ended: nothing runs between commands. Start a "
            "server and what uses it in one command (`server & sleep 1; curl ...`)."
        )
    changed = changes_text(r.changes)
    if changed:
        parts.append(changed)
    return "\n\n".join(parts)


RUNNING_SHOWN = 32 * 1024
"""Characters of each stream a still-running command's answer shows at most (its last ones)."""


def going_on(command_id: str, cursor: str) -> str:
    """How to continue with a command still running."""
    return (
        f'Call read_command_output with command_id="{command_id}" and cursor="{cursor}" to '
        "wait for more output (and its exit code once it ends), write_stdin to type into it, "
        "send_signal to stop it."
    )


def _live_streams(stdout: str, stderr: str) -> list[str]:
    """Both streams of a live command's answer, labelled; a long one as its last part."""
    parts = []
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        if len(text) > RUNNING_SHOWN:
            left_out = len(text[:-RUNNING_SHOWN].encode())
            text = f"[... the first {left_out} bytes left out ...]\n{text[-RUNNING_SHOWN:]}"
        if text:
            parts.append(f"--- {name} ---\n{text.rstrip(chr(10))}")
    return parts


def running_text(r: rp.CommandResult) -> str:
    """``execute_command``'s answer when the command still runs at ``yield_ms``: its id, its
    output so far and how to go on."""
    said_so = f"Command {r.command_id} is still running ({r.duration_ms / 1000:.0f} s)."
    streams = _live_streams(r.stdout, r.stderr)
    parts = [said_so + (" Output so far:" if streams else " No output so far."), *streams]
    if r.stdout_truncated:
        parts.append("[more output is kept after this: read on with the cursor]")
    parts.append(going_on(r.command_id, r.cursor))
    return "\n\n".join(parts)


def command_or_running_text(r: rp.CommandResult) -> str:
    """``execute_command``'s answer: as one-shot when it ended, else ``running_text``."""
    return running_text(r) if r.running else command_text(r)


def dropped_text(n: int) -> str:
    """A poll's note of output that is not kept (``CommandStatus.dropped``)."""
    return (
        f"Output dropped: {n} bytes after your cursor are no longer kept (only a bounded "
        "part of a command's output is); what follows comes after them."
    )


def poll_text(r: rp.CommandStatus) -> str:
    """``read_command_output``'s answer with a cursor: the output after it, whether the command
    still runs and how to go on, or how it ended and what it committed."""
    streams = _live_streams(r.stdout, r.stderr)
    if r.dropped:
        streams.insert(0, dropped_text(r.dropped))
    if r.running:
        head = f"Command {r.command_id} is still running."
        head += " New output:" if streams else " No new output yet."
        return "\n\n".join([head, *streams, going_on(r.command_id, r.cursor)])
    head = f"Command {r.command_id} has ended. Exit code: {r.exit_code}"
    head += " (timed out)" if r.timed_out else ""
    parts = [head, *streams]
    if r.more:
        parts.append(
            "[more output is kept: call read_command_output with "
            f'command_id="{r.command_id}" and cursor="{r.cursor}" for it]'
        )
    if r.version is not None:
        parts.append(f"Committed {plural(r.changed, 'changed path')} as version {r.version}")
    elif r.error:
        parts.append(f"Nothing committed: {r.error}")
    else:
        parts.append("It changed no files.")
    return "\n\n".join(parts)


def input_text(command_id: str, sent: int, r: rp.InputWritten) -> str:
    """``write_stdin``'s answer."""
    text = f"Wrote {plural(r.written, 'byte')} to the standard input of command {command_id}"
    if r.written < sent:
        text += f" ({sent - r.written} more were not read within 5 s: send them again later)"
    if r.closed:
        text += "; its standard input is closed now (a read gets end of file)"
    return (
        f"{text}. Call read_command_output with its command_id and your last cursor for what "
        "it answers."
    )


def signal_text(r: rp.SignalSent) -> str:
    """``send_signal``'s answer."""
    then = " (KILL follows in 5 s if it still runs)" if r.signal == "TERM" else ""
    return (
        f"Sent {r.signal} to command {r.command_id} ({plural(r.processes, 'process')}){then}. "
        "Call read_command_output with its command_id and your last cursor for how it ends."
    )


def live_commands_text(r: rp.LiveCommands) -> str:
    """``list_commands``'s answer: each command still running, or none."""
    if not r.commands:
        return "No commands are running in this workspace."
    lines = [f"Commands running in this workspace ({len(r.commands)}):", ""]
    for c in r.commands:
        stdin = ", stdin open" if c.stdin_open else ""
        lines.append(
            f"{c.command_id}: started {stamp(c.started)} by {c.actor or '-'} in "
            f"{c.workdir or '.'}{stdin}: {c.command}"
        )
    lines += [
        "",
        'read_command_output with a command_id and cursor="" reads one\'s output from its start; '
        "send_signal stops one.",
    ]
    return "\n".join(lines)


def head_and_tail(head: str, tail: str, omitted: int) -> str:
    """A stream as one text: its head, what is left out, its tail (WAP's ``stdout``)."""
    if not omitted:
        return head
    return f"{head}[... {omitted} bytes left out ...]\n{tail}"


def _omitted_note(r: rp.CommandResult, name: str, omitted: int, offset: int) -> str:
    """What is left out of a long stream and the call that reads it."""
    where = f"bytes {offset}-{offset + omitted - 1} of {name}"
    if not r.output_kept:
        return (
            f"[... {omitted} bytes left out ({where}); the whole output was not kept: run "
            "the command again with its output redirected to a file (cmd > out.log 2>&1) "
            "and read the file ...]"
        )
    stream = "" if name == "stdout" else ', stream="stderr"'
    return (
        f"[... {omitted} bytes left out ({where}). To read them: "
        f'read_command_output(command_id="{r.command_id}"{stream}, offset={offset}), '
        "then again from the offset each page says; kept for an hour ...]"
    )


def command_output_text(r: rp.CommandOutput) -> str:
    """``read_command_output``'s answer: the page, where it lies and how to read on."""
    end = r.offset + r.length
    head = f"--- {r.stream} of command {r.command_id}, bytes {r.offset}-{end - 1} ---"
    if not r.length:
        head = f"--- {r.stream} of command {r.command_id}: nothing from byte {r.offset} ---"
    notes = []
    stream = "" if r.stream == "stdout" else ', stream="stderr"'
    if r.more and r.complete:
        notes.append(
            f"[{r.kept_bytes - end} more bytes (of {r.kept_bytes}): "
            f'read_command_output(command_id="{r.command_id}"{stream}, offset={end})]'
        )
    elif not r.complete:
        notes.append(
            "[the command is still running: more may come; "
            f'read_command_output(command_id="{r.command_id}"{stream}, offset={end})]'
        )
    else:
        notes.append(f"[end of the {r.stream} ({r.kept_bytes} bytes)]")
    if r.complete and r.total_bytes > r.kept_bytes:
        notes.append(
            f"[the command wrote {r.total_bytes} bytes: those past byte {r.kept_bytes} were "
            "not kept (the last part is in the command's own answer)]"
        )
    text = r.text + ("" if r.text.endswith("\n") or not r.text else "\n")
    return f"{head}\n{text}" + "\n".join(notes)


def git_text(r: rp.GitResult) -> str:
    """``git``'s answer, by action."""
    if r.status is not None:
        st = r.status
        track = f", {st.upstream}: {st.ahead} ahead, {st.behind} behind" if st.upstream else ""
        lines = [f"On branch {st.branch or '(detached HEAD)'}{track}"]
        for title, entries in (("Staged", st.staged), ("Not staged", st.unstaged)):
            if entries:
                lines.append(f"{title}:")
                lines += [f"  {f.status}: {f.path}" for f in entries]
        if st.untracked:
            lines.append("Untracked:")
            lines += [f"  {p}" for p in st.untracked]
        if len(lines) == 1:
            lines.append("Nothing to commit, working tree clean")
        text = "\n".join(lines)
    elif r.log is not None:
        text = (
            "\n".join(f"{c.sha[:10]} {stamp(c.at)} {c.author}: {c.subject}" for c in r.log)
            or "No commits"
        )
    elif r.branches is not None:
        text = "\n".join(("* " if b == r.branch else "  ") + b for b in r.branches)
    elif r.commit is not None:
        text = f"Committed {r.commit[:10]} on {r.branch or 'detached HEAD'}"
    elif r.action == "diff":
        text = (
            f"Staged changes:\n{r.staged_diff or '(none)'}\n\n"
            f"Unstaged changes:\n{r.unstaged_diff or '(none)'}"
        )
    else:
        text = r.output.strip() or f"git {r.action}: done"
    if r.output_truncated:
        text += "\n[output truncated]"
    changed = changes_text(r.changes)
    return f"{text}\n\n{changed}" if changed else text
