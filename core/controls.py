"""What the control events do to a workspace's state: runs, the lock, trust, approvals.

One definition, folded by the writer (deciding), log catch-up and the executor's checkouts
alike. None of these events changes a file; each still takes a version in the log, so that
the log alone tells who ran, held, trusted and approved what, and when.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import get_args

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from contracts.events import (
    ApprovalDecided,
    ApprovalRequested,
    ControlEvent,
    LockAcquired,
    LockReleased,
    RunEnded,
    RunStarted,
    WorkspaceArchived,
    WorkspaceAttached,
    WorkspaceDetached,
    WorkspaceUnarchived,
)

CONTROL_EVENTS = get_args(ControlEvent)
"""The control event types, for ``isinstance``."""
DECIDED_KEPT = 1000
"""Decided approvals remembered per workspace (a retried request finds its decision)."""


@dataclass(slots=True)
class RunState:
    pinned: int
    """The version the run reads."""
    parent: str | None
    started_version: int
    started: datetime
    actor: str | None
    ended_version: int | None = None


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


def fold_control(controls: Controls, event: ControlEvent) -> None:
    """Fold one control event into ``controls`` (``TrustChanged`` is the caller's)."""
    if isinstance(event, RunStarted):
        if controls.runs is None:
            controls.runs = {}
        controls.runs[event.run_id] = RunState(
            event.pinned_version, event.parent_run, event.version, event.at, event.actor
        )
    elif isinstance(event, RunEnded):
        run = controls.run(event.run_id)
        if run is not None:
            run.ended_version = event.version
    elif isinstance(event, LockAcquired):
        controls.lock = LockState(event.holder, event.expires)
    elif isinstance(event, LockReleased):
        controls.lock = None
    elif isinstance(event, ApprovalRequested):
        if controls.approvals is None:
            controls.approvals = {}
        for a in controls.approvals.values():  # expired as of this event: decided so
            if a.past(event.at):
                _expire(a)
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
    elif isinstance(event, WorkspaceAttached):
        if controls.attached is None:
            controls.attached = {}
        controls.attached[event.uri] = (event.target, event.kind)
    elif isinstance(event, WorkspaceDetached):
        (controls.attached or {}).pop(event.uri, None)
    elif isinstance(event, WorkspaceArchived):
        controls.archived = ArchiveState(event.at, event.actor, event.reason)
    elif isinstance(event, WorkspaceUnarchived):
        controls.archived = None
    elif isinstance(event, ApprovalDecided):
        approval = controls.approval(event.approval_id)
        if approval is not None:
            approval.approved = event.approved
            approval.decided_by, approval.reason = event.actor, event.reason
            approval.preview = None  # decided: the diff is in the log, not kept in memory
        _forget_decided(controls)


def _expire(approval: ApprovalState) -> None:
    approval.approved, approval.expired, approval.reason = False, True, "expired"
    approval.preview = None


def _forget_decided(controls: Controls) -> None:
    """Keep the last ``DECIDED_KEPT`` decided (or expired) approvals."""
    decided = [k for k, a in (controls.approvals or {}).items() if a.approved is not None]
    for old in decided[: max(0, len(decided) - DECIDED_KEPT)]:
        del controls.approvals[old]  # type: ignore[union-attr]


def run_info(run_id: str, run: RunState) -> rp.RunInfo:
    return rp.RunInfo(
        run=run_id,
        parent=run.parent,
        version=run.pinned,
        started=run.started,
        started_version=run.started_version,
        ended_version=run.ended_version,
        actor=run.actor,
    )


def attached_list(primary: str, controls: Controls) -> rp.Attached:
    items = [
        rp.AttachedWorkspace(uri=uri, target=target, kind=kind)
        for uri, (target, kind) in (controls.attached or {}).items()
    ]
    return rp.Attached(primary=primary, attached=items)


def approval_list(controls: Controls, now: datetime | None = None) -> rp.ApprovalList:
    """The approvals still waiting for a decision (given ``now``: and not expired then)."""
    pending = [
        rp.Approval(
            approval_id=approval_id,
            op=a.op,
            summary=a.summary,
            requested_by=a.requested_by,
            requested=a.requested,
            version=a.version,
            preview=a.preview,
        )
        for approval_id, a in controls.pending(now)
    ]
    return rp.ApprovalList(pending=pending)


def approval_status(
    approval_id: str, a: ApprovalState, now: datetime, outcome: rp.ApprovalOutcome | None
) -> rp.ApprovalStatus:
    """Approval ``approval_id`` as ``qry.approval`` tells it at ``now``."""
    state = a.state(now)
    return rp.ApprovalStatus(
        approval_id=approval_id,
        state=state,  # type: ignore[arg-type]
        op=a.op,
        summary=a.summary,
        requested_by=a.requested_by,
        requested=a.requested,
        version=a.version,
        expires=a.expires,
        decided_by=a.decided_by,
        reason="expired" if state == "expired" else a.reason,
        done=state in ("denied", "expired") or outcome is not None,
        outcome=outcome if state == "approved" else None,
    )
