"""Decisions on control commands (runs, the lock, trust, approvals) and the gate every
mutation passes: a lock held by another session, a run that has ended.

Like ``decide``, no I/O: each returns a ``Decision`` whose ``make`` builds the event.
Waiting (for a lock to be freed, for an approval) is the workspace actor's business.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from contracts import replies as rp
from contracts import requests as rq
from contracts import uris
from contracts.errors import ErrorCode, QuillError, no_version
from contracts.events import (
    ApprovalDecided,
    LockAcquired,
    LockReleased,
    RunEnded,
    RunStarted,
    TrustChanged,
    WorkspaceArchived,
    WorkspaceAttached,
    WorkspaceDetached,
    WorkspacePurged,
    WorkspaceUnarchived,
)
from core.controls import attached_list, run_info
from core.decision import Context, Decision
from core.evolve import Controls, RunState, WorkspaceState

CONTROL_COMMANDS = (
    rq.RunStart,
    rq.RunEnd,
    rq.Lock,
    rq.Unlock,
    rq.SetTrust,
    rq.Decide,
    rq.Attach,
    rq.Detach,
    rq.ArchiveWorkspace,
    rq.UnarchiveWorkspace,
    rq.PurgeWorkspace,
)
"""Commands that change no file: never held up by a lock or an approval."""
ARCHIVE_PROOF = (rq.UnarchiveWorkspace, rq.PurgeWorkspace, rq.ArchiveWorkspace)
"""The commands an archived workspace still takes."""


def gate(state: WorkspaceState, cmd: rq.Request, ctx: Context) -> None:
    """Refuse a mutation another session's lock forbids, or one of a run that has ended.

    Raises:
        QuillError: ``LOCKED`` (details: holder, expires), ``INVALID_ARGUMENT``.
    """
    run_id = ctx.origin.run if ctx.origin is not None else None
    run = state.controls.run(run_id) if run_id else None
    if run is not None and run.ended_version is not None:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Run {run_id} has ended (version {run.ended_version})",
            {"run": run_id, "ended_version": run.ended_version},
        )
    archived = state.controls.archived
    if archived is not None and not isinstance(cmd, ARCHIVE_PROOF):
        raise archived.refusal(f"{state.tenant}/{state.workspace}")
    if isinstance(cmd, CONTROL_COMMANDS):
        return
    lock = state.controls.lock
    session = ctx.origin.session if ctx.origin is not None else None
    if lock is not None and lock.held_by_other(session, ctx.at):
        raise lock.refusal()


def _run_start(state: WorkspaceState, cmd: rq.RunStart, ctx: Context) -> Decision:
    run_id = cmd.run or f"run-{state.workspace}-{ctx.version}"
    if state.controls.run(run_id) is not None:
        raise QuillError(ErrorCode.ALREADY_EXISTS, f"Run {run_id} exists", {"run": run_id})
    pinned = state.version
    if cmd.parent is not None:
        parent = state.controls.run(cmd.parent)
        if parent is None or parent.ended_version is not None:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"Parent run {cmd.parent} is not running",
                {"parent": cmd.parent},
            )
        pinned = parent.pinned
    if cmd.version is not None:
        if cmd.version > state.version:
            raise no_version(cmd.version, state.version)
        pinned = cmd.version
    actor = ctx.origin.actor if ctx.origin is not None else None
    run = RunState(pinned, cmd.parent, ctx.version, ctx.at, actor)

    def make(common: dict[str, Any]) -> RunStarted:
        return RunStarted(run_id=run_id, parent_run=cmd.parent, pinned_version=pinned, **common)

    return Decision(result=run_info(run_id, run), make=make)


def _run_end(state: WorkspaceState, cmd: rq.RunEnd, ctx: Context) -> Decision:
    run = state.controls.run(cmd.run)
    if run is None:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Unknown run {cmd.run}", {"run": cmd.run})
    if run.ended_version is not None:
        return Decision(result=run_info(cmd.run, run))  # ended already: nothing to record
    ended = RunState(run.pinned, run.parent, run.started_version, run.started, run.actor)
    ended.ended_version = ctx.version

    def make(common: dict[str, Any]) -> RunEnded:
        return RunEnded(run_id=cmd.run, **common)

    return Decision(result=run_info(cmd.run, ended), make=make)


def _session(ctx: Context) -> str:
    session = ctx.origin.session if ctx.origin is not None else None
    if not session:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT, "A lock is held by a session: send the Ws-Session header"
        )
    return session


def _lock(state: WorkspaceState, cmd: rq.Lock, ctx: Context) -> Decision:
    session = _session(ctx)
    lock = state.controls.lock
    if lock is not None and lock.held_by_other(session, ctx.at):
        raise lock.refusal()
    expires = ctx.at + timedelta(milliseconds=cmd.ttl_ms)

    def make(common: dict[str, Any]) -> LockAcquired:
        return LockAcquired(holder=session, expires=expires, **common)

    return Decision(result=rp.LockInfo(holder=session, expires=expires), make=make)


def _unlock(state: WorkspaceState, cmd: rq.Unlock, ctx: Context) -> Decision:
    session = _session(ctx)
    lock = state.controls.lock
    if lock is None or lock.expires <= ctx.at:
        return Decision(result=rp.LockInfo(holder=None, expires=None))
    if lock.holder != session:
        raise lock.refusal()

    def make(common: dict[str, Any]) -> LockReleased:
        return LockReleased(holder=session, reason="unlock", **common)

    return Decision(result=rp.LockInfo(holder=None, expires=None), make=make)


def _set_trust(state: WorkspaceState, cmd: rq.SetTrust, ctx: Context) -> Decision:
    commands = cmd.commands and cmd.trust == "restricted"
    if (cmd.trust, commands) == (state.trust, state.controls.commands):
        return Decision(result=rp.TrustInfo(trust=state.trust, commands=commands, changed=False))

    def make(common: dict[str, Any]) -> TrustChanged:
        return TrustChanged(trust=cmd.trust, commands=commands, **common)

    result = rp.TrustInfo(trust=cmd.trust, commands=commands, changed=True)
    return Decision(result=result, make=make)


def _request_approval(state: WorkspaceState, cmd: rq.RequestApproval, ctx: Context) -> Decision:
    """Reached only once approved (or on a full workspace): nothing to record."""
    request_id = ctx.origin.request_id if ctx.origin is not None else ""
    return Decision(result=rp.ApprovalResult(approval_id=request_id, approved=True))


def _decide(state: WorkspaceState, cmd: rq.Decide, ctx: Context) -> Decision:
    approval = state.controls.approval(cmd.approval_id)
    if approval is None:
        raise QuillError(
            ErrorCode.FILE_NOT_FOUND,
            f"No approval {cmd.approval_id} is waiting",
            {"approval_id": cmd.approval_id},
        )
    if approval.expired or approval.past(ctx.at):  # its deadline, in the log: no decision
        raise QuillError(
            ErrorCode.CONFLICT,
            f"Approval {cmd.approval_id} expired undecided: its request was refused",
            {"approval_id": cmd.approval_id, "expired": True},
        )
    if approval.approved is not None:
        raise QuillError(
            ErrorCode.CONFLICT,
            f"Approval {cmd.approval_id} was already "
            f"{'approved' if approval.approved else 'denied'}",
            {"approval_id": cmd.approval_id, "approved": approval.approved},
        )

    def make(common: dict[str, Any]) -> ApprovalDecided:
        return ApprovalDecided(
            approval_id=cmd.approval_id, approved=cmd.approve, reason=cmd.reason, **common
        )

    result = rp.ApprovalResult(approval_id=cmd.approval_id, approved=cmd.approve)
    return Decision(result=result, make=make)


def _attach(state: WorkspaceState, cmd: rq.Attach, ctx: Context) -> Decision:
    uri = uris.parse(cmd.uri)
    if uri.kind == "server":
        target = uri.path
    elif uri.kind == "local":
        found = ctx.locate(state.tenant, uri.host, uri.path)
        if found is None:
            raise QuillError(
                ErrorCode.FILE_NOT_FOUND,
                f"No bridge serves {cmd.uri}: run `quill attach` on {uri.host}",
                {"uri": cmd.uri},
            )
        target = f"{state.tenant}/{found}"
    else:
        if cmd.target is None:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                "A git: workspace is attached once cloned: give its target (the SDK does)",
                {"uri": cmd.uri},
            )
        target = cmd.target
    tenant, name = uris.check_target(target)
    if tenant != state.tenant:
        raise QuillError(
            ErrorCode.ACCESS_DENIED,
            f"{cmd.uri} is another tenant's: a session attaches its own tenant's workspaces",
            {"uri": cmd.uri},
        )
    if name == state.workspace:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "A session's primary cannot be attached")
    key = str(uri)
    if (state.controls.attached or {}).get(key) == (target, uri.kind):
        return Decision(result=attached_list(f"{state.tenant}/{state.workspace}", state.controls))
    after = dict(state.controls.attached or {})
    after[key] = (target, uri.kind)

    def make(common: dict[str, Any]) -> WorkspaceAttached:
        return WorkspaceAttached(uri=key, target=target, kind=uri.kind, **common)

    primary = f"{state.tenant}/{state.workspace}"
    return Decision(result=attached_list(primary, Controls(attached=after)), make=make)


def _detach(state: WorkspaceState, cmd: rq.Detach, ctx: Context) -> Decision:
    key = str(uris.parse(cmd.uri))
    if key not in (state.controls.attached or {}):
        raise QuillError(ErrorCode.FILE_NOT_FOUND, f"{cmd.uri} is not attached", {"uri": key})
    after = {u: a for u, a in (state.controls.attached or {}).items() if u != key}

    def make(common: dict[str, Any]) -> WorkspaceDetached:
        return WorkspaceDetached(uri=key, **common)

    primary = f"{state.tenant}/{state.workspace}"
    return Decision(result=attached_list(primary, Controls(attached=after)), make=make)


def _archive(state: WorkspaceState, cmd: rq.ArchiveWorkspace, ctx: Context) -> Decision:
    if state.controls.archived is not None:
        return Decision(result=rp.ArchiveInfo(archived=True, changed=False))

    def make(common: dict[str, Any]) -> WorkspaceArchived:
        return WorkspaceArchived(reason=cmd.reason, **common)

    return Decision(result=rp.ArchiveInfo(archived=True, changed=True), make=make)


def _unarchive(state: WorkspaceState, cmd: rq.UnarchiveWorkspace, ctx: Context) -> Decision:
    if state.controls.archived is None:
        return Decision(result=rp.ArchiveInfo(archived=False, changed=False))

    def make(common: dict[str, Any]) -> WorkspaceUnarchived:
        return WorkspaceUnarchived(**common)

    return Decision(result=rp.ArchiveInfo(archived=False, changed=True), make=make)


def _purge(state: WorkspaceState, cmd: rq.PurgeWorkspace, ctx: Context) -> Decision:
    name = f"{state.tenant}/{state.workspace}"
    if cmd.confirm != name:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"A purge names what it destroys: confirm must be {name!r}",
            {"confirm": cmd.confirm},
        )
    if ctx.forks:  # their history up to their fork point is this workspace's
        raise QuillError(
            ErrorCode.CONFLICT,
            f"{name} has forks, whose history is partly its own: purge them first "
            f"({', '.join(ctx.forks[:10])}{', ...' if len(ctx.forks) > 10 else ''})",
            {"forks": ctx.forks[:100]},
        )
    version = state.version

    def make(common: dict[str, Any]) -> WorkspacePurged:
        return WorkspacePurged(purged_version=version, **common)

    return Decision(result=rp.Purged(workspace=name, version=version), make=make)


DECIDERS: dict[str, Any] = {
    "archive": _archive,
    "unarchive": _unarchive,
    "purge": _purge,
    "run_start": _run_start,
    "run_end": _run_end,
    "lock": _lock,
    "unlock": _unlock,
    "set_trust": _set_trust,
    "decide": _decide,
    "request_approval": _request_approval,
    "attach": _attach,
    "detach": _detach,
}
"""The control commands' decisions, by op name (``core.decide.DECIDERS`` holds them all)."""
