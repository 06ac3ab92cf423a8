"""What a workspace's control state answers: a run, the attached workspaces, the approvals.

The state itself (runs, the lock, trust, approvals, attachments, archive) and what each
control event does to it are ``core.evolve``'s; these build the replies of the queries and
decisions that read it (``core/decide_control.py``, the reader's ``qry.run`` and friends).
"""

from __future__ import annotations

from datetime import datetime

from contracts import replies as rp
from core.evolve import ApprovalState, Controls, RunState


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
