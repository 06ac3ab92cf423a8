"""Reply envelope and the result of each op.

Every reply is ``{"ok": true, "version": V, "result": {...}}`` or
``{"ok": false, "error": {"code": "...", "message": "...", "details": {...}}}``. ``version``
is the workspace version a command produced or a query answered at. Result fields are always
present (``null`` when they do not apply).

Size: the whole reply side of the wire in one module, as ``requests.py``; no logic.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

import msgspec

from contracts.limits import Limits
from contracts.merging import Conflict

R = TypeVar("R")

Kind = Literal["file", "directory"]


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    message: str
    details: dict[str, Any] = {}


class Reply(msgspec.Struct, Generic[R], frozen=True, kw_only=True, omit_defaults=True):
    ok: bool
    version: int | None = None
    result: R | None = None
    error: ErrorBody | None = None


class Result(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every result."""


# ---------------------------------------------------------------- command results


class WorkspaceCreatedResult(Result, frozen=True, kw_only=True):
    tenant: str
    workspace: str
    created: bool
    """False when ``exist_ok`` found it already there."""
    trust: str
    limits: Limits


class FileWritten(Result, frozen=True, kw_only=True):
    path: str
    """The normalised path."""
    bytes_written: int
    """Bytes this request wrote (for ``append``: the appended bytes)."""
    size: int
    """Size of the file afterwards."""
    file_version: int
    """The file's version after this write."""
    etag: str
    """Its etag (``v<file_version>``), for ``if_match``."""
    created: bool
    """True if the file did not exist before."""
    modified: datetime
    """When the write was committed: the event's time, the file's ``modified`` from now on."""
    previous_size: int | None = None
    """Size of the file this write replaced (or appended to); null when it created the file."""
    committed: bool = True
    """False when the file already had exactly this content: nothing changed, no new version
    (``file_version``, ``etag`` and ``modified`` are the file's as they were)."""


class DirectoryMade(Result, frozen=True, kw_only=True):
    path: str
    created: list[str]
    """Directories this request created, outermost first (empty if all existed)."""


class PathDeleted(Result, frozen=True, kw_only=True):
    path: str
    kind: Kind | None
    deleted: int
    """Entries removed (files and directories)."""


class PathMoved(Result, frozen=True, kw_only=True):
    path: str
    to: str
    kind: Kind
    moved: int
    """Entries moved (files and directories)."""


class ChangeConflict(msgspec.Struct, frozen=True, kw_only=True):
    """A change of an ``apply`` that was not committed, and why."""

    path: str
    reason: str
    changed_at: int | None
    """Version at which the path last changed, when that is the reason."""


class ChangesApplied(Result, frozen=True, kw_only=True):
    applied: list[str]
    """Paths changed by this request (empty if every change conflicted or was a no-op)."""
    conflicts: list[ChangeConflict]
    committed: bool
    """False when nothing was committed (no event, version unchanged)."""
    uncommitted_recorded: bool = False
    """True when the event recorded a new set of paths left uncommitted (``uncommitted``),
    even with no change committed."""


class FileEdited(Result, frozen=True, kw_only=True):
    path: str
    replacements: int
    """Occurrences replaced."""
    lines_changed: int
    """Lines that differ between the old and the new text."""
    size: int
    file_version: int
    etag: str
    committed: bool = True
    """False when the edit left the text as it was: no new version."""


class FileModified(Result, frozen=True, kw_only=True):
    path: str
    operations: int
    replacements: int
    """Matches replaced by the ``regex_replace`` operations."""
    lines_before: int
    lines_after: int
    size: int
    file_version: int
    etag: str
    committed: bool = True
    """False when the operations left the text as it was (inserting an empty text, a regex
    replacing a match with itself): nothing changed, no new version."""


class Restored(Result, frozen=True, kw_only=True):
    path: str | None
    version: int
    """The version restored."""
    changed: list[str]
    """Paths changed (first 100)."""
    changed_total: int
    committed: bool
    """False when it already was as at ``version`` (no event)."""


# ---------------------------------------------------------------- query results


class FileContent(Result, frozen=True, kw_only=True):
    path: str
    kind: Kind
    content: str | None
    """The text asked for (``null`` for a binary file). For a directory: its listing,
    one name a line, directories with a trailing ``/``."""
    binary: bool
    total_lines: int
    returned_lines: int
    start_line: int
    truncated: bool
    """True when a read limit left out lines or bytes of the window asked for (``cut`` says
    which and how to read them); a range asked for (head, tail, offset/limit) is not a cut.
    For a directory: more entries than the listing shows."""
    size: int
    file_version: int | None
    etag: str | None
    modified: datetime
    mime_type: str | None
    start_char: int = 0
    """The content starts at this character (0-based) of line ``start_line``: not 0 when a
    line was read from ``char_offset``, or a tail kept the end of a line longer than
    ``max_read_bytes``."""
    end_char: int | None = None
    """Set when the content stops within its last line (a line longer than
    ``max_read_bytes``): the character of that line where it stops."""
    cut: ReadCut | None = None
    """Set when a read limit cut the window asked for: what it left out and the read that
    returns it. ``null`` when the window asked for was returned whole."""


ReadLimit = Literal["lines", "bytes"]


class ReadCut(msgspec.Struct, frozen=True, kw_only=True):
    """What a read limit left out of the lines a read asked for, and how to get it.

    A tail keeps its last lines: what is left out is before them. Any other window keeps its
    first lines: what is left out is after them."""

    by: ReadLimit
    """The limit that cut: ``max_read_lines`` (``lines``) or ``max_read_bytes`` (``bytes``)."""
    max: int
    """That limit's value."""
    first_missing: int
    last_missing: int
    """The lines of the window not returned (whole): ``first_missing``..``last_missing``."""
    offset: int
    limit: int
    char_offset: int
    """The read that returns (the next part of) them: ``offset``, ``limit`` and
    ``char_offset`` to read with."""
    line: int | None = None
    """Set when a line longer than ``max_read_bytes`` was returned in part: its number."""
    line_length: int | None = None
    """That line's length, in characters."""


class FileBytes(Result, frozen=True, kw_only=True):
    path: str
    data: bytes
    offset: int
    size: int
    """Size of the whole file."""
    truncated: bool
    """True when bytes after this chunk remain."""
    file_version: int
    etag: str


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a directory listing."""

    name: str
    path: str
    kind: Kind
    size: int
    """Bytes (0 for a directory)."""
    modified: datetime
    file_version: int | None
    etag: str | None


class Listing(Result, frozen=True, kw_only=True):
    path: str
    entries: list[Entry]
    total: int
    """Entries in all pages."""
    truncated: bool
    """True when more entries follow this page."""
    next: str | None = None
    """Pass as ``after`` to get the next page; null on the last one. It is ``d:<path>`` or
    ``f:<path>``, the kind and path of this page's last entry."""


class FileInfo(Result, frozen=True, kw_only=True):
    path: str
    kind: Kind
    size: int
    """Bytes for a file; 0 for a directory."""
    file_version: int | None
    etag: str | None
    sha256: str | None
    binary: bool
    mime_type: str | None
    permissions: str
    """``644``/``755`` for files (``755`` when executable), ``755`` for directories."""
    created: datetime
    modified: datetime
    changed_version: int
    """Workspace version at which this entry last changed."""
    entries: int | None
    """Number of direct entries, for a directory."""


class Revision(msgspec.Struct, frozen=True, kw_only=True):
    """One change of a path or one event of the workspace."""

    version: int
    at: datetime
    op: str
    actor: str | None
    request_id: str | None
    change: str
    """For a path: ``created``, ``modified``, ``deleted`` or ``moved``; for the workspace:
    the event type."""
    kind: Kind | None = None
    size: int | None = None
    sha256: str | None = None
    file_version: int | None = None
    etag: str | None = None
    moved_from: str | None = None
    paths: list[str] | None = None
    """For workspace history: paths the event changed (first 100)."""
    changes_total: int | None = None
    """For workspace history: how many changes the event made (``paths`` names the first)."""
    path: str | None = None
    """With ``follow``: the name the file had at this revision, where it is not the asked
    path (it was moved since)."""


class HistoryPage(Result, frozen=True, kw_only=True):
    path: str | None
    revisions: list[Revision]
    truncated: bool
    """True when older revisions remain (page with ``before``)."""
    next_path: str | None = None
    """With ``follow``, when truncated: the path the next page asks (with ``before``, the last
    revision's version): the name the file had there."""


class Matches(Result, frozen=True, kw_only=True):
    """Entries matching a glob."""

    path: str
    pattern: str
    entries: list[Entry]
    """Newest first."""
    total: int
    """The matches; a lower bound when ``total_exact`` is false."""
    truncated: bool
    total_exact: bool = True
    """False when the search stopped before the end: a glob of the whole workspace at its
    newest version looks at its entries newest first and stops once it has looked at 1,000
    and found more than it returns, so what it costs does not grow with the tree."""


class GrepMatch(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    line: int
    """1-based line number."""
    text: str
    """The matching line (without its newline)."""
    before: list[str]
    after: list[str]


class GrepResult(Result, frozen=True, kw_only=True):
    pattern: str
    matches: list[GrepMatch]
    total: int
    """Matching lines in all, including those not returned."""
    truncated: bool
    files_searched: int
    files_matched: int


class TreeEntry(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    kind: Kind
    depth: int
    """1 for the entries of the explored directory."""
    size: int | None = None
    modified: datetime | None = None


class Tree(Result, frozen=True, kw_only=True):
    path: str
    entries: list[TreeEntry]
    """Depth-first, directories before files, by name."""
    total: int
    truncated: bool


class FileDiff(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    change: str
    """``added``, ``deleted`` or ``modified``."""
    binary: bool
    diff: str
    """Unified diff text (empty for a binary file)."""


class Diff(Result, frozen=True, kw_only=True):
    path: str | None
    from_version: int
    to_version: int
    files: list[FileDiff]
    diff: str
    """All the files' diffs as one unified diff."""
    truncated: bool
    """True when the diff was cut at the read limit."""


class WorkspaceInfo(Result, frozen=True, kw_only=True):
    tenant: str
    workspace: str
    root: str
    version: int
    created: datetime
    updated: datetime
    trust: str
    limits: Limits
    default_exclusions: list[str]
    capabilities: list[str]
    """The ops this deployment serves, as ``cmd.write``, ``qry.read``..."""
    files: int
    directories: int
    total_bytes: int
    tree_hash: str
    last_hash: str
    compaction: str | None = None
    """Why ``max_versions`` does not compact this workspace now (None: it does, or it has
    none): ``fork`` (a fork is never compacted), ``has_forks`` (not while it has forks)."""


class ChangeSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One change of an event, without its content."""

    kind: str
    """``put``, ``mkdir`` or ``delete``."""
    path: str
    size: int | None = None
    sha256: str | None = None
    moved_from: str | None = None
    change: str | None = None
    """What it did to ``path``, as git marks it: ``added`` (a new file or directory: A),
    ``modified`` (M), ``moved`` (here from ``moved_from``: R) or ``deleted`` (D)."""


class EventSummary(msgspec.Struct, frozen=True, kw_only=True):
    """An event as the ``events`` query shows it (file contents left out)."""

    type: str
    version: int
    seq: int
    at: datetime
    op: str
    actor: str | None
    session: str | None
    run: str | None
    request_id: str | None
    hash: str
    prev_hash: str
    tree_hash: str
    changes: list[ChangeSummary]
    changes_total: int
    message: str | None = None
    """The event's message (a command's commit: ``$ <command line>``; first 1,000
    characters)."""


class EventPage(Result, frozen=True, kw_only=True):
    events: list[EventSummary]
    next_after: int
    """Pass as ``after`` for the next page."""
    has_more: bool


class TreeItem(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A file or directory of ``qry.tree``."""

    path: str
    kind: Kind
    sha256: str | None = None
    size: int = 0
    executable: bool = False
    file_version: int | None = None
    blob: bool = False
    """Its content is not in the page's ``contents``: it is in WS_BLOBS (by ``sha256``)."""


class TreeLock(msgspec.Struct, frozen=True, kw_only=True):
    holder: str
    """The session holding the workspace's lock."""
    expires: datetime


class TreeArchive(msgspec.Struct, frozen=True, kw_only=True):
    since: datetime
    by: str | None = None
    reason: str | None = None


class TreeUncommitted(msgspec.Struct, frozen=True, kw_only=True):
    """A path a command left uncommitted, as the log records it."""

    path: str
    reason: str
    by_command: str
    version: int


class TreeHead(msgspec.Struct, frozen=True, kw_only=True):
    """What the workspace is as of the tree's version, besides its files (``qry.tree``'s
    first page)."""

    version: int
    seq: int
    """The log position (``WS_EVENTS`` stream sequence) of the event that made ``version``."""
    tree_hash: str
    """The tree hash that event carries (``contracts.hashing``): the pages' entries sum to it."""
    trust: str
    commands: bool
    """``restricted``: whether commands are offered."""
    limits: Limits
    floor: int
    """The oldest version whose whole tree is kept (compaction)."""
    lock: TreeLock | None = None
    archived: TreeArchive | None = None
    uncommitted: list[TreeUncommitted] = []
    forked_from: list[str] = []
    """A fork's layers, nearest first (issue 33): the workspaces (same tenant) whose
    namespaces of WS_BLOBS hold the large contents it inherited."""


class TreePage(Result, frozen=True, kw_only=True):
    head: TreeHead | None = None
    """On the first page (no ``after``)."""
    entries: list[TreeItem]
    contents: dict[str, bytes]
    """The contents of the page's files, by sha256 (each once)."""
    next: str | None = None
    """Pass as ``after`` (with the same ``version``) for the next page; null on the last."""
    changed: list[str] | None = None
    """With ``changed_from``, on the first page: the paths changed between the two versions,
    sorted (some may be absent as of ``version``: what is there now is to go); null when the
    reader cannot tell in O(changes) (then no entries: ask for the whole tree)."""


# ---------------------------------------------------------------- runs, locks, trust


class RunInfo(Result, frozen=True, kw_only=True):
    run: str
    parent: str | None
    version: int
    """The version the run reads."""
    started: datetime
    started_version: int
    """The version of its ``run_started`` event."""
    ended_version: int | None
    """The version of its ``run_ended`` event (None while it runs)."""
    actor: str | None


class AttachedWorkspace(msgspec.Struct, frozen=True, kw_only=True):
    uri: str
    target: str
    """``tenant/workspace``."""
    kind: str
    """``server``, ``git`` or ``local``."""


class Attached(Result, frozen=True, kw_only=True):
    primary: str
    """``tenant/workspace`` of the session's primary workspace."""
    attached: list[AttachedWorkspace]
    """In the order they were attached (resolution tries them in this order)."""


class WorkspaceSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A workspace as ``workspaces`` lists it."""

    workspace: str
    """Its name (without the tenant)."""
    version: int
    files: int
    total_bytes: int
    created: datetime
    updated: datetime
    """When its last event was committed."""
    updated_by: str | None
    """The actor of its last event."""
    last_op: str
    """The op of its last event (``write``, ``archive``...)."""
    trust: str
    lock_holder: str | None
    """The session holding its lock (None: nobody, or the lock expired)."""
    archived: bool


class WorkspaceList(Result, frozen=True, kw_only=True):
    tenant: str
    workspaces: list[WorkspaceSummary]
    """By name."""
    next: str | None
    """Pass as ``after`` for the next page; null on the last one."""


class ArchiveInfo(Result, frozen=True, kw_only=True):
    archived: bool
    changed: bool
    """False when it already was (or was not) archived: nothing recorded."""


# ---------------------------------------------------------------- forks (issue 33)


class Forked(Result, frozen=True, kw_only=True):
    workspace: str
    """``tenant/workspace``: the fork."""
    source: str
    """``tenant/workspace`` it was forked from."""
    version: int
    """The version forked at: the fork's version now (its first change is the next)."""
    trust: str
    limits: Limits


class ForkSummary(msgspec.Struct, frozen=True, kw_only=True):
    workspace: str
    """The fork's name (same tenant)."""
    version: int
    """The source's version it was forked at."""
    ahead: int
    """Versions the fork has made since."""
    behind: int
    """Versions the source has made since."""


class ForkList(Result, frozen=True, kw_only=True):
    workspace: str
    """``tenant/workspace`` whose forks these are."""
    forks: list[ForkSummary]
    truncated: bool = False


class MergeChange(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One change a merge makes (or would make) to the target."""

    path: str
    kind: Literal["put", "mkdir", "delete"]
    source: Literal["ours", "theirs", "merged"] | None = None
    """For a put: whose content (``merged``: merged line by line, or with markers)."""
    size: int | None = None


class Merged(Result, frozen=True, kw_only=True):
    workspace: str
    """``tenant/workspace``: the target."""
    source: str
    """``tenant/workspace`` merged in."""
    from_version: int
    """The version of ``source`` merged."""
    base_version: int
    """The merge base: the target's version the merge started from (the fork point, or the
    last merge between the two, either way: the target's version at its merge of
    ``source``, or the target's version ``source`` took in its merge of the target)."""
    from_base: int
    """The same base as a version of ``source``."""
    strategy: str
    dry_run: bool
    committed: bool
    """False for a dry run, a merge that changes nothing, or one refused (``refused``)."""
    changes: list[MergeChange]
    """What it changes (the first 1,000)."""
    changes_total: int
    conflicts: list[Conflict]
    """The conflicts found (the first 100), each with how the strategy decided it."""
    conflicts_total: int
    marked: list[str]
    """The files written with conflict markers (``markers``)."""
    merged: list[str]
    """The texts both sides changed that merged line by line without a conflict."""
    refused: str | None = None
    """Why it would commit nothing (a dry run with conflicts its strategy does not decide)."""


class Purged(Result, frozen=True, kw_only=True):
    workspace: str
    """``tenant/workspace``."""
    version: int
    """The version it had when it was purged."""


class LockInfo(Result, frozen=True, kw_only=True):
    holder: str | None
    """The session holding the workspace (None: nobody)."""
    expires: datetime | None


class TrustInfo(Result, frozen=True, kw_only=True):
    trust: str
    commands: bool
    """``restricted``: whether commands are offered."""
    changed: bool


class Approval(msgspec.Struct, frozen=True, kw_only=True):
    approval_id: str
    op: str
    summary: str
    requested_by: str | None
    requested: datetime
    version: int
    """The version of its ``approval_requested`` event."""
    preview: str | None = None
    """The change it would make, as a unified diff as of ``version`` (None: a command)."""


class ApprovalList(Result, frozen=True, kw_only=True):
    pending: list[Approval]


class ApprovalResult(Result, frozen=True, kw_only=True):
    approval_id: str
    approved: bool


class ApprovalOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What carrying out an approved request gave: its reply, kept under the approval id
    (``infra/approvals.py``)."""

    at: datetime
    version: int | None = None
    """The workspace version its reply named (what it committed, or read)."""
    result: dict[str, Any] | None = None
    """Its result, as the op's own reply would hold it (``exec.run``: a ``CommandResult``)."""
    error: ErrorBody | None = None
    """Its error, when it failed (``CONFLICT`` for an ``if_match`` no longer met...)."""


class ApprovalStatus(Result, frozen=True, kw_only=True):
    """One approval: ``pending``, ``approved`` (``outcome`` once it was carried out),
    ``denied`` or ``expired``."""

    approval_id: str
    state: Literal["pending", "approved", "denied", "expired"]
    op: str
    summary: str
    requested_by: str | None
    requested: datetime
    version: int
    """The version of its ``approval_requested`` event."""
    expires: datetime | None = None
    """Its deadline while pending (``approval_ttl_s`` after it was asked)."""
    decided_by: str | None = None
    reason: str | None = None
    """Why it was denied (``expired`` when it expired)."""
    done: bool = False
    """Final: denied, expired, or approved and carried out (``outcome`` says how)."""
    outcome: ApprovalOutcome | None = None


# ---------------------------------------------------------------- exec results


class ChangedPath(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    change: Literal["created", "modified", "deleted"]
    kind: Literal["file", "directory"]


class SkippedPath(msgspec.Struct, frozen=True, kw_only=True):
    """A path the command left that was not committed (it stays in the executor's checkout)."""

    path: str
    reason: str
    """``symlink``, ``not a regular file``, ``over max_file_bytes (10 MiB > 4 MiB)``,
    ``invalid name: ...``. The file tools answer such a path with this reason."""


class CapturedChanges(msgspec.Struct, frozen=True, kw_only=True):
    """What a command changed in the workspace, and what became of it."""

    base_version: int
    """The version the command ran against (its changes were committed on it)."""
    committed: bool
    """True when its changes were committed as one event."""
    version: int
    """The workspace version after that event (``base_version`` when no event was made; an
    event may record only the paths left uncommitted, ``committed`` staying false)."""
    paths: list[ChangedPath]
    """Paths committed (first 100), in path order."""
    total: int
    """Paths committed in all."""
    conflicts: list[ChangeConflict]
    """Paths it changed that were also changed by someone else since ``base_version``: not
    committed (the other change stands)."""
    skipped: list[SkippedPath]
    ignored: list[str]
    """Paths it created that an ignore pattern leaves out (first 100; ``ignored_total`` in
    all, ``ignored_reasons`` why): not committed, kept in the executor's checkout. Each is
    reported once (the first command that leaves it out); an ignored directory is one path
    (what is in it is not looked at)."""
    error: str | None = None
    ignored_total: int = 0
    """Paths left out by an ignore pattern in all."""
    ignored_reasons: dict[str, int] = {}
    """How many of them each rule left out: ``quillignore`` (Quill's defaults,
    ``node_modules``, ``.venv``, ``__pycache__``..., or the workspace's ``.quillignore``),
    ``gitignored`` (a ``.gitignore`` file, as git reads it; the workspace option ``gitignore``
    turns that off). A path the workspace holds is never left out: its changes are committed
    whatever a pattern says."""
    warnings: list[str] = []
    """What could not be honoured, e.g. ``sub/.gitignore: over 64 KiB (70000 bytes): not
    honoured`` (also a ``.gitignore`` that is a symlink): the paths it names were committed."""
    """Why nothing could be committed (e.g. over a limit), when that happened."""


class CommandResult(Result, frozen=True, kw_only=True):
    """What a command did. A non-zero ``exit_code`` is a result, not an error."""

    exit_code: int
    """Its exit status; a command ended by a signal gives 128 + the signal's number."""
    stdout: str
    """Standard output (invalid UTF-8 replaced); past ``max_output_bytes``, its beginning only:
    the end is ``stdout_tail``, and ``stdout_omitted_bytes`` are left out between them."""
    stderr: str
    stdout_truncated: bool
    """Part of standard output is left out (``stdout_omitted_bytes``)."""
    stderr_truncated: bool
    stdout_bytes: int
    """Bytes the command wrote to standard output in all."""
    stderr_bytes: int
    duration_ms: int
    timed_out: bool
    """It ran past its timeout: it got SIGTERM, then SIGKILL 5 s later; output is what it had
    written by then."""
    changes: CapturedChanges
    command_id: str = ""
    """The command's id (its request id): ``exec.output`` reads its whole output by it."""
    stdout_tail: str = ""
    """The end of standard output when its middle is left out (else empty)."""
    stdout_omitted_bytes: int = 0
    """Bytes of standard output left out between ``stdout`` and ``stdout_tail``."""
    stdout_omitted_offset: int = 0
    """Where they start: read them with ``exec.output`` from this offset (secrets are
    redacted before offsets are counted)."""
    stderr_tail: str = ""
    stderr_omitted_bytes: int = 0
    stderr_omitted_offset: int = 0
    output_kept: bool = False
    """Its whole output (up to the executor's cap a stream) can be read with ``exec.output``
    for a while (an hour by default)."""
    background_killed: int = 0
    """Processes the command left running (``cmd &``), killed when it ended: nothing runs
    after a command."""
    stdin_read: bool = False
    """The command waited to read standard input, which is closed: it read end of file (a
    ``read -p`` prompt, ``input()``)."""
    running: bool = False
    """``yield_ms``: the command still ran when it passed; it runs on under ``command_id``
    (``exec.poll``, ``exec.input``, ``exec.signal``). ``stdout``/``stderr`` are its output so
    far, ``cursor`` where it ends, ``exit_code`` is -1 and ``changes`` empty (its changes are
    committed when it ends: ``exec.poll`` says as what version)."""
    cursor: str = ""
    """``running``: give it to ``exec.poll`` for the output after this answer's."""
    shell: str | None = None
    """The shell it ran in (``RunCommand.shell``)."""
    background: CapturedChanges | None = None
    """In a shell: what its background processes had changed since its last command,
    committed before this one ran (None: nothing)."""
    kept_conflicts: list[str] = []
    """In a shell: paths changed both in the shell and in the workspace since; the shell
    keeps its own version, uncommitted (the workspace's stands in the log)."""


class ShellOpened(Result, frozen=True, kw_only=True):
    shell: str
    """Its id: give it to ``exec.run`` (``shell``), ``exec.checkpoint``, ``exec.shell_close``."""
    version: int
    """The version its checkout holds."""
    idle_timeout_ms: int
    expires: datetime
    """When it is closed whatever it does (its maximum lifetime)."""


class ShellCheckpointed(Result, frozen=True, kw_only=True):
    shell: str
    background: CapturedChanges
    """What its background processes changed since its last command (committed as one event
    attributed to the shell, its message marked background)."""
    kept_conflicts: list[str] = []


class ShellClosed(Result, frozen=True, kw_only=True):
    shell: str
    background: CapturedChanges | None = None
    """What its background processes changed since its last command, committed as it closed."""
    killed: int = 0
    """Processes it still had, killed."""


class CommandStatus(Result, frozen=True, kw_only=True):
    """A live command's output after the cursor asked for, and whether it still runs."""

    command_id: str
    running: bool
    stdout: str
    """Standard output after the cursor (at most ``max_bytes``; invalid UTF-8 replaced)."""
    stderr: str
    cursor: str
    """Where this answer's output ends: give it to the next ``exec.poll``."""
    more: bool = False
    """More output is kept past ``cursor`` already (poll again at once)."""
    dropped: int = 0
    """Bytes of output after the asked cursor that are not kept, skipped (``cursor`` is past
    them): the oldest dropped by ``WS_OUTPUT``'s limits, or what came past the executor's
    ``keep_bytes`` of a stream."""
    exit_code: int | None = None
    """Once it ended: its exit status (128 + the signal's number when a signal ended it)."""
    timed_out: bool = False
    version: int | None = None
    """Once it ended: the version its changes were committed as (None: it changed nothing, or
    they could not be committed: ``error``)."""
    changed: int = 0
    """Paths its changes committed."""
    error: str | None = None
    """Why its changes were not committed, when they were not."""
    duration_ms: int | None = None


class InputWritten(Result, frozen=True, kw_only=True):
    """What ``exec.input`` wrote to a live command's standard input."""

    command_id: str
    written: int
    """Bytes written (fewer than sent when the command did not read them within 5 s)."""
    closed: bool
    """Its standard input is closed (``eof``, or it was before)."""


class SignalSent(Result, frozen=True, kw_only=True):
    command_id: str
    signal: str
    processes: int
    """Processes of the command that were sent it."""


class TerminalResized(Result, frozen=True, kw_only=True):
    """A live command's terminal's new size (``exec.resize``)."""

    command_id: str
    rows: int
    cols: int


class LiveCommand(msgspec.Struct, frozen=True, kw_only=True):
    """One command running on in a workspace (``exec.list``)."""

    command_id: str
    command: str
    """As audited (secrets redacted; its first 4,096 characters)."""
    workdir: str
    actor: str | None
    started: datetime
    shell: str | None = None
    """The shell it runs in (None: a sandbox of its own)."""
    stdin_open: bool = False


class LiveShell(msgspec.Struct, frozen=True, kw_only=True):
    """One open shell of a workspace (``exec.list``)."""

    shell: str
    actor: str | None
    started: datetime
    last_used: datetime
    version: int
    """The version its checkout was last brought to."""
    running: str | None = None
    """The id of the command it runs now (None: idle)."""


class LiveCommands(Result, frozen=True, kw_only=True):
    commands: list[LiveCommand]
    shells: list[LiveShell] = []
    """The shells open on the workspace (each command running in one is in ``commands``, its
    ``shell`` set)."""
    executors: int
    """Executors that answered (each lists its own)."""


class CommandFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What a command was and how it ended, kept with its output (``exec.run``'s)."""

    command: str
    """The command line, as audited (secrets redacted; its first 4,096 characters)."""
    workdir: str
    """Where it ran (``""``: the workspace's root)."""
    actor: str | None
    session: str | None
    run: str | None
    started: datetime
    duration_ms: int
    """How long it ran (in the sandbox)."""
    exit_code: int
    timed_out: bool
    base_version: int
    """The version it ran against."""
    version: int | None
    """The version its changes were committed as (None: it committed nothing)."""
    changed: int
    """Paths it committed."""
    error: str | None = None
    """Why its changes could not be committed, when they could not (an error code, or the
    reason ``CapturedChanges.error`` gives)."""


class CommandOutput(Result, frozen=True, kw_only=True):
    """A page of a command's kept output."""

    command_id: str
    stream: str
    offset: int
    text: str
    """The page (invalid UTF-8 replaced)."""
    length: int
    """Bytes in the page; the next page starts at ``offset + length``."""
    kept_bytes: int
    """Bytes of the stream kept (those that can be read)."""
    total_bytes: int
    """Bytes the command wrote to the stream (more than ``kept_bytes`` past the cap)."""
    more: bool
    """Kept bytes remain after this page."""
    complete: bool
    """The command has ended (else it is running, and more may come)."""
    command: CommandFacts | None = None
    """Once it has ended: what it was and how it ended (None while it runs, and for output
    kept by an executor that did not record it)."""


class GitFileStatus(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    status: str
    """``modified``, ``added``, ``deleted``, ``renamed``, ``copied``, ``type_changed`` or
    ``unmerged``."""
    original_path: str | None = None
    """For a rename or copy: where it came from."""


class GitStatus(msgspec.Struct, frozen=True, kw_only=True):
    branch: str | None
    """None when HEAD is detached."""
    upstream: str | None
    ahead: int
    behind: int
    staged: list[GitFileStatus]
    unstaged: list[GitFileStatus]
    untracked: list[str]


class GitCommit(msgspec.Struct, frozen=True, kw_only=True):
    sha: str
    author: str
    email: str
    at: datetime
    subject: str


class GitResult(Result, frozen=True, kw_only=True):
    """The outcome of a git action; the fields of other actions are null."""

    action: str
    output: str
    """What git printed (for ``diff``: the staged diff, then the unstaged one), up to
    ``max_output_bytes``; credentials redacted."""
    output_truncated: bool
    branch: str | None = None
    """The current branch after the action."""
    status: GitStatus | None = None
    """``status``."""
    staged_diff: str | None = None
    """``diff``: changes staged for the next commit."""
    unstaged_diff: str | None = None
    """``diff``: changes not staged."""
    branches: list[str] | None = None
    """``branch``: local branches."""
    commit: str | None = None
    """``commit``: the new commit's sha."""
    log: list[GitCommit] | None = None
    """``log``: newest first."""
    changes: CapturedChanges | None = None
    """For actions that change files (``commit``, ``checkout``, ``pull``, ``clone``): what they
    changed in the workspace, ``.git`` included."""
