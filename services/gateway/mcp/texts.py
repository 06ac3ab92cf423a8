"""What the MCP tools say to a model: the workspace tool's output formats and error texts.

The text a tool answers a ``QuillError`` with (seed 000's wording) is, the most specific
first: the tool's own words for the code (``TOOL_TEXTS[(code, tool)]``), the code's text in
the gateway's one error table (``services/gateway/errors.py``, every door's), the tool's words
for any failure (``TOOL_TEXTS[("*", tool)]``), then ``Error: <message>``. A workspace the
caller may not reach reads "Workspace not found: <as named>" whether or not it exists, in the
text as in ``structuredContent`` (``workspace_unknown``).

Why one module of ~370 lines: everything a model reads of the file tools (each tool's answer,
every error) is here, so that the wording is reviewed and kept consistent in one place, and
the tool tables (``files``, ``quill_tools``) only point at it; what the command tools say
(a command's result, a live command, git) is its neighbour ``command_texts``.
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
    (E.ACCESS_DENIED, "fork_workspace"): "Error: {message}",
    (E.ACCESS_DENIED, "merge_workspace"): "Error: {message}",
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
