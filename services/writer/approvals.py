"""Asking for approval, in a restricted workspace.

Whether a command must be approved first (``needs_approval``: not yet asked, waiting, denied,
expired, or approved and carried out now), and the ``approval_requested`` event that parks
it (``ask``): what the approver is shown (a diff of what it would change if decided now, or
of an executor's command, what it kept) and the request kept to be carried out once approved
(``infra/approvals.py``). Waiting is ``parking.py``; carrying out, ``parking.Carrier``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from contracts import codec
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import AnyChange, ApprovalRequested, WorkspaceEvent
from contracts.limits import MAX_PENDING_APPROVALS, RETRY_AFTER_MS
from contracts.subjects import CHANGES_SUFFIX, HEADER_TIMEOUT, HEADER_WAIT, Origin
from core.decide import decide
from core.decide_control import CONTROL_COMMANDS
from core.decision import Context, Decision, to_event
from core.evolve import WorkspaceState
from core.secrets import Secrets
from infra.approvals import Parked, digest
from infra.approvals import summary as approval_summary
from infra.busy import refused
from services.writer import context
from services.writer.pending import Pending, Site
from services.writer.preview import preview as preview_of


def needs_approval(site: Site, state: WorkspaceState, p: Pending) -> bool:
    """Whether ``p``, in a restricted workspace (``state.restricted``: the actor asks only
    then), must be approved first, and is not yet. A request from the same session as one
    still waiting (same op, same body) is that one: answered with its approval id, never
    parked again.

    Raises:
        QuillError: ``DENIED`` when it was (or it expired); ``APPROVAL_REQUIRED`` while it
            waits; ``CONFLICT`` for another body under an approved request's id; busy
            when ``MAX_PENDING_APPROVALS`` wait already.
    """
    if not state.restricted:
        return False
    if isinstance(p.request, (rq.CreateWorkspace, *CONTROL_COMMANDS)):
        return False
    if isinstance(p.request, rq.MergeWorkspace) and p.request.dry_run:
        return False  # an answer, no change: nothing to approve
    now = datetime.now(UTC)
    request_id = p.origin.request_id
    op, body = asked(p, site.deps.secrets)
    approval = state.controls.approval(request_id)
    if approval is None:
        if covered(state, p):
            return False
        pending = state.controls.pending(now)
        for other_id, other in pending:
            if other.same(op, p.origin.actor, p.origin.session, body):
                raise awaiting(p, other_id, other.version)
        if len(pending) >= MAX_PENDING_APPROVALS:
            what = f"Workspace {site.tenant}/{site.workspace}"
            raise refused("writer", "approvals", what, RETRY_AFTER_MS, limit=MAX_PENDING_APPROVALS)
        return True
    if approval.digest is not None and approval.digest != body:
        raise QuillError(
            ErrorCode.CONFLICT,
            f"Request {request_id} was parked for approval with another body: a request "
            "id names one request (send this one with a new id)",
            {"approval_id": request_id},
        )
    if approval.approved is None and not approval.past(now):
        raise awaiting(p, request_id, approval.version)
    if approval.expired or approval.past(now):
        raise QuillError(
            ErrorCode.DENIED,
            f"Approval {request_id} expired undecided (at "
            f"{approval.expires.isoformat() if approval.expires else '?'})",
            {"approval_id": request_id, "reason": "expired"},
        )
    if not approval.approved:
        reason = f": {approval.reason}" if approval.reason else ""
        raise QuillError(
            ErrorCode.DENIED,
            f"Denied by {approval.decided_by or 'an approver'}{reason}",
            {"approval_id": request_id, "reason": approval.reason},
        )
    p.carrying = True
    return False


def covered(state: WorkspaceState, p: Pending) -> bool:
    """An executor's ``apply`` of what an approved command changed (request id
    ``<command's id>:changes``, same actor) needs no approval of its own."""
    command_id, suffix, _ = p.origin.request_id.rpartition(CHANGES_SUFFIX)
    if suffix != CHANGES_SUFFIX or not isinstance(p.request, rq.ApplyChanges):
        return False
    approval = state.controls.approval(command_id)
    return (
        approval is not None
        and approval.approved is True
        and approval.op.startswith("exec.")
        and approval.requested_by == p.origin.actor
    )


async def ask(
    site: Site, state: WorkspaceState, p: Pending
) -> tuple[Decision, WorkspaceEvent | None, bytes]:
    """The ``approval_requested`` event that parks ``p`` (under its own request id: the
    command itself keeps its id for when it is approved and committed), with a diff of
    what it would change if decided now."""
    deps = site.deps
    summary, paths = describe(p)
    origin = Origin(
        f"{p.origin.request_id}:approval", p.origin.actor, p.origin.session, p.origin.run
    )
    request = p.request
    op, body = asked(p, deps.secrets)
    if isinstance(request, rq.RequestApproval):  # shown: what was kept, what will run
        summary = await kept_summary(site, p, request)
    shown = None if isinstance(request, rq.RequestApproval) else await preview(site, state, p)
    if not isinstance(request, rq.RequestApproval):  # kept to be carried out once approved
        kept = dict(p.origin.headers())
        kept.pop(HEADER_WAIT, None)
        kept.pop(HEADER_TIMEOUT, None)
        parked = Parked.of(op, kept, kept_body(p, deps.secrets))
        await deps.approvals.keep(site.tenant, site.workspace, p.origin.request_id, parked)
    at = datetime.now(UTC)
    expires = at + timedelta(seconds=state.limits.approval_ttl_s)

    def make(common: dict[str, Any]) -> ApprovalRequested:
        return ApprovalRequested(
            approval_id=p.origin.request_id,
            request_op=op,
            summary=summary,
            requested_by=p.origin.actor,
            preview=shown,
            digest=body,
            expires=expires,
            **common,
        )

    ctx = Context(version=state.version + 1, at=at, content=lambda _: None)
    decision = Decision(result=rp.ApprovalList(pending=[]), make=make, paths=paths)
    event = to_event(state, decision, ctx, "approval_requested", origin)
    return decision, event, codec.encode(event)


async def kept_summary(site: Site, p: Pending, request: rq.RequestApproval) -> str:
    """What an approver is shown of the command an executor asks for: derived from the
    request it kept under the same id and digest (``infra/approvals.py``), never from the
    summary it sent (a client that could send one could show "ls" for another command).

    Raises:
        QuillError: ``INVALID_ARGUMENT`` when no such request is kept.
    """
    rid, t, w = p.origin.request_id, site.tenant, site.workspace
    kept = None
    if request.digest is not None:
        kept = await site.deps.approvals.parked(t, w, rid, request.digest)
    if kept is None or kept.op != request.op:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"No {request.op} request is kept for approval {rid} with this digest: the "
            "executors ask for the approval of the commands they keep, no one else",
            {"approval_id": rid},
        )
    shown = approval_summary(kept)
    return site.deps.secrets.redact(shown)[0] if site.deps.secrets else shown


async def preview(site: Site, state: WorkspaceState, p: Pending) -> str:
    """``p`` decided against ``state`` and undone: the diff of its changes, or why it
    would be refused (as it stands; it is decided again once approved)."""
    try:

        async def undone(ctx: Context) -> None:
            with state.tree.savepoint():
                raise _Undo(decide(state, p.request, ctx).changes)

        await context.with_work(site, state, p, undone)
    except _Undo as undo:
        changes = undo.changes
    except QuillError as exc:
        return f"As it stands it would be refused: {exc.code}: {exc.message}\n"

    async def content(sha256: str) -> bytes | None:
        return await context.content(site, sha256)

    shown = await preview_of(
        changes, state.tree, content, site.deps.secrets, context.diff_for(site, p)
    )
    return shown or "No change to the files.\n"


class _Undo(Exception):
    """Raised inside a savepoint to undo a decision made only to be shown."""

    def __init__(self, changes: list[AnyChange]) -> None:
        self.changes = changes


def awaiting(p: Pending, approval_id: str, version: int) -> QuillError:
    """The answer to a request left waiting for its approval (``version``: of its
    ``approval_requested`` event, for a client's read-your-writes)."""
    return QuillError(
        ErrorCode.APPROVAL_REQUIRED,
        f"Waiting for approval {approval_id} (restricted workspace {p.address.tenant}/"
        f"{p.address.workspace}): once approved, Quill carries it out; its outcome is kept "
        "under the approval id (qry.approval)",
        {"approval_id": approval_id, "version": version},
    )


def asked(p: Pending, secrets: Secrets) -> tuple[str, str]:
    """What ``p`` asks to have approved: its op and the sha256 of its body as kept (an
    executor's ``request_approval``: of the command it asks for)."""
    request = p.request
    if isinstance(request, rq.RequestApproval):
        return request.op, request.digest or digest(request.summary.encode())
    return p.spec.key, digest(kept_body(p, secrets))


def kept_body(p: Pending, secrets: Secrets) -> bytes:
    """``p``'s body as ``WS_APPROVALS`` keeps it: registered secrets redacted (no secret is
    kept at rest; what the writer commits of the request is redacted the same way)."""
    return secrets.redact_bytes(bytes(p.msg.data))[0] if secrets else bytes(p.msg.data)


def describe(p: Pending) -> tuple[str, list[str]]:
    """What a command would do, for an approver: its op and paths (never contents)."""
    request = p.request
    if isinstance(request, rq.RequestApproval):
        return request.summary, []
    paths: list[str] = []
    for name in ("path", "to"):
        value = getattr(request, name, None)
        if isinstance(value, str):
            paths.append(value)
    if isinstance(request, rq.ApplyChanges):
        paths += [c.path for c in request.changes[:20]]
        more = len(request.changes) - 20
        if more > 0:
            paths.append(f"... and {more} more")
    return f"{p.address.op} {' '.join(paths)}".strip(), paths
