"""A workspace's state and the one fold that makes it: ``evolve(state, event)``.

A workspace is the fold of its events (``contracts/events.py``). What each event does to the
state is said here once, in one ``match`` over the tagged union ``WorkspaceEvent``, and every
part of Quill that folds a log folds it here:

* the writer (``services/writer/workspace.py``): each event it decides (its decider applied
  the changes to ``state.tree`` already, ``tree=False``), its compactions, its catch-up;
* the projections (``infra/store/``): ``core.plan`` evolves each workspace's head (its row)
  as it turns a batch into SQL rows; ``Store.load`` evolves the control events it keeps;
* the executor's checkouts (``infra/exec/checkout.py``), whose files are on disk
  (``tree=False``);
* ``quill replay``, ``verify``, ``export``, ``import`` and ``scrub`` (``quill_cli/tools``);
* the reader's run and attachment queries (the control events as of a version).

The state: the head (``exists``, ``version``, the log position and hash chain, ``tree_hash``,
trust, limits, times, ``floor``: what a projection's workspace row holds), the tree
(``core/tree.py``), the controls (runs, the lock, approvals, attachments, archive, whether a
restricted workspace offers commands) and the paths a command left uncommitted.

In place and incremental: an event costs what it changes. The writer decides each command
against the state the ones before it left, so a write allocates its nodes, never a copy of
the state. Pure: no I/O, no clock (an approval expires as of an event's time).

Adding an event: its contract (``contracts/events.py``; a control event joins
``ControlEvent``, and the projection keeps it with the others), its case here (and the state
it keeps), its decider (``core/decide.py``, ``decide_files.py``, ``decide_apply.py`` or
``decide_control.py``). Nothing else folds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import assert_never

from contracts import codec, hashing
from contracts.errors import ErrorCode, QuillError
from contracts.events import (
    SCRUB_OP,
    ApprovalDecided,
    ApprovalRequested,
    ChangesCommitted,
    CompactionManifest,
    HistoryCompacted,
    LockAcquired,
    LockReleased,
    RunEnded,
    RunStarted,
    TrustChanged,
    WorkspaceArchived,
    WorkspaceAttached,
    WorkspaceCreated,
    WorkspaceDetached,
    WorkspaceEvent,
    WorkspaceForked,
    WorkspacePurged,
    WorkspaceUnarchived,
)
from contracts.limits import DEFAULT_LIMITS, Limits
from contracts.uncommitted import Recorded, fold_uncommitted
from core.tree import Tree, apply_change, plant

DECIDED_KEPT = 1000
"""Decided approvals remembered per workspace (a retried request finds its decision)."""

# ---------------------------------------------------------------- the state


@dataclass(slots=True)
class RunState:
    pinned: int
    """The version the run reads."""
    parent: str | None
    started_version: int
    started: datetime
    actor: str | None
    ended_version: int | None = None
    ended: datetime | None = None


@dataclass(slots=True)
class LockState:
    holder: str
    expires: datetime

    def held_by_other(self, session: str | None, now: datetime) -> bool:
        return self.expires > now and self.holder != session

    def refusal(self) -> QuillError:
        """``LOCKED``: what a mutation of another session is answered while the lock holds."""
        return QuillError(
            ErrorCode.LOCKED,
            f"Workspace is locked by session {self.holder} until {self.expires.isoformat()}",
            {"holder": self.holder, "expires": self.expires.isoformat()},
        )


@dataclass(slots=True)
class ApprovalState:
    op: str
    summary: str
    requested_by: str | None
    requested: datetime
    version: int
    approved: bool | None = None
    """None while pending."""
    decided_by: str | None = None
    reason: str | None = None
    preview: str | None = None
    """What it would change (a diff), kept while it waits."""
    session: str | None = None
    digest: str | None = None
    """sha256 of the parked request's body (``infra/approvals.py``)."""
    expires: datetime | None = None
    expired: bool = False
    """It passed its deadline undecided (``approved`` is then False)."""

    def state(self, now: datetime) -> str:
        """``pending``, ``approved``, ``denied`` or ``expired`` (at ``now``)."""
        if self.expired or (self.approved is None and self.past(now)):
            return "expired"
        if self.approved is None:
            return "pending"
        return "approved" if self.approved else "denied"

    def past(self, now: datetime) -> bool:
        """Undecided past its deadline at ``now``."""
        return self.approved is None and self.expires is not None and self.expires <= now

    def same(self, op: str, actor: str | None, session: str | None, digest: str) -> bool:
        """Whether it parks the same request (op, body) from the same session and actor."""
        return (self.op, self.requested_by, self.session, self.digest) == (
            op,
            actor,
            session,
            digest,
        )


@dataclass(slots=True)
class ArchiveState:
    at: datetime
    by: str | None
    reason: str | None

    def refusal(self, workspace: str) -> QuillError:
        """``WORKSPACE_ARCHIVED``: what every command but unarchive and purge is answered."""
        return QuillError(
            ErrorCode.WORKSPACE_ARCHIVED,
            f"Workspace {workspace} is archived (since {self.at.isoformat()}): unarchive it "
            "to change it; reads and history still work",
            {"archived_at": self.at.isoformat(), "archived_by": self.by, "reason": self.reason},
        )


@dataclass(slots=True)
class Controls:
    """A workspace's control state (its trust level is ``WorkspaceState.trust``)."""

    commands: bool = False
    """``restricted``: whether commands are offered (each approved first)."""
    runs: dict[str, RunState] | None = None
    lock: LockState | None = None
    attached: dict[str, tuple[str, str]] | None = None
    """uri → (tenant/workspace, kind), in attach order."""
    approvals: dict[str, ApprovalState] | None = None
    archived: ArchiveState | None = None
    """Set while the workspace is archived."""

    def run(self, run_id: str) -> RunState | None:
        return (self.runs or {}).get(run_id)

    def approval(self, approval_id: str) -> ApprovalState | None:
        return (self.approvals or {}).get(approval_id)

    def pending(self, now: datetime | None = None) -> list[tuple[str, ApprovalState]]:
        """The approvals undecided (and, given ``now``, not past their deadline then)."""
        return [
            (k, a)
            for k, a in (self.approvals or {}).items()
            if a.approved is None and not (now is not None and a.past(now))
        ]


@dataclass(slots=True)
class WorkspaceState:
    """Everything the fold of a workspace's log gives: its head, tree, controls and the
    paths left uncommitted (see the module docstring)."""

    tenant: str
    workspace: str
    exists: bool = False
    version: int = 0
    last_seq: int = 0
    """Stream sequence of the workspace's last event: the CAS precondition of the next append."""
    last_hash: str = hashing.ZERO_HASH
    trust: str = "full"
    limits: Limits = DEFAULT_LIMITS
    created: datetime | None = None
    updated: datetime | None = None
    tree_hash: str = ""
    """The last event's ``tree_hash`` (what the tree hashes to, for a fold that keeps it)."""
    floor: int = 0
    """The oldest version whose whole tree is kept (``history_compacted``; 0: every one)."""
    lineage: tuple[tuple[str, int], ...] = ()
    """A fork's layers, nearest first: ``(workspace, version)`` whose history up to that
    version is this one's (``workspace_forked``); empty: not a fork."""
    tree: Tree = field(default_factory=Tree)
    controls: Controls = field(default_factory=Controls)
    uncommitted: dict[str, Recorded] = field(default_factory=dict)
    """Paths a command left in its sandbox uncommitted, as recorded (``contracts.uncommitted``)."""

    @property
    def restricted(self) -> bool:
        """The workspace exists and is restricted: its commands are approved first."""
        return self.exists and self.trust == "restricted"


def forget(state: WorkspaceState) -> None:
    """``state`` with no workspace (after a purge: a ``create`` starts at version 1, its chain
    from the zero hash); only the log position (the CAS of the next append) stays."""
    fresh = WorkspaceState(state.tenant, state.workspace, last_seq=state.last_seq)
    for slot in WorkspaceState.__slots__:
        setattr(state, slot, getattr(fresh, slot))


# ---------------------------------------------------------------- the fold


def evolve(
    state: WorkspaceState,
    event: WorkspaceEvent,
    digest: str | None = None,
    seq: int | None = None,
    *,
    tree: bool = True,
    manifest: CompactionManifest | None = None,
) -> bool:
    """Fold ``event`` into ``state``, in place. True when it started the state over: nothing
    of what it held before stays (a purge, a creation after one, a compaction's manifest
    restored, ``rebuilds``); a caller keeping something beside the state (a checkout's
    files) starts over too.

    ``digest`` and ``seq``: the event's hash and stream sequence; the state's head moves to
    the event (``seq`` None: not known yet, the writer's before its append). ``digest`` None:
    the event's effect alone, the head does not move (a control event refolded from the
    projection's table or a compaction's manifest). ``tree`` False: its changes are not
    applied to ``state.tree``, which holds them already (the writer's decider applied them as
    it decided) or is kept elsewhere (a checkout's files, the projection's rows).
    ``manifest``: the compaction's, needed when it ``rebuilds`` the state.

    Raises:
        ValueError: a compaction that rebuilds the state without its manifest.
    """
    fresh = False
    match event:
        case ChangesCommitted():
            if tree:
                for change in event.changes:
                    apply_change(state.tree, change, event.version, event.at)
            if event.uncommitted is not None or state.uncommitted:
                fold_uncommitted(state.uncommitted, event)
        case WorkspaceCreated(trust=trust, limits=limits):
            if state.version:  # a new life (the purge before it was missed): none of the old
                forget(state)
                fresh = True
            state.exists, state.trust, state.limits, state.created = True, trust, limits, event.at
        case RunStarted(run_id=run_id):
            controls = state.controls
            if controls.runs is None:
                controls.runs = {}
            controls.runs[run_id] = RunState(
                event.pinned_version, event.parent_run, event.version, event.at, event.actor
            )
        case RunEnded(run_id=run_id):
            run = state.controls.run(run_id)
            if run is not None:
                run.ended_version, run.ended = event.version, event.at
        case LockAcquired(holder=holder, expires=expires):
            state.controls.lock = LockState(holder, expires)
        case LockReleased():
            state.controls.lock = None
        case TrustChanged(trust=trust, commands=commands):
            state.trust, state.controls.commands = trust, commands
        case ApprovalRequested():
            _ask(state.controls, event)
        case ApprovalDecided(approval_id=approval_id):
            approval = state.controls.approval(approval_id)
            if approval is not None:
                approval.approved = event.approved
                approval.decided_by, approval.reason = event.actor, event.reason
                approval.preview = None  # decided: the diff is in the log, not kept in memory
            _forget_decided(state.controls)
        case WorkspaceAttached(uri=uri):
            controls = state.controls
            if controls.attached is None:
                controls.attached = {}
            controls.attached[uri] = (event.target, event.kind)
        case WorkspaceDetached(uri=uri):
            (state.controls.attached or {}).pop(uri, None)
        case WorkspaceArchived(reason=reason):
            state.controls.archived = ArchiveState(event.at, event.actor, reason)
        case WorkspaceUnarchived():
            state.controls.archived = None
        case WorkspaceForked(trust=trust, limits=limits, commands=commands):
            # the fork's tree is its source's at the fork point: a caller folding the fork's
            # log whole seeds it from there (the writer's load, replay); the fold itself
            # cannot reach another workspace
            state.exists, state.trust, state.limits, state.created = True, trust, limits, event.at
            state.controls.commands = commands
            state.lineage = tuple((b.workspace, b.version) for b in event.lineage)
        case HistoryCompacted(floor=floor):
            if rebuilds(state, event):
                if manifest is None:
                    raise ValueError(f"Compaction v{event.version} rebuilds: its manifest")
                restore(state, event, manifest, event.version, digest, seq, tree=tree)
                return True
            state.floor = floor
        case WorkspacePurged():
            forget(state)
            if seq is not None:
                state.last_seq = seq
            return True
        case _:
            assert_never(event)
    if digest is not None:
        state.version, state.last_hash, state.updated = event.version, digest, event.at
        state.tree_hash = event.tree_hash
        if seq is not None:
            state.last_seq = seq
    return fresh


def rebuilds(state: WorkspaceState, event: WorkspaceEvent) -> bool:
    """Whether ``event`` is a compaction that ``state`` does not continue into, so that its
    manifest replaces the state: the log before it was purged (it is not the next version)
    or rewritten (``quill scrub``'s, ``SCRUB_OP``: what was folded before may hold a secret)."""
    match event:
        case HistoryCompacted(version=version, op=op):
            return version != state.version + 1 or op == SCRUB_OP
        case _:
            return False


def restore(
    state: WorkspaceState,
    event: HistoryCompacted,
    manifest: CompactionManifest,
    at: int | None = None,
    digest: str | None = None,
    seq: int | None = None,
    *,
    tree: bool = True,
) -> None:
    """``state`` as of version ``at`` (default: the compaction's) from ``event``'s manifest:
    the paths live then (``plant``; ``tree`` False: ``state.tree`` is left as it is), the
    control events (evolved) and uncommitted paths recorded by then, the head of the event at
    ``at`` (its hash and tree hash from the manifest's event rows; empty when it keeps none)."""
    at = event.version if at is None else min(at, event.version)
    kept = state.tree
    forget(state)
    state.exists, state.trust, state.limits = True, manifest.trust, manifest.limits
    state.created, state.floor = manifest.created, manifest.floor
    if tree:
        plant(state.tree, manifest.revisions, at)
    else:  # the caller's (kept elsewhere, or as of ``at`` already)
        state.tree = kept
    for version, _, body in manifest.controls:
        if version <= at:
            evolve(state, codec.decode_event(body.encode()), tree=False)
    state.uncommitted = {
        str(u[0]): Recorded(str(u[1]), str(u[2]), int(u[3]))
        for u in manifest.uncommitted
        if int(u[3]) <= at
    }
    state.version = at
    if at == event.version:
        state.last_hash, state.tree_hash = digest or "", event.tree_hash
        state.updated = event.at
    else:
        row = next((r for r in manifest.events if int(r[0]) == at), None)
        state.last_hash = str(row[9]) if row is not None else ""
        state.tree_hash = str(row[11]) if row is not None else ""
        state.updated = _time(row[4]) if row is not None else event.at
    if seq is not None:
        state.last_seq = seq


def _ask(controls: Controls, event: ApprovalRequested) -> None:
    if controls.approvals is None:
        controls.approvals = {}
    for a in controls.approvals.values():  # expired as of this event: decided so
        if a.past(event.at):
            a.approved, a.expired, a.reason, a.preview = False, True, "expired", None
    controls.approvals[event.approval_id] = ApprovalState(
        event.request_op,
        event.summary,
        event.requested_by,
        event.at,
        event.version,
        preview=event.preview,
        session=event.session,
        digest=event.digest,
        expires=event.expires,
    )
    _forget_decided(controls)


def _forget_decided(controls: Controls) -> None:
    """Keep the last ``DECIDED_KEPT`` decided (or expired) approvals."""
    decided = [k for k, a in (controls.approvals or {}).items() if a.approved is not None]
    for old in decided[: max(0, len(decided) - DECIDED_KEPT)]:
        del controls.approvals[old]  # type: ignore[union-attr]


def _time(value: object) -> datetime:
    return datetime.fromisoformat(str(value))
