"""Stable error codes and the one exception type every Quill failure is reported with.

Exception tree::

    QuillError              a failure with a stable ``code`` (an ``ErrorCode``), a human
                            ``message`` and machine-readable ``details``

A busy service (a bounded queue full: ``busy``) answers ``UNAVAILABLE`` with
``details = {"reason": "busy", "queue": ..., "retry_after_ms": ...}``.

Domain code raises ``QuillError``; service handlers turn it into the error reply
``{"ok": false, "error": {"code", "message", "details"}}`` at the edge; each front door
(SDK, CLI, MCP, REST) keeps one table from code to its own form.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """The error codes of the wire contract. Codes are never renamed or reused."""

    FILE_NOT_FOUND = "FILE_NOT_FOUND"
    """The path does not exist (at the version asked for)."""
    NOT_A_FILE = "NOT_A_FILE"
    """The path is a directory where a file was expected."""
    NOT_A_DIRECTORY = "NOT_A_DIRECTORY"
    """The path (or one of its parents) is a file where a directory was expected."""
    ALREADY_EXISTS = "ALREADY_EXISTS"
    """The path (or workspace) exists and the request asked for it not to."""
    ACCESS_DENIED = "ACCESS_DENIED"
    """The path leaves the workspace, or the caller may not touch this workspace."""
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    """The request is malformed: bad JSON, unknown field, wrong type, out-of-range value."""
    INVALID_ENCODING = "INVALID_ENCODING"
    """The content is not valid in the encoding the operation needs (UTF-8 text)."""
    SIZE_LIMIT_EXCEEDED = "SIZE_LIMIT_EXCEEDED"
    """A workspace limit would be exceeded (file bytes, file count, change-set size...)."""
    CONFLICT = "CONFLICT"
    """A precondition (``if_match``, ``expected_version``, ``base_version``) is stale."""
    NO_MATCH = "NO_MATCH"
    """An edit found nothing to replace."""
    MULTIPLE_MATCHES = "MULTIPLE_MATCHES"
    """An edit's ``old_string`` is ambiguous."""
    LOCKED = "LOCKED"
    """Another session holds the workspace lock."""
    APPROVAL_REQUIRED = "APPROVAL_REQUIRED"
    """The workspace is restricted and the request awaits approval."""
    DENIED = "DENIED"
    """An approver denied the request."""
    TIMEOUT = "TIMEOUT"
    """The operation did not finish in time. Retriable."""
    EXECUTION_FAILED = "EXECUTION_FAILED"
    """A command could not be started."""
    UNAVAILABLE = "UNAVAILABLE"
    """The service cannot answer now (overloaded, lagging replica, lost backend). Retriable.
    A busy service (a bounded queue full) says so in ``details``: ``reason`` ``busy``,
    ``queue``, ``retry_after_ms`` (retry no sooner)."""
    INTERNAL = "INTERNAL"
    """A bug. Reported with a reference to the service log line."""
    WORKSPACE_NOT_FOUND = "WORKSPACE_NOT_FOUND"
    """The workspace has not been created. (Addition to DESIGN.md's list: clearer than
    ``FILE_NOT_FOUND`` for a missing workspace.)"""
    VERSION_TRIMMED = "VERSION_TRIMMED"
    """The version asked for was compacted away (``max_versions``): details give the
    workspace's ``floor`` (the oldest version whose whole tree is kept). (Addition.)"""
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    """The query names a run (``Ws-Run``) that the workspace's log does not hold: details give
    the ``run``. A replica waits (bounded, like ``min_version``) for a run it has not applied
    yet before it answers this; a query in a run is only ever answered at the run's version.
    (Addition.)"""
    WORKSPACE_ARCHIVED = "WORKSPACE_ARCHIVED"
    """The workspace is archived (``cmd.archive``): it refuses every command and command run
    but ``unarchive`` and ``purge``; reads and history still work. Details give the
    ``archived_at`` time and ``archived_by``. (Addition.)"""
    STORAGE_FULL = "STORAGE_FULL"
    """A disk is full: the log's (JetStream reached its storage limit) or the answering
    service's own; ``details.service`` names it (``log``, ``reader``, ``executor``, ...).
    Nothing was stored. Not retriable as is: it ends when an operator frees space or grows
    the disk (the limit then rises by itself, docs/operations.md "Disk full"). (Addition.)"""
    COMMAND_NOT_FOUND = "COMMAND_NOT_FOUND"
    """No live command of this workspace has that id (a made-up id, another tenant's or
    workspace's, or one whose output is no longer kept). (Addition.)"""
    COMMAND_LOST = "COMMAND_LOST"
    """The executor holding the live command is gone (it died, or stopped): the command died
    with it, its changes uncommitted. What was committed before stays. (Addition.)"""
    SHELL_NOT_FOUND = "SHELL_NOT_FOUND"
    """No open shell of this workspace has that id (a made-up id, another tenant's or
    workspace's, or one closed). (Addition.)"""
    SHELL_LOST = "SHELL_LOST"
    """The executor holding the shell is gone (it died, or stopped): the shell died with it,
    what its background processes changed since its last commit uncommitted. Details give
    the ``version`` last committed. (Addition.)"""
    BUSY = "BUSY"
    """The shell runs a command already (details name it: ``command_id``, ``command``); send
    with ``queue`` to wait for it instead. (Addition.)"""
    COMMAND_ENDED = "COMMAND_ENDED"
    """The live command has ended: it takes no input or signal any more (``exec.poll`` says how
    it ended). (Addition.)"""
    MERGE_CONFLICT = "MERGE_CONFLICT"
    """A merge (``cmd.merge``) found conflicts its strategy does not decide: nothing was
    committed. Details list them (``conflicts``, the first 100, each with both sides'
    entries and a three-way view; ``conflicts_total``). (Addition, issue 33.)"""
    NO_MERGE_BASE = "NO_MERGE_BASE"
    """The two workspaces of a merge share no history (neither was forked from the other,
    nor both from a third): there is no base to merge against. (Addition, issue 33.)"""


RETRIABLE: frozenset[ErrorCode] = frozenset({ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE})
"""Codes a client may retry with the same request id."""


class QuillError(Exception):
    """A failure with a stable code. ``details`` is JSON-serialisable."""

    def __init__(
        self, code: ErrorCode | str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        try:
            self.code: ErrorCode | str = ErrorCode(code)
        except ValueError:  # a code from a newer server: keep it as a string
            self.code = code
        self.message = message
        self.details: dict[str, Any] = details or {}

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE

    def __reduce__(self) -> tuple[type[QuillError], tuple[str, str, dict[str, Any]]]:
        """Pickled as its code, message and details (a worker process's answer:
        ``infra/offload.py``)."""
        return (QuillError, (str(self.code), self.message, self.details))

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"QuillError({str(self.code)!r}, {self.message!r}, {self.details!r})"


BUSY = "busy"
"""``details["reason"]`` of an ``UNAVAILABLE`` that a full queue gave (a flood refused)."""


def busy(what: str, queue: str, retry_after_ms: int, **details: Any) -> QuillError:
    """The answer past a bound: ``UNAVAILABLE`` (retriable) saying what is busy and when to
    retry; ``details``: ``reason`` (``busy``), ``queue`` (which bound), ``retry_after_ms``, and
    whatever the bound adds (its ``limit``...). docs/operations.md lists every queue."""
    return QuillError(
        ErrorCode.UNAVAILABLE,
        f"{what} is busy ({queue} queue full); retry in {retry_after_ms} ms",
        {**details, "reason": BUSY, "queue": queue, "retry_after_ms": retry_after_ms},
    )


def retry_after_ms(error: QuillError) -> int | None:
    """The retry hint of a busy answer (None for any other error, or a hint that is no
    non-negative whole number of milliseconds)."""
    hint = error.details.get("retry_after_ms") if error.details else None
    if isinstance(hint, bool) or not isinstance(hint, int) or hint < 0:
        return None
    return hint


def no_workspace(tenant: str, workspace: str) -> QuillError:
    """``WORKSPACE_NOT_FOUND`` for ``tenant/workspace``."""
    return QuillError(
        ErrorCode.WORKSPACE_NOT_FOUND,
        f"Workspace not found: {tenant}/{workspace}",
        {"tenant": tenant, "workspace": workspace},
    )


def no_version(version: int, latest: int, of: str = "") -> QuillError:
    """``INVALID_ARGUMENT`` for a version past the ``latest`` (``of``: the workspace named,
    when it is not the one asked about)."""
    named = f" of {of}" if of else ""
    return QuillError(
        ErrorCode.INVALID_ARGUMENT,
        f"Version {version}{named} does not exist (the latest is {latest})",
        {"version": version, "latest_version": latest},
    )


def no_content(path: str, sha256: str) -> QuillError:
    """``UNAVAILABLE`` for a content a decision reads that is not at hand (a read of the
    blob store or the log failed, or it is being written): retried, it is there."""
    return QuillError(
        ErrorCode.UNAVAILABLE,
        f"Content of {path} is not available",
        {"path": path, "sha256": sha256},
    )


def not_found(path: str) -> QuillError:
    return QuillError(ErrorCode.FILE_NOT_FOUND, f"File not found: {path}", {"path": path})


def invalid(message: str, **details: Any) -> QuillError:
    return QuillError(ErrorCode.INVALID_ARGUMENT, message, details)
