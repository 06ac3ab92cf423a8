"""Request bodies, one Struct per op. The op itself is the last token of the subject.

Requests are JSON objects with snake_case fields. Unknown fields, wrong types and
out-of-range values are refused with ``INVALID_ARGUMENT``; an empty body means ``{}``.
Schemas evolve only by adding optional fields.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from contracts.limits import MAX_MESSAGE_BYTES, LimitsPatch

PathArg = Annotated[
    str,
    Meta(
        max_length=4096,
        description="Workspace-relative POSIX path; `/workspace/a` and `a` are the same.",
    ),
]
Version = Annotated[int, Meta(ge=1, le=2**53, description="A workspace version (1, 2, 3...).")]
LineNo = Annotated[int, Meta(ge=1, le=2**31)]
Count = Annotated[int, Meta(ge=0, le=2**31)]
Text = Annotated[str, Meta(max_length=MAX_MESSAGE_BYTES)]
Etag = Annotated[str, Meta(max_length=128, description="An etag from an earlier reply.")]
Trust = Literal["full", "restricted"]
WriteMode = Literal["overwrite", "create", "append"]


class Request(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every request body."""


class Query(Request, frozen=True, kw_only=True):
    """Base of every query: answer as of ``version``, after waiting for ``min_version``."""

    version: Version | None = None
    """Answer as of this workspace version (the whole tree as it was). Default: latest."""
    min_version: Version | None = None
    """Wait (bounded) until the replica has applied this version: read-your-writes."""


class Command(Request, frozen=True, kw_only=True):
    """Base of every mutation."""

    expected_version: Annotated[int, Meta(ge=0, le=2**53)] | None = None
    """Refuse with ``CONFLICT`` unless the workspace is at exactly this version."""


# ---------------------------------------------------------------- commands (ws.cmd.…)


class CreateWorkspace(Command, frozen=True, kw_only=True):
    """Create the workspace (event ``workspace_created``, version 1)."""

    trust: Trust = "full"
    """``full``, or ``restricted`` (mutations and commands need approval)."""
    limits: LimitsPatch | None = None
    """Overrides of the default limits (within the deployment's ceilings)."""
    exist_ok: bool = False
    """Succeed (``created: false``) instead of ``ALREADY_EXISTS`` if it exists."""


class WriteFile(Command, frozen=True, kw_only=True):
    """Write a whole file. Give ``content`` (UTF-8 text) or ``data`` (base64 bytes)."""

    path: PathArg
    content: Text | None = None
    """The whole file as UTF-8 text."""
    data: bytes | None = None
    """The whole file as bytes (base64 in JSON), for binary content."""
    mode: WriteMode = "overwrite"
    """``overwrite`` (default), ``create`` (``ALREADY_EXISTS`` if present), ``append``."""
    if_match: Etag | None = None
    """Refuse with ``CONFLICT`` unless the file's current etag is this one."""
    create_parents: bool = True
    """Create missing parent directories (else ``FILE_NOT_FOUND``)."""


class MakeDirectory(Command, frozen=True, kw_only=True):
    """Create a directory and its missing parents (like ``mkdir -p``)."""

    path: PathArg


class DeletePath(Command, frozen=True, kw_only=True):
    """Delete a file, or a directory (non-empty only with ``recursive``)."""

    path: PathArg
    recursive: bool = False
    if_match: Etag | None = None
    missing_ok: bool = False
    """Succeed with ``deleted: 0`` instead of ``FILE_NOT_FOUND``."""


class MovePath(Command, frozen=True, kw_only=True):
    """Move or rename a file or directory (with everything below it)."""

    path: PathArg
    to: PathArg
    """The new path (missing parents are created)."""
    overwrite: bool = False
    """Replace an existing destination file (never a directory)."""
    if_match: Etag | None = None


class PutChange(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="put"):
    """Create or replace a file (parents are created)."""

    path: PathArg
    content: Text | None = None
    """The file as UTF-8 text."""
    data: bytes | None = None
    """The file as bytes (base64 in JSON)."""
    executable: bool = False
    """Mode 755 instead of 644."""


class DeleteChange(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="delete"
):
    """Delete a file or a directory with everything below it."""

    path: PathArg


class MkdirChange(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="mkdir"
):
    """Create a directory (and its parents)."""

    path: PathArg


ApplyItem = PutChange | DeleteChange | MkdirChange


class ApplyChanges(Command, frozen=True, kw_only=True):
    """Several puts/deletes/mkdirs as one atomic event, decided against ``base_version``.

    A change conflicts when its path (or, for a put, a parent) changed after
    ``base_version``. ``on_conflict: "fail"`` refuses the whole set with ``CONFLICT``;
    ``"skip"`` commits the other changes and lists the conflicts in the reply.
    """

    base_version: Version
    """The version the changes were made against (conflicts are changes made after it)."""
    changes: Annotated[list[ApplyItem], Meta(min_length=1, max_length=50_000)]
    """Applied in order; each path at most once. Items are tagged by ``type``."""
    on_conflict: Literal["fail", "skip"] = "fail"
    """``fail``: refuse all on any conflict; ``skip``: commit the rest, report conflicts."""
    message: Annotated[str, Meta(max_length=4096)] | None = None
    """Why (recorded in the event)."""


# ---------------------------------------------------------------- queries (ws.qry.…)


class ReadFile(Query, frozen=True, kw_only=True):
    """Read a text file, whole or by lines. A directory reads as its listing."""

    path: PathArg
    offset: LineNo | None = None
    """First line to return (1-based)."""
    limit: LineNo | None = None
    """Most lines to return."""
    head: Count | None = None
    """Return only the first N lines."""
    tail: Count | None = None
    """Return only the last N lines."""
    line_numbers: bool = False
    """Prefix each line with ``<n>: ``."""


class ReadBytes(Query, frozen=True, kw_only=True):
    """Read raw bytes (any file, binary included), up to ``max_read_bytes`` a call."""

    path: PathArg
    offset: Annotated[int, Meta(ge=0, le=2**53)] = 0
    """First byte to return."""
    length: Count | None = None
    """Most bytes to return (at most ``max_read_bytes``; default that limit)."""


class ListDirectory(Query, frozen=True, kw_only=True):
    """List a directory's entries (directories first, then by name)."""

    path: PathArg = ""


class StatPath(Query, frozen=True, kw_only=True):
    """Metadata of a file or directory."""

    path: PathArg = ""


class History(Query, frozen=True, kw_only=True):
    """Revisions of a path, or the workspace's events when ``path`` is omitted; newest first."""

    path: PathArg | None = None
    """The path whose revisions to list; omit for the workspace's events."""
    limit: Annotated[int, Meta(ge=1, le=1000)] = 100
    """Most revisions to return."""
    before: Version | None = None
    """Page backwards: only versions lower than this."""


class WorkspaceInfoQuery(Query, frozen=True, kw_only=True):
    """The workspace's root, limits, default exclusions, capabilities and counters."""


class EventsQuery(Query, frozen=True, kw_only=True):
    """A page of the log, oldest first: events with version > ``after``."""

    after: Annotated[int, Meta(ge=0, le=2**53)] = 0
    """Return events with a version greater than this."""
    limit: Annotated[int, Meta(ge=1, le=1000)] = 100
    """Most events to return."""
