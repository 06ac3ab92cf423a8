"""``quill trust``, ``approvals``, ``approve``, ``deny``, ``lock``, ``unlock``, ``quill run
...`` and ``quill session ...``: who may change a workspace and when, what a run reads, and
the workspaces a session holds."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable

import click
import msgspec

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from quill.client import Workspace
from quill.session import Session
from quill_cli.client import drop_pending, load_pending
from quill_cli.common import (
    DURATION,
    Commands,
    client_command,
    columns,
    connected,
    emit,
    run_client,
    when,
    workspace_command,
)

commands = Commands("runs")


def _trust_text(ws: Workspace, r: rp.TrustInfo) -> str:
    if r.trust != "restricted":
        return f"{ws.tenant}/{ws.name}: trust {r.trust}"
    commands = "commands offered, each approved first" if r.commands else "no commands"
    return f"{ws.tenant}/{ws.name}: trust restricted ({commands})"


@commands.command()
@workspace_command
@click.argument("level", type=click.Choice(["full", "restricted"]), required=False)
@click.option(
    "--commands/--no-commands",
    default=None,
    help="restricted: offer exec and git (each approved first), or not (the default).",
)
async def trust(
    ctx: click.Context, ws: Workspace, level: str | None, commands: bool | None
) -> None:
    """Show WORKSPACE's trust level, or set it to LEVEL. On a restricted workspace every change
    waits for approval (quill approvals), and commands are refused unless offered."""
    if level is None:
        if commands is not None:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, "--commands goes with a level: restricted")
        info = await ws.info()
        offered = info.trust == "restricted" and "exec.run" in info.capabilities
        shown = rp.TrustInfo(trust=info.trust, commands=offered, changed=False)
        emit(ctx, shown, lambda: _trust_text(ws, shown))
        return
    if level == "full" and commands:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT, "--commands is for restricted workspaces (full offers all)"
        )
    r = await ws.set_trust(level, commands=bool(commands))  # type: ignore[arg-type]
    emit(ctx, r, lambda: ("set " if r.changed else "unchanged: ") + _trust_text(ws, r))


@commands.command()
@workspace_command
async def approvals(ctx: click.Context, ws: Workspace) -> None:
    """Requests waiting for approval on WORKSPACE: id, when, who asked, the op, what it would
    touch (paths, or the command line), then the diff of the change each would make.
    Decide with quill approve / quill deny."""
    r = await ws.approvals()

    def human() -> str:
        rows = [
            [a.approval_id, when(a.requested), a.requested_by or "-", a.op, a.summary]
            for a in r.pending
        ]
        diffs = [
            f"\n{a.approval_id} would change (as of version {a.version}):\n{a.preview.rstrip()}"
            for a in r.pending
            if a.preview
        ]
        return "\n".join([columns(rows), *diffs]) if rows else "(no pending approvals)"

    emit(ctx, r, human)


@commands.command()
@workspace_command
@click.argument("approval_id")
@click.option("--reason", help="Why, recorded with the decision.")
async def approve(ctx: click.Context, ws: Workspace, approval_id: str, reason: str | None) -> None:
    """Approve the waiting request APPROVAL_ID: it goes ahead, and its caller gets its result."""
    r = await ws.approve(approval_id, reason)
    emit(ctx, r, f"approved {r.approval_id}")


@commands.command()
@click.argument("first")
@click.argument("second", required=False)
@click.pass_context
def resume(ctx: click.Context, first: str, second: str | None) -> None:
    """The outcome of a change or command that waited for approval: quill resume [WORKSPACE]
    APPROVAL_ID. Once approved, Quill carries it out itself (you need not be there); this
    prints what it gave (a command's output, and its exit code as this command's) or why it
    was not done (denied, expired: exit 8). Still undecided: exit 7 (--wait 10m waits for
    the decision). WORKSPACE may be left out for what you ran here."""
    name, approval_id = (first, second) if second is not None else (None, first)

    async def go() -> None:
        where = name
        if where is None:
            where = str(load_pending(approval_id)["workspace"])
        async with connected(ctx) as quill:
            ws = quill.workspace(where)
            status = await ws.wait_approval(approval_id, ctx.find_root().obj["wait_ms"] / 1000)
        finished(ctx, ws, status)
        drop_pending(approval_id)

    run_client(go())


def finished(ctx: click.Context, ws: Workspace, status: rp.ApprovalStatus) -> None:
    """Print what approval ``status`` came to; exit as its request would have.

    Raises:
        QuillError: ``APPROVAL_REQUIRED`` while undecided (or being carried out), ``DENIED``,
            or the error carrying it out gave.
    """
    name, approval_id = f"{ws.tenant}/{ws.name}", status.approval_id
    if status.state == "pending":
        raise QuillError(
            ErrorCode.APPROVAL_REQUIRED,
            f"Approval {approval_id} on {name} is still pending (quill approve {name} "
            f"{approval_id}); ask again later, or with --wait 10m to wait for the decision",
            {"approval_id": approval_id},
        )
    if status.state in ("denied", "expired"):
        why = (
            "it expired undecided"
            if status.state == "expired"
            else f"denied by {status.decided_by or 'an approver'}"
            + (f": {status.reason}" if status.reason else "")
        )
        raise QuillError(ErrorCode.DENIED, f"Approval {approval_id}: {why}", {"reason": why})
    outcome = status.outcome
    if outcome is None:
        raise QuillError(
            ErrorCode.APPROVAL_REQUIRED,
            f"Approval {approval_id} was approved and is being carried out: ask again",
            {"approval_id": approval_id},
        )
    if outcome.error is not None:
        raise QuillError(outcome.error.code, outcome.error.message, outcome.error.details)
    result = outcome.result or {}
    if status.op == "exec.run":
        command = msgspec.convert(result, rp.CommandResult)
        if ctx.find_root().obj["json"]:
            emit(ctx, command, lambda: None)
        else:
            sys.stdout.write(command.stdout + command.stdout_tail)
            sys.stderr.write(command.stderr + command.stderr_tail)
            sys.stdout.flush()
        sys.exit(min(command.exit_code, 255))
    emit(
        ctx,
        result,
        f"done: {status.op} on {name} (approval {approval_id}), workspace version "
        f"{outcome.version}",
    )


@commands.command()
@workspace_command
@click.argument("approval_id")
@click.option("--reason", help="Why, recorded with the decision (its caller sees it).")
async def deny(ctx: click.Context, ws: Workspace, approval_id: str, reason: str | None) -> None:
    """Deny the waiting request APPROVAL_ID: its caller gets DENIED."""
    r = await ws.deny(approval_id, reason)
    emit(ctx, r, f"denied {r.approval_id}")


def _need_session(ctx: click.Context, what: str) -> None:
    if not ctx.obj["session"]:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"A lock belongs to a session: quill --session ID {what} (or set $QUILL_SESSION)",
        )


@commands.command()
@workspace_command
@click.option(
    "--ttl",
    "ttl_ms",
    type=DURATION,
    default="60s",
    show_default=True,
    help="It expires on its own after this long; lock again to renew.",
)
@click.option(
    "--wait", "wait_ms", type=DURATION, help="Wait this long for another session's lock to go."
)
async def lock(ctx: click.Context, ws: Workspace, ttl_ms: int, wait_ms: int | None) -> None:
    """Lock WORKSPACE for your session (--session): until you unlock it or it expires, other
    sessions' changes get LOCKED (or wait, with --wait). Reads are never locked."""
    _need_session(ctx, "lock")
    r = await ws.lock(ttl_ms=ttl_ms, wait_ms=wait_ms)
    until = when(r.expires)
    emit(ctx, r, f"locked {ws.tenant}/{ws.name} for session {r.holder} until {until}")


@commands.command()
@workspace_command
async def unlock(ctx: click.Context, ws: Workspace) -> None:
    """Release your session's lock on WORKSPACE (LOCKED if another session holds it)."""
    _need_session(ctx, "unlock")
    r = await ws.unlock()
    emit(ctx, r, f"unlocked {ws.tenant}/{ws.name}")


@commands.group(name="run")
def run_group() -> None:
    """Agent runs: a run reads the workspace as of the version it started at (quill --run ID
    cat ...), whatever is written meanwhile; the log keeps which version each run saw."""


def _run_text(r: rp.RunInfo) -> str:
    lines = [
        f"run: {r.run}",
        f"reads version: {r.version}",
        f"started: {when(r.started)} by {r.actor or '-'} (version {r.started_version})",
        f"ended: {'no' if r.ended_version is None else f'version {r.ended_version}'}",
    ]
    if r.parent:
        lines.insert(1, f"parent: {r.parent}")
    return "\n".join(lines)


@run_group.command(name="start")
@workspace_command
@click.option("--id", "run_id", help="The run's id (default: one is made).")
@click.option("--version", "at", type=int, help="Read this version (default: the latest).")
@click.option("--parent", help="A sub-run of this run (it reads what its parent reads).")
async def run_start(
    ctx: click.Context, ws: Workspace, run_id: str | None, at: int | None, parent: str | None
) -> None:
    """Start a run on WORKSPACE; print its id and the version it reads."""
    r = await ws.start_run(run_id, parent=parent, version=at)
    emit(ctx, r, f"started run {r.run}, reading version {r.version}")


@run_group.command(name="end")
@workspace_command
@click.argument("run_id", metavar="RUN")
async def run_end(ctx: click.Context, ws: Workspace, run_id: str) -> None:
    """End RUN (its later changes are refused; ending it again changes nothing)."""
    r = await ws.end_run(run_id)
    emit(ctx, r, f"ended run {r.run} (it read version {r.version})")


@run_group.command(name="show")
@workspace_command
@click.argument("run_id", metavar="RUN")
async def run_show(ctx: click.Context, ws: Workspace, run_id: str) -> None:
    """Show RUN: the version it reads, its parent, when and by whom it started, and ended."""
    r = await ws.run_info(run_id)
    emit(ctx, r, lambda: _run_text(r))


@commands.group(name="session")
def session_group() -> None:
    """Sessions (a conversation): a primary workspace, and workspaces attached to it by URI
    (server:/TENANT/WS, CLIENT:PATH served by quill attach, git:URL)."""


def session_command(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Decorate ``async fn(ctx, session, ...)``: the session ``TENANT/SESSION``."""
    return client_command(
        "session",
        lambda quill, name: Session(quill, quill.workspace(name)),
        fn,
        metavar="TENANT/SESSION",
    )


def _attached_text(r: rp.Attached) -> str:
    return columns([["primary", r.primary], *([a.kind, a.target, a.uri] for a in r.attached)])


@session_group.command(name="open")
@click.argument("tenant")
@click.option("--id", "session_id", help="Open this session (created if new; default: a new id).")
@click.pass_context
def session_open(ctx: click.Context, tenant: str, session_id: str | None) -> None:
    """Open a session of TENANT (its primary workspace is created); print its id."""

    async def go() -> None:
        async with connected(ctx) as quill:
            session = await Session.open(quill, tenant, session_id)
        primary = f"{session.primary.tenant}/{session.primary.name}"
        opened = {"session": session.id, "primary": primary}
        emit(ctx, opened, f"session {session.id}: primary workspace {primary}")

    run_client(go())


@session_group.command(name="attach")
@session_command
@click.argument("uri")
async def session_attach(ctx: click.Context, session: Session, uri: str) -> None:
    """Attach the workspace at URI to the session (a git: URL is cloned first)."""
    emit(ctx, r := await session.attach(uri), lambda: _attached_text(r))


@session_group.command(name="detach")
@session_command
@click.argument("uri")
async def session_detach(ctx: click.Context, session: Session, uri: str) -> None:
    """Detach the workspace at URI from the session."""
    emit(ctx, r := await session.detach(uri), lambda: _attached_text(r))


@session_group.command(name="list")
@session_command
async def session_list(ctx: click.Context, session: Session) -> None:
    """The session's primary workspace, then its attached ones in order (kind, target, URI):
    a tool call naming no workspace goes to the first of them that offers it."""
    emit(ctx, r := await session.workspaces(), lambda: _attached_text(r))
