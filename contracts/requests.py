"""Request bodies, one Struct per op. The op itself is the last token of the subject.

Requests are JSON objects with snake_case fields. Unknown fields, wrong types and
out-of-range values are refused with ``INVALID_ARGUMENT``; an empty body means ``{}``.
Schemas evolve only by adding optional fields.

Size: the whole request side of the wire in one module, the reference a client in another
language reads (and docs/contract.md is generated from); one Struct per op, no logic.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from contracts.events import UncommittedPath
from contracts.limits import (
    LIVE_INPUT_MAX_BYTES,
    LIVE_POLL_MAX_BYTES,
    LIVE_WAIT_MAX_MS,
    LIVE_YIELD_MAX_MS,
    MAX_MESSAGE_BYTES,
    PTY_MAX_SIDE,
    LimitsPatch,
)

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
WorkspaceId = Annotated[
    str,
    Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$", description="A workspace id of the same tenant."),
]
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
    """Delete a non-empty directory with everything in it."""
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
    blob: Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")] | None = None
    """Instead of ``content``/``data``: the sha256 of content already stored in the object
    store ``WS_BLOBS`` under the workspace's own name for it, ``<tenant>/<workspace>/<sha256>``
    (how large change sets stay within a message); another workspace's copy never resolves."""
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
    changes: Annotated[list[ApplyItem], Meta(max_length=50_000)]
    """Applied in order; each path at most once, except that a ``delete`` may be followed by a
    ``put`` or ``mkdir`` of the same path (a file replaced by a directory). Items are tagged
    by ``type``. Empty only with ``uncommitted``."""
    on_conflict: Literal["fail", "skip"] = "fail"
    """``fail``: refuse all on any conflict; ``skip``: commit the rest, report conflicts."""
    message: Annotated[str, Meta(max_length=4096)] | None = None
    """Why (recorded in the event)."""
    uncommitted: Annotated[list[UncommittedPath], Meta(max_length=1000)] | None = None
    """An executor's: the paths the command's sandbox holds that it could not commit (the
    whole set, replacing the one recorded; recorded in the event when it differs)."""


class EditFile(Command, frozen=True, kw_only=True):
    """Replace an exact string in a text file (like OpenCode's edit tool)."""

    path: PathArg
    old_string: Annotated[str, Meta(min_length=1, max_length=MAX_MESSAGE_BYTES)]
    """The exact text to replace (whitespace and indentation included)."""
    new_string: Text
    """The replacement, inserted literally (``$1`` stays ``$1``)."""
    replace_all: bool = False
    """Replace every occurrence (else ``old_string`` must occur exactly once)."""
    if_match: Etag | None = None


class ReplaceLines(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="replace"
):
    """Replace lines ``start_line``..``end_line`` (inclusive) with ``new_content``."""

    start_line: LineNo
    end_line: LineNo
    new_content: Text


class InsertLines(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="insert"
):
    """Insert ``new_content`` after line ``after_line`` (0: at the top)."""

    after_line: Annotated[int, Meta(ge=0, le=2**31)]
    new_content: Text


class DeleteLines(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="delete"
):
    """Delete lines ``start_line``..``end_line`` (inclusive)."""

    start_line: LineNo
    end_line: LineNo


class RegexReplace(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag="regex_replace"
):
    """Replace matches of ``pattern`` (Python ``re`` syntax) with ``replacement``, where
    ``$1``/``$<name>`` name groups, ``$&`` the whole match and ``$$`` a dollar sign."""

    pattern: Annotated[str, Meta(min_length=1, max_length=4096)]
    replacement: Text
    flags: Annotated[str, Meta(pattern=r"^[gimsx]*$")] = ""
    """``g`` every match (else the first), ``i`` ignore case, ``m`` ^/$ at lines, ``s`` dot
    matches newline, ``x`` verbose."""


ModifyOperation = ReplaceLines | InsertLines | DeleteLines | RegexReplace


class ModifyFile(Command, frozen=True, kw_only=True):
    """Targeted changes to a text file, all or nothing, as one event. Line operations use the
    file's line numbers before the call and must not overlap; regex replacements then run in
    order on the result."""

    path: PathArg
    operations: Annotated[list[ModifyOperation], Meta(min_length=1, max_length=1000)]
    """The changes, applied together or not at all (line operations by the numbers before the
    call)."""
    if_match: Etag | None = None


class RestorePath(Command, frozen=True, kw_only=True):
    """Bring a path, or the whole workspace, back to how it was at ``version``, as a new event."""

    version: Version
    """The version to restore."""
    path: PathArg | None = None
    """A file or directory to restore; omit for the whole workspace."""


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
    char_offset: Annotated[int, Meta(ge=0, le=2**31)] = 0
    """Start at this character (0-based) of the first line asked for: to read a line longer
    than ``max_read_bytes`` in parts (the ``cut`` of the previous read names it). Not with
    ``tail``."""


class ReadBytes(Query, frozen=True, kw_only=True):
    """Read raw bytes (any file, binary included), up to ``max_read_bytes`` a call."""

    path: PathArg
    offset: Annotated[int, Meta(ge=0, le=2**53)] = 0
    """First byte to return."""
    length: Count | None = None
    """Most bytes to return (at most ``max_read_bytes``; default that limit)."""


EntryKind = Literal["file", "directory", "any"]


class ListDirectory(Query, frozen=True, kw_only=True):
    """List a directory's entries (directories first, then by name), or with ``recursive``
    every entry beneath it (by path); a page at a time."""

    path: PathArg = ""
    recursive: bool = False
    """Every entry beneath ``path``, ordered by path, instead of its children."""
    kind: EntryKind = "any"
    """Only files (``file``), only directories (``directory``), or both."""
    prefix: Annotated[str, Meta(max_length=4096)] = ""
    """Only entries whose path, relative to ``path``, starts with this text (``"t"`` keeps
    ``todo.md`` and ``tests/...``)."""
    after: Annotated[str, Meta(min_length=1, max_length=8192)] | None = None
    """The ``next`` of the previous page (``d:<path>`` or ``f:<path>``): continue after that
    entry."""
    limit: Annotated[int, Meta(ge=1, le=10_000)] | None = None
    """Entries per page. Default, and at most: the workspace's ``max_directory_entries``."""


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
    follow: bool = False
    """With ``path``: follow the file across moves, as ``git log --follow``. Past the revision
    that moved it to ``path`` (``moved_from``), its revisions under the name it had before (each
    with that ``path``), and so on across each earlier move; the revisions of an older file
    that had the same name are not its history. A page is read as a seek per move."""


Patterns = Annotated[list[Annotated[str, Meta(max_length=1024)]], Meta(max_length=100)]


class GlobQuery(Query, frozen=True, kw_only=True):
    """Paths matching a glob (``*``, ``**``, ``?``, ``[abc]``, ``{a,b}``), newest first."""

    pattern: Annotated[str, Meta(min_length=1, max_length=1024)]
    """Relative to ``path``; ``*`` stays within a directory, ``**`` crosses directories."""
    path: PathArg = ""
    """The directory to search in."""
    kind: EntryKind = "any"
    """Only files (``file``), only directories (``directory``), or both."""
    max_results: Annotated[int, Meta(ge=1, le=10_000)] | None = None
    """Default 100, at most the workspace's ``max_search_results`` ceiling."""
    exclude: Patterns | None = None
    """Globs to leave out; default: the workspace's default exclusions. ``[]``: none."""


class GrepQuery(Query, frozen=True, kw_only=True):
    """Lines matching a regex or literal text in the files under ``path``, or in ``path``
    itself when it is a file."""

    pattern: Annotated[str, Meta(min_length=1, max_length=4096)]
    """A regular expression (Python syntax), or plain text with ``literal``."""
    path: PathArg = ""
    """A directory (every text file below it, as ``include`` and ``exclude`` say), or one
    file (searched whatever they say; a binary file has no matching line)."""
    literal: bool = False
    """Match ``pattern`` as plain text rather than a regular expression."""
    ignore_case: bool = False
    """Match regardless of case."""
    include: Patterns | None = None
    """Only files matching one of these globs (``*.ts``: at any depth; ``src/**/*.ts``)."""
    exclude: Patterns | None = None
    """Globs to leave out; default: the workspace's default exclusions. ``[]``: none."""
    context_lines: Annotated[int, Meta(ge=0, le=50)] = 0
    """Lines of context to return before and after each match."""
    max_results: Annotated[int, Meta(ge=1, le=10_000)] | None = None
    """Most matches to return (default 100); ``total`` still counts them all."""


class ExploreQuery(Query, frozen=True, kw_only=True):
    """The tree under ``path``: its entries, or with ``recursive`` down to ``max_depth``."""

    path: PathArg = ""
    recursive: bool = False
    """Descend into subdirectories, down to ``max_depth``."""
    max_depth: Annotated[int, Meta(ge=1, le=100)] = 3
    """With ``recursive``: how many levels below ``path``."""
    exclude: Patterns | None = None
    """Globs to leave out; default: the workspace's default exclusions. ``[]``: none."""
    metadata: bool = False
    """Include size and modification time of each entry."""
    max_results: Annotated[int, Meta(ge=1, le=10_000)] | None = None
    """Default: the workspace's ``max_directory_entries``."""


class DiffQuery(Query, frozen=True, kw_only=True):
    """Unified diff of a path, or of the whole workspace, between two versions."""

    from_version: Version
    to_version: Version | None = None
    """Default: the latest (or ``version``)."""
    path: PathArg | None = None
    """A file or directory; omit for the whole workspace."""
    context_lines: Annotated[int, Meta(ge=0, le=100)] = 3
    """Unchanged lines shown around each change."""
    from_workspace: WorkspaceId | None = None
    """Compare with another workspace of the same tenant: ``from_version`` is that
    workspace's version (a fork and its source, two forks); omit for this workspace."""


class WorkspaceInfoQuery(Query, frozen=True, kw_only=True):
    """The workspace's root, limits, default exclusions, capabilities and counters."""


class EventsQuery(Query, frozen=True, kw_only=True):
    """A page of the log, oldest first: events with version > ``after``."""

    after: Annotated[int, Meta(ge=0, le=2**53)] = 0
    """Return events with a version greater than this."""
    limit: Annotated[int, Meta(ge=1, le=1000)] = 100
    """Most events to return."""


class TreeQuery(Query, frozen=True, kw_only=True):
    """Every entry of the tree as of a version, by path, a page at a time, with the contents
    of the page's files that the replica holds: what a checkout is built from without
    replaying the log (an executor's first command on a workspace)."""

    after: Annotated[str, Meta(min_length=1, max_length=8192)] | None = None
    """The ``next`` of the previous page: continue after that path."""
    limit: Annotated[int, Meta(ge=1, le=10_000)] = 1000
    """Most entries per page (fewer when their contents reach ``TREE_PAGE_BYTES``)."""
    contents: bool = True
    """Include the contents of the page's files that the replica holds (the others are in
    WS_BLOBS: ``TreeItem.blob``)."""
    changed_from: Version | None = None
    """Only the entries as of ``version`` of the paths changed between ``version`` and this
    version (either order) and of what is below them, in O(paths changed): what an executor
    takes from a reader when it links the rest from the workspace's checkout it holds at
    ``changed_from`` (a fork's first checkout, issue 33). The first page names the changed
    paths (``TreePage.changed``), or says the reader cannot tell (more than
    ``TREE_CHANGED_MOST`` paths or ``TREE_CHANGED_ENTRIES`` entries, or part of the range
    compacted away in a workspace it inherits from; below its own floor: ``VERSION_TRIMMED``)."""


# ---------------------------------------------------------------- runs, locks, trust

RunId = Annotated[str, Meta(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]


class RunStart(Command, frozen=True, kw_only=True):
    """Start an agent run: its queries (``Ws-Run: <run>``) read the workspace as of one
    version for the whole run (RFC 0059 §D), whatever is written meanwhile."""

    run: RunId | None = None
    """The run's id (default: one is made)."""
    parent: RunId | None = None
    """The run that dispatched this one: the sub-run reads the parent's version unless it
    names its own."""
    version: Version | None = None
    """Pin this version (default: the parent's, else the latest)."""


class RunEnd(Command, frozen=True, kw_only=True):
    """End a run (its id is refused afterwards)."""

    run: RunId
    """The run to end."""


class Lock(Command, frozen=True, kw_only=True):
    """Hold the workspace for this session (``Ws-Session``) for ``ttl_ms``: other sessions'
    mutations get ``LOCKED`` meanwhile (or wait, with ``Ws-Wait``). The holder taking it again
    extends it; another session's lock is waited for like any mutation's (``Ws-Wait``)."""

    ttl_ms: Annotated[int, Meta(ge=1000, le=3_600_000)] = 60_000
    """How long the lock holds unless released or taken again (1 s to 1 h)."""


class Unlock(Command, frozen=True, kw_only=True):
    """Release this session's lock."""


class SetTrust(Command, frozen=True, kw_only=True):
    """Change the workspace's trust level (recorded as an event). On a ``restricted``
    workspace every mutation waits for approval, and commands (``exec``) are not offered
    unless ``commands`` (then each needs approval too)."""

    trust: Trust
    """``full``, or ``restricted`` (every mutation waits for approval)."""
    commands: bool = False
    """``restricted`` only: offer ``exec.run`` and ``exec.git`` (each approved first)."""


class RequestApproval(Command, frozen=True, kw_only=True):
    """Ask for the approval a restricted workspace requires before something outside the
    writer (an executor's command) is done; answered once decided. The executors send it."""

    op: Annotated[str, Meta(min_length=1, max_length=64)]
    """What waits: ``exec.run``, ``exec.git``."""
    summary: Annotated[str, Meta(max_length=4096)]
    """What it would do (a command line; never contents). An approver is shown what the
    writer derives from the command kept under this request id and digest, not this."""
    digest: Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")] | None = None
    """sha256 of the request that waits, as its executor keeps it for approval (required: an
    ask for a command not kept is ``INVALID_ARGUMENT``; a retry of it from the same session
    finds its approval instead of asking again)."""


class Decide(Command, frozen=True, kw_only=True):
    """Approve or deny a request parked on a restricted workspace."""

    approval_id: Annotated[str, Meta(min_length=1, max_length=128)]
    """The request to decide (from ``approvals``, or the ``APPROVAL_REQUIRED`` error)."""
    approve: bool
    """True to approve, false to deny."""
    reason: Annotated[str, Meta(max_length=1024)] | None = None
    """Recorded with the decision."""


class Attach(Command, frozen=True, kw_only=True):
    """Attach a workspace to the session whose primary workspace this is (seed 003)."""

    uri: Annotated[str, Meta(min_length=3, max_length=4096)]
    """``server:/<tenant>/<workspace>``, ``git:<url>`` or ``<client>:<path>`` (a bridge)."""
    target: Annotated[str, Meta(max_length=129)] | None = None
    """For ``git:`` URIs: the ``tenant/workspace`` it was cloned into (the SDK and the
    gateway clone it first)."""


class Detach(Command, frozen=True, kw_only=True):
    uri: Annotated[str, Meta(min_length=3, max_length=4096)]
    """The attached workspace to detach, as it was attached."""


class ArchiveWorkspace(Command, frozen=True, kw_only=True):
    """Archive the workspace (event ``workspace_archived``): every later command is refused
    with ``WORKSPACE_ARCHIVED`` until ``unarchive``; reads and history still work."""

    reason: Annotated[str, Meta(max_length=1024)] | None = None
    """Why (recorded in the event, shown by ``workspaces``)."""


class UnarchiveWorkspace(Command, frozen=True, kw_only=True):
    """Take the workspace out of the archive (event ``workspace_unarchived``)."""


class PurgeWorkspace(Command, frozen=True, kw_only=True):
    """Delete the workspace for good: its log, kept command output and every projection and
    checkout of it. Its events are purged from the log behind a ``workspace_purged`` event
    (what tells replicas and executors to delete their copies); its name may be created again
    (version 1)."""

    confirm: Annotated[str, Meta(max_length=200)]
    """The workspace's own name, ``tenant/workspace``: a purge names what it destroys."""


# ---------------------------------------------------------------- forks (issue 33)


class ForkWorkspace(Command, frozen=True, kw_only=True):
    """Create this workspace as a fork of ``from`` (same tenant) at ``version``: its history
    up to that version is the source's, nothing copied (event ``workspace_forked``); its
    first change is ``version + 1``. Trust, limits and whether commands are offered are
    inherited, and can then be changed on the fork."""

    source: WorkspaceId = msgspec.field(name="from")
    """The workspace to fork (``from`` on the wire), of the same tenant."""
    version: Version | None = None
    """The source's version to fork at. Default: its latest."""


class MergeWorkspace(Command, frozen=True, kw_only=True):
    """Merge workspace ``from`` (same tenant: a fork of this one, this one's source, or a
    fork of the same source) into this one: a three-way merge per path against the merge
    base (the fork point, or the last merge of ``from`` into this one), committed as one
    event (op ``merge``). Costs what changed on either side since the base."""

    source: WorkspaceId = msgspec.field(name="from")
    """The workspace to merge in (``from`` on the wire), of the same tenant."""
    strategy: Literal["fail", "ours", "theirs", "markers"] = "fail"
    """What a conflict does: ``fail`` (nothing committed, every conflict listed), decided
    for ``ours`` (this workspace) or ``theirs`` (``from``) side, or ``markers`` (git's
    conflict markers in the texts; a conflict markers cannot hold fails)."""
    dry_run: bool = False
    """Decide it and answer what it would change and the conflicts; commit nothing."""


class ForksQuery(Query, frozen=True, kw_only=True):
    """The workspace's forks: each one's name, the version it was forked at, and how many
    versions each side has moved on since."""

    limit: Annotated[int, Meta(ge=1, le=1000)] = 100
    """Most forks to return."""


class ListWorkspaces(Request, frozen=True, kw_only=True):
    """The tenant's workspaces, by name, a page at a time. Sent on the tenant's subject
    ``ws.qry.<tenant>._.workspaces`` (``_``: no workspace)."""

    after: Annotated[str, Meta(max_length=64)] | None = None
    """The ``next`` of the previous page: names after it (keyset paging, no offset)."""
    limit: Annotated[int, Meta(ge=1, le=1000)] = 100
    """Workspaces per page."""
    prefix: Annotated[str, Meta(max_length=64)] | None = None
    """Only names starting with this."""


class AttachedQuery(Query, frozen=True, kw_only=True):
    """The workspaces attached to this (primary) workspace's session."""


class RunQuery(Query, frozen=True, kw_only=True):
    """A run: which version it reads, its parent, whether it ended."""

    run: RunId
    """The run's id."""


class ApprovalsQuery(Query, frozen=True, kw_only=True):
    """The requests waiting for approval."""


class ApprovalQuery(Query, frozen=True, kw_only=True):
    """One request parked for approval: pending, approved (and what carrying it out gave),
    denied or expired."""

    approval_id: Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
    """The approval's id (from the ``APPROVAL_REQUIRED`` error's details)."""


# ---------------------------------------------------------------- exec (to the executors)

EnvName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
EnvValue = Annotated[str, Meta(max_length=32 * 1024)]
Env = Annotated[dict[EnvName, EnvValue], Meta(max_length=100)]
TimeoutMs = Annotated[int, Meta(ge=1, le=600_000)]


class Execution(Request, frozen=True, kw_only=True):
    """Base of the exec requests: where and against which version a command runs."""

    workdir: PathArg = ""
    """The working directory, inside the workspace (``/workspace/src`` or ``src``)."""
    timeout_ms: TimeoutMs | None = None
    """Default 30 s; at most the workspace's ``max_exec_ms``."""
    version: Version | None = None
    """Run against the workspace as it was at this version (default: the latest). Its changes
    are committed on that version: a path changed since is a conflict."""
    min_version: Version | None = None
    """Run against at least this version (read-your-writes)."""


ShellHandle = Annotated[str, Meta(pattern=r"^s[0-9a-f]{12}[A-Za-z0-9]{1,40}$")]
"""An open shell's id (``exec.shell_open``): opaque; it names the executor holding it."""
SHELL_IDLE_MAX_MS = 24 * 3600 * 1000


class ShellOpen(Request, frozen=True, kw_only=True):
    """Open a shell: one long-lived sandbox running bash, in a checkout of its own, where
    ``exec.run`` with ``shell`` runs commands one at a time."""

    workdir: PathArg = ""
    """Its first working directory, inside the workspace."""
    env: Env | None = None
    """Variables exported in it (their values are never logged or audited)."""
    idle_timeout_ms: Annotated[int, Meta(ge=1000, le=SHELL_IDLE_MAX_MS)] | None = None
    """Close it after this long without a command (default 30 minutes)."""


class ShellClose(Request, frozen=True, kw_only=True):
    """Close a shell: its processes are killed, what they changed since the last commit is
    committed (background)."""

    shell: ShellHandle
    """The shell (``exec.shell_open``'s ``shell``)."""


class ShellCheckpoint(Request, frozen=True, kw_only=True):
    """Commit what a shell's background processes changed since its last command."""

    shell: ShellHandle
    """The shell (``exec.shell_open``'s ``shell``)."""


class TerminalSize(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A terminal's size in characters."""

    rows: Annotated[int, Meta(ge=1, le=PTY_MAX_SIDE)]
    cols: Annotated[int, Meta(ge=1, le=PTY_MAX_SIDE)]


class RunCommand(Execution, frozen=True, kw_only=True):
    """Run a shell command (``bash -c``) in the workspace's sandbox. The files it changes are
    committed as one event; a non-zero exit status is a result, not an error."""

    command: Annotated[str, Meta(min_length=1, max_length=64 * 1024)]
    """The command line, run by ``bash -c`` in the workspace's root (or ``workdir``)."""
    env: Env | None = None
    """Extra environment variables (their values are never logged or audited)."""
    stdin: bytes | None = None
    """The command's standard input (base64 in JSON), given whole: at most
    ``limits.EXEC_STDIN_MAX_BYTES`` (1 MiB; past it ``SIZE_LIMIT_EXCEEDED``); never logged or
    audited (its size is). Omitted: stdin is closed, and the result says whether the command
    tried to read it (``stdin_read``); with ``yield_ms``, it is a pipe kept open for
    ``exec.input`` instead."""
    shell: ShellHandle | None = None
    """Run in this open shell (``exec.shell_open``): its directory, exported variables,
    functions, ``/tmp`` and background processes carry over from command to command.
    ``workdir``, ``env`` and ``version`` are refused with it (``cd`` and ``export`` in the
    shell); ``stdin`` is given whole; with ``yield_ms`` it yields as any command (without
    ``stdin``, its stdin is open to ``exec.input``; ``exec.signal`` reaches the processes it
    forked, never the shell itself; KILL of a command with none ends the shell)."""
    queue: bool = False
    """With ``shell``: wait for the command the shell runs to end (within ``timeout_ms``)
    instead of being refused ``BUSY``."""
    yield_ms: Annotated[int, Meta(ge=0, le=LIVE_YIELD_MAX_MS)] | None = None
    """Answer after this many milliseconds if the command still runs (``running``: true, its
    ``command_id``, its output so far and a ``cursor``), and let it run on: ``exec.poll``,
    ``exec.input``, ``exec.signal`` act on it by its ``command_id``. Its changes are committed
    when it ends, as any command's. Omitted: the reply waits for the command's end."""
    pty: TerminalSize | None = None
    """Run the command in a terminal of this size (a pseudo-terminal in its sandbox; only with
    ``yield_ms``, without ``stdin`` and ``shell``): ``exec.input`` is what is typed (``\\x03``
    is Ctrl-C), its output is the terminal's (stdout only, with CRLF line ends), ``exec.resize``
    changes the size. E.g. ``command: "exec bash -i"`` for an interactive shell
    (``quill shell``)."""


CommandHandle = Annotated[str, Meta(pattern=r"^c[0-9a-f]{12}[A-Za-z0-9]{1,40}$")]
"""A live command's id (``exec.run`` with ``yield_ms``): opaque; it names the executor holding
the command."""


class CommandPoll(Request, frozen=True, kw_only=True):
    """A live command's output after a ``cursor``, and whether it still runs (when it ended:
    its exit status and the version its changes were committed as)."""

    command_id: CommandHandle
    """The live command (``exec.run``'s answer with ``running``: its ``command_id``)."""
    cursor: Annotated[str, Meta(pattern=r"^([0-9]{1,16}\.[0-9]{1,16})?$")] = ""
    """Where the last answer ended (its ``cursor``); empty: from the start."""
    wait_ms: Annotated[int, Meta(ge=0, le=LIVE_WAIT_MAX_MS)] = 0
    """With nothing new after ``cursor`` and the command running, wait up to this long for
    output or its end (answered as soon as either comes)."""
    max_bytes: Annotated[int, Meta(ge=1, le=LIVE_POLL_MAX_BYTES)] = 64 * 1024
    """The most bytes of each stream to return (page on with the answer's ``cursor``)."""


class CommandInput(Request, frozen=True, kw_only=True):
    """Bytes to a live command's standard input; ``eof`` closes it after them."""

    command_id: CommandHandle
    """The live command (``exec.run``'s answer with ``running``: its ``command_id``)."""
    data: Annotated[bytes, Meta(max_length=LIVE_INPUT_MAX_BYTES)] = b""
    """What to write (base64 in JSON): at most ``limits.LIVE_INPUT_MAX_BYTES`` (64 KiB)."""
    eof: bool = False
    """Close its standard input after ``data`` (a read gets end of file)."""


class CommandResize(Request, frozen=True, kw_only=True):
    """A new size for a live command's terminal (``exec.run`` with ``pty``): its processes get
    SIGWINCH, as from a terminal window resized."""

    command_id: CommandHandle
    """The live command (``exec.run``'s answer with ``running``: its ``command_id``)."""
    rows: Annotated[int, Meta(ge=1, le=PTY_MAX_SIDE)]
    """Lines of the terminal (1..4096)."""
    cols: Annotated[int, Meta(ge=1, le=PTY_MAX_SIDE)]
    """Columns of the terminal (1..4096)."""


SignalName = Literal["INT", "TERM", "KILL", "HUP"]


class CommandSignal(Request, frozen=True, kw_only=True):
    """A signal to every process of a live command. ``TERM`` is followed by ``KILL`` after the
    grace period (5 s) if it still runs."""

    command_id: CommandHandle
    """The live command (``exec.run``'s answer with ``running``: its ``command_id``)."""
    signal: SignalName
    """``INT``, ``TERM``, ``KILL`` or ``HUP``."""


class LiveCommandsQuery(Request, frozen=True, kw_only=True):
    """The commands that run on in the workspace (``exec.run`` with ``yield_ms``), on every
    executor."""


OutputStream = Literal["stdout", "stderr"]


class CommandOutputQuery(Request, frozen=True, kw_only=True):
    """A page of the whole output a command wrote (``exec.run``), kept for a while after it
    ended (an hour by default), by the command's id (``CommandResult.command_id``)."""

    command_id: Annotated[str, Meta(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
    """The command's id: its ``Ws-Request-Id``."""
    stream: OutputStream = "stdout"
    """``stdout`` or ``stderr``."""
    offset: Annotated[int, Meta(ge=0, le=2**53)] = 0
    """First byte to return."""
    length: Annotated[int, Meta(ge=1, le=1024 * 1024)] = 64 * 1024
    """Most bytes to return (a page ends early rather than split a UTF-8 character)."""


GitAction = Literal[
    "status", "diff", "commit", "checkout", "branch", "log", "push", "pull", "clone"
]


class GitCommand(Execution, frozen=True, kw_only=True):
    """A structured git operation on the repository at ``workdir``. Its ``.git`` lives in the
    workspace like any file, so git state is versioned too."""

    action: GitAction
    """What to do: ``status``, ``diff``, ``commit``, ``checkout``, ``branch``, ``log``,
    ``push``, ``pull`` or ``clone``."""
    message: Annotated[str, Meta(min_length=1, max_length=64 * 1024)] | None = None
    """``commit``: the commit message (required)."""
    files: Annotated[list[PathArg], Meta(max_length=10_000)] | None = None
    """``commit``: stage these paths first (default: every change, untracked files included)."""
    branch: Annotated[str, Meta(min_length=1, max_length=255)] | None = None
    """``checkout``: the branch (created from the current commit if it does not exist);
    ``push``/``pull``: the branch (default: the current one)."""
    remote: Annotated[str, Meta(min_length=1, max_length=255)] = "origin"
    """``push``/``pull``: the remote."""
    url: Annotated[str, Meta(min_length=1, max_length=4096)] | None = None
    """``clone``: the repository to clone into ``workdir`` (which must be empty or absent)."""
    path: PathArg | None = None
    """``diff``/``log``: only this path."""
    limit: Annotated[int, Meta(ge=1, le=1000)] = 20
    """``log``: most commits."""
