"""One table from an error code (``contracts/errors.py``) to what each of the gateway's doors
says of it: the HTTP status and error name (REST's ``{"error": name}``, the console's error
pages), the code WAP names it by, and the text an MCP tool at ``/mcp`` answers with.

``TABLE`` has a row for every ``ErrorCode`` (``tests/gateway/test_errors.py`` checks it, and
that each door answers every code through it); a code this gateway does not know (a newer
server's) reads as ``INTERNAL``'s row. Each door keeps only its own form around the row:

* REST (``rest/edge.py: error_response``): ``status`` and ``{"error": name, "message"}``, a
  404 saying nothing more; ``Retry-After`` for a busy answer; an ``APPROVAL_REQUIRED`` 202
  with its ``Location``.
* the console (``console/__init__.py``): an error page with ``status``.
* WAP (``mcp/wap.py``): ``{"error", "code": wap, "details"}`` as the tool's result.
* MCP (``mcp/texts.py``): ``text``, unless the tool words the code its own way (seed 000's
  ``Directory not found`` of ``list_directory``...), or, for a row without ``text``, the
  tool's own words for any failure (``write_file``: ``Failed to write file - ...``), else
  ``Error: <message>``.

Why each status: a path that is not what the call needs is the client's (404 when there is no
file at the path, 409 when a file stands where a directory must); a precondition, a lock or
an archive is a conflict with the workspace's state (409, 423); an edit that does not apply
is content the server cannot act on (422); a retriable failure is 503 (``Retry-After`` when
busy), a full disk 507; what the caller may not see is 404 like what does not exist. A live
command whose executor died is gone for good (410: polling again will not bring it back); one
that ended takes no input or signal (409, its state).
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.errors import ErrorCode


@dataclass(frozen=True)
class Row:
    """What the doors say of one error code."""

    status: int
    """The HTTP status (REST and the console)."""
    name: str
    """REST's ``error``."""
    wap: str | None = None
    """The code WAP names it by, where not the code itself."""
    text: str | None = None
    """The text of an MCP tool that has no words of its own for the code (``{path}``,
    ``{message}``, ``{workspace}``); None: the tool's words for any failure."""


E = ErrorCode
TABLE: dict[str, Row] = {
    E.FILE_NOT_FOUND: Row(404, "not_found", text="Error: File not found: {path}"),
    E.NOT_A_FILE: Row(404, "not_found", text="Error: Not a file: {path}"),  # no file there
    E.NOT_A_DIRECTORY: Row(409, "path_conflict", text="Error: Not a directory: {path}"),
    E.ALREADY_EXISTS: Row(409, "path_conflict"),
    E.ACCESS_DENIED: Row(
        403,
        "access_denied",
        wap="PERMISSION_DENIED",
        text="Error: Access denied. Path must be within /workspace",
    ),
    E.INVALID_ARGUMENT: Row(400, "invalid_argument"),
    E.INVALID_ENCODING: Row(  # a binary file has no UTF-8 content
        422, "invalid_encoding", text="Error: File contains invalid UTF-8 encoding"
    ),
    E.SIZE_LIMIT_EXCEEDED: Row(413, "workspace_too_large"),
    E.CONFLICT: Row(409, "workspace_conflict"),
    E.NO_MATCH: Row(422, "no_match"),
    E.MULTIPLE_MATCHES: Row(422, "multiple_matches"),
    E.LOCKED: Row(423, "locked"),
    E.APPROVAL_REQUIRED: Row(202, "approval_required"),  # accepted: carried out once approved
    E.DENIED: Row(403, "access_denied"),
    E.TIMEOUT: Row(503, "unavailable"),
    E.EXECUTION_FAILED: Row(500, "execution_failed"),
    E.UNAVAILABLE: Row(503, "unavailable"),
    E.INTERNAL: Row(500, "internal"),
    E.WORKSPACE_NOT_FOUND: Row(404, "not_found", text="Error: {message}"),
    E.VERSION_TRIMMED: Row(410, "version_trimmed"),
    E.RUN_NOT_FOUND: Row(404, "not_found"),
    E.WORKSPACE_ARCHIVED: Row(409, "workspace_archived"),
    E.STORAGE_FULL: Row(507, "storage_full", text="Error: Storage full - {message}"),
    E.COMMAND_NOT_FOUND: Row(404, "not_found", text="Error: {message}"),  # foreign or made up
    E.COMMAND_LOST: Row(410, "command_lost", text="Error: {message}"),  # its executor is gone
    E.COMMAND_ENDED: Row(409, "command_ended", text="Error: {message}"),  # no input, no signal
    E.SHELL_NOT_FOUND: Row(404, "not_found", text="Error: {message}"),  # foreign, made up, closed
    E.SHELL_LOST: Row(410, "shell_lost", text="Error: {message}"),  # its executor is gone
    E.BUSY: Row(409, "busy", text="Error: {message}"),  # a shell runs one command at a time
    E.MERGE_CONFLICT: Row(409, "merge_conflict", text="Error: {message}"),  # nothing committed
    E.NO_MERGE_BASE: Row(409, "no_merge_base", text="Error: {message}"),  # unrelated histories
}
"""Every error code's row."""


def row(code: ErrorCode | str) -> Row:
    """The row of ``code``; ``INTERNAL``'s for a code this gateway does not know."""
    return TABLE.get(str(code)) or TABLE[E.INTERNAL]


def wap_code(code: ErrorCode | str) -> str:
    """The code WAP names ``code`` by."""
    found = TABLE.get(str(code))
    return found.wap if found is not None and found.wap else str(code)
