"""The log (``ws.evt.<t>.<w>`` in stream WS_EVENTS) and the notifications.

A workspace is the fold of its events. Each event is one JSON message; its hash is the
sha256 of the message payload (hex), carried in the ``Ws-Event-Hash`` header; the next event
carries it as ``prev_hash``, so the log of a workspace is a hash chain. ``tree_hash`` is the
hash of the whole tree after the event (see ``contracts.hashing``).

Changes inside a ``changes_committed`` event are applied in order, all or nothing:

* ``put``: create or replace the file ``path`` (its parent exists). Content is inline as
  ``text`` (UTF-8) or ``data`` (base64), or stored in the WS_BLOBS object store under the
  name ``sha256`` when ``blob`` is true, or — for a move or restore — omitted, meaning the
  content ``sha256`` appeared earlier in this workspace's log.
* ``mkdir``: create the directory ``path`` (its parent exists).
* ``delete``: remove ``path`` and, for a directory, everything below it.

``uncommitted`` (optional, on an executor's ``changes_committed``) is the set of paths the
command's sandbox holds that Quill did not commit (over ``max_file_bytes``, a symlink, an
invalid name...), with why: it replaces the set recorded before; a later change that commits
or removes one of those paths clears it. Absent: the set is unchanged. The file tools answer
such a path with why it is not there (``FILE_NOT_FOUND`` with ``details.uncommitted``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, get_args

import msgspec

from contracts.limits import Limits


class Change(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    path: str


class PutFile(Change, frozen=True, kw_only=True, omit_defaults=True, tag="put"):
    sha256: str
    size: int
    file_version: int
    created: datetime
    """When this file came into being (kept across overwrites; reset by delete/recreate)."""
    executable: bool = False
    binary: bool = False
    text: str | None = None
    data: bytes | None = None
    blob: bool = False
    moved_from: str | None = None


class MakeDir(Change, frozen=True, kw_only=True, omit_defaults=True, tag="mkdir"):
    pass


class Remove(Change, frozen=True, kw_only=True, omit_defaults=True, tag="delete"):
    pass


AnyChange = PutFile | MakeDir | Remove


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    tenant: str
    workspace: str
    version: int
    at: datetime
    op: str
    """The operation that produced the event (``write``, ``apply``, ``create``...)."""
    request_id: str
    actor: str | None = None
    session: str | None = None
    run: str | None = None
    prev_hash: str
    tree_hash: str
    result: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    """The result the request was answered with, returned again to a retried request."""


class WorkspaceCreated(
    Event, frozen=True, kw_only=True, omit_defaults=True, tag="workspace_created"
):
    trust: str
    limits: Limits


class UncommittedPath(msgspec.Struct, frozen=True, kw_only=True):
    """A path a command left in its sandbox that was not committed, and why."""

    path: str
    """As the executor shows it (a name that breaks the path rule is escaped)."""
    reason: str
    """``over max_file_bytes (10 MiB > 4 MiB)``, ``symlink``, ``invalid name: ...``."""


class ChangesCommitted(
    Event, frozen=True, kw_only=True, omit_defaults=True, tag="changes_committed"
):
    changes: list[AnyChange]
    message: str | None = None
    uncommitted: list[UncommittedPath] | None = None
    """The paths the command's sandbox now holds uncommitted (replacing the set recorded
    before); None: unchanged. At most ``contracts.uncommitted.MAX_PATHS``."""
    merged_from: MergedFrom | None = None
    """On a merge (op ``merge``, issue 33): the workspace merged in and its version, and the
    merge base; the next merge of that workspace starts from here."""


MERGE_KEPT_MAX_BYTES = 512 * 1024
"""The most a merge's ``kept`` paths take in its event (as JSON); past it they are not
recorded (``MergedFrom.kept`` None)."""


class MergedFrom(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a merge took in: workspace ``workspace`` (same tenant) as of ``version``, merged
    against the base ``base_version`` of the target (``from_base``: that workspace's)."""

    workspace: str
    version: int
    base_version: int
    from_base: int
    kept: list[str] | None = None
    """The paths where the target after the merge differs from ``workspace`` as of
    ``version`` (sorted): where it kept its own change, merged a text line by line, wrote
    conflict markers, decided a conflict for ours, or its secret rules redacted what it took.
    A merge of the target back into ``workspace`` reads them (there ``workspace`` differs from
    the base) instead of every path either side changed since the fork point. None: not
    recorded (a merge before the field existed, or paths over ``MERGE_KEPT_MAX_BYTES``)."""


class RunStarted(Event, frozen=True, kw_only=True, omit_defaults=True, tag="run_started"):
    """An agent run began: its queries read the workspace as of ``pinned_version``."""

    run_id: str
    parent_run: str | None = None
    pinned_version: int


class RunEnded(Event, frozen=True, kw_only=True, omit_defaults=True, tag="run_ended"):
    run_id: str


class LockAcquired(Event, frozen=True, kw_only=True, omit_defaults=True, tag="lock_acquired"):
    """``holder`` (a session) holds the workspace until ``expires``: others' mutations wait or
    are refused with ``LOCKED``. Taking it again extends it."""

    holder: str
    expires: datetime


class LockReleased(Event, frozen=True, kw_only=True, omit_defaults=True, tag="lock_released"):
    holder: str
    reason: str
    """``unlock`` or ``expired``."""


class TrustChanged(Event, frozen=True, kw_only=True, omit_defaults=True, tag="trust_changed"):
    trust: str
    commands: bool = False
    """``restricted``: whether commands are offered (each approved first)."""


class ApprovalRequested(
    Event, frozen=True, kw_only=True, omit_defaults=True, tag="approval_requested"
):
    """A mutation or command on a restricted workspace waits for someone to decide it."""

    approval_id: str
    """The parked request's id (its ``Ws-Request-Id``)."""
    request_op: str
    """``cmd.write``, ``exec.run``..."""
    summary: str
    """What it would do: the paths, or the command line (never contents)."""
    requested_by: str | None = None
    preview: str | None = None
    """The change it would make if decided at this version, as a unified diff (contents
    redacted; at most ``contracts.limits.PREVIEW_MAX_BYTES``); None for a command, whose
    changes are known only once it has run."""
    digest: str | None = None
    """sha256 of the request's body: what is approved is this body and no other."""
    expires: datetime | None = None
    """Its deadline (``approval_ttl_s`` after it was asked): still undecided then, it is
    expired, decided from the log alone (None: asked before approvals expired)."""


class ApprovalDecided(Event, frozen=True, kw_only=True, omit_defaults=True, tag="approval_decided"):
    approval_id: str
    approved: bool
    reason: str | None = None


class WorkspaceAttached(
    Event, frozen=True, kw_only=True, omit_defaults=True, tag="workspace_attached"
):
    """A session (whose primary workspace this is) attaches another workspace."""

    uri: str
    """As the session named it: ``server:/t/w``, ``git:...``, ``macbook:~/dev/app``."""
    target: str
    """The ``tenant/workspace`` it is served as."""
    kind: str
    """``server``, ``git`` or ``local``."""


class WorkspaceDetached(
    Event, frozen=True, kw_only=True, omit_defaults=True, tag="workspace_detached"
):
    uri: str


class WorkspaceArchived(
    Event, frozen=True, kw_only=True, omit_defaults=True, tag="workspace_archived"
):
    """From here on the workspace refuses every command but ``unarchive`` and ``purge``."""

    reason: str | None = None


class WorkspaceUnarchived(
    Event, frozen=True, kw_only=True, omit_defaults=True, tag="workspace_unarchived"
):
    pass


class WorkspacePurged(Event, frozen=True, kw_only=True, omit_defaults=True, tag="workspace_purged"):
    """The workspace was deleted: every event before this one is purged from the log, and
    every projection and checkout of it is deleted when it reaches them. It is the only event
    left of the workspace (``version`` is the version it had, plus one); a ``workspace_created``
    after it starts a new workspace of that name at version 1 (and then it is purged too)."""

    purged_version: int
    """The version the workspace had."""


# ---------------------------------------------------------------- forks (issue 33)


class ForkBase(msgspec.Struct, frozen=True, kw_only=True):
    """A layer of a fork's history: workspace ``workspace`` (same tenant) as of ``version``."""

    workspace: str
    version: int


class WorkspaceForked(Event, frozen=True, kw_only=True, omit_defaults=True, tag="workspace_forked"):
    """The first event of a fork: its history up to ``version`` (this event's) *is*
    ``source``'s up to that version, nothing copied. ``prev_hash`` is the source's chain hash
    at that version and ``tree_hash`` its tree hash, so the fork's chain continues the
    source's prefix; the fork's first change is ``version + 1``. Trust, limits and whether a
    restricted workspace offers commands are the source's when it was forked."""

    source: str
    lineage: list[ForkBase]
    """The layers under the fork, nearest first: ``source`` as of ``version``, then (a fork
    of a fork) the source's own base, and so on."""
    trust: str
    limits: Limits
    commands: bool = False


SCRUB_OP = "scrub"
"""``op`` of the ``history_compacted`` event that closes a scrubbed log (``quill scrub``)."""


class HistoryCompacted(
    Event, frozen=True, kw_only=True, omit_defaults=True, tag="history_compacted"
):
    """Snapshot-and-trim (``max_versions``): the workspace's projection is exactly the
    ``CompactionManifest`` stored in WS_BLOBS under ``manifest``, and the log before this
    event is purged. Replay starts here: fold the manifest, then the events after it. The
    tree does not change (``tree_hash`` is the previous one)."""

    manifest: str
    """sha256 of the manifest (JSON) in WS_BLOBS; every content it names is there too."""
    manifest_size: int
    floor: int
    """The oldest version whose whole tree is kept: a query as of an older version is
    answered only for a path whose revision at that version was kept."""
    max_versions: int
    revisions_kept: int
    revisions_dropped: int
    events_dropped: int


class CompactionManifest(msgspec.Struct, frozen=True, kw_only=True):
    """What a compacted workspace keeps (``HistoryCompacted``): rows in the column order of
    the projection's tables (see ``infra/store/``)."""

    trust: str
    limits: Limits
    created: datetime
    floor: int
    revisions: list[tuple[Any, ...]]
    """``(path, version, until, parent, kind, sha256, size, file_version, executable, binary,
    created, modified, moved_from)``: per path its last ``max_versions`` revisions."""
    events: list[tuple[Any, ...]]
    """``(version, seq, type, op, at, actor, session, run, request_id, hash, prev_hash,
    tree_hash, changes, changes_total, result, message, born_files, born_dirs, born_bytes)``
    of the events from ``floor`` on, and of those that began a kept revision (a manifest made
    before ``message`` or the ``born_*`` counts were kept ends earlier: the missing are NULL
    in a projection, ``infra.sql.EVENT_ROW``)."""
    controls: list[tuple[int, str, str]]
    """``(version, type, event JSON)``: every control event (runs, locks, trust, approvals,
    attachments), all kept."""
    uncommitted: list[tuple[str, str, str, int]] = msgspec.field(default_factory=list)
    """``(path, reason, by_command, version)``: the paths recorded as left uncommitted by a
    command (``ChangesCommitted.uncommitted``) and still so."""


ControlEvent = (
    RunStarted
    | RunEnded
    | LockAcquired
    | LockReleased
    | TrustChanged
    | ApprovalRequested
    | ApprovalDecided
    | WorkspaceAttached
    | WorkspaceDetached
    | WorkspaceArchived
    | WorkspaceUnarchived
    | WorkspaceForked
)
"""The events that change a workspace's controls (runs, lock, trust, approvals, attachments,
archive)."""
CONTROL_EVENTS = get_args(ControlEvent)
"""The control event types, for ``isinstance``: the projections keep each of these events
whole (their ``controls`` table, a compaction's manifest), to fold again on a load."""

WorkspaceEvent = (
    WorkspaceCreated | ChangesCommitted | ControlEvent | HistoryCompacted | WorkspacePurged
)


# ---------------------------------------------------------------- notifications


class WorkspaceUpdated(msgspec.Struct, frozen=True, kw_only=True):
    """Published on ``ws.updated.<t>.<w>`` after every committed change."""

    tenant: str
    workspace: str
    version: int
    op: str
    actor: str | None
    request_id: str
    at: datetime
    paths: list[str]
    """Paths changed (first 100)."""
    paths_total: int
    tree_hash: str


class AuditRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Published on ``ws.audit.<t>.<w>`` (stream WS_AUDIT) for every operation, reads and
    failures included. Never carries file contents or command output."""

    at: datetime
    tenant: str
    workspace: str
    kind: str
    """``cmd``, ``qry`` or ``exec``."""
    op: str
    actor: str | None
    session: str | None
    run: str | None
    request_id: str | None
    outcome: str
    """``ok`` or ``error``."""
    error_code: str | None
    duration_ms: float
    version: int | None
    paths: list[str]
    """Paths the request named or changed (first 100)."""
    summary: str | None
    service: str
    instance: str
    details: dict[str, Any] | None = None
    """Op-specific facts: for ``exec.run`` the command line, workdir, exit code, timed_out and
    the names of the env variables it was given (never their values, never output)."""
