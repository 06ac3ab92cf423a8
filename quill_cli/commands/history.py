"""``quill diff``, ``restore``, ``history``, ``log``, ``audit``, ``watch``: a workspace's
versions, events and audit records, and following them live."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import TypeVar

import click

from contracts.errors import ErrorCode, QuillError
from contracts.events import AuditRecord, WorkspaceUpdated
from quill.client import Workspace
from quill_cli.client import CLOSE_S
from quill_cli.common import (
    DURATION_PATTERN,
    Commands,
    columns,
    emit,
    parse_duration,
    size_text,
    when,
    workspace_command,
)

T = TypeVar("T")

commands = Commands("history")

SHOWN_PATHS = 3
"""Paths a line names of a change that made more (``a, b, c and 136 more``)."""


def _paths(paths: list[str], total: int) -> str:
    """The first ``SHOWN_PATHS`` of ``paths``, then how many more of ``total`` there are."""
    shown = ", ".join(paths[:SHOWN_PATHS])
    more = total - min(len(paths), SHOWN_PATHS)
    return f"{shown} and {more} more" if more > 0 else shown


@commands.command()
@workspace_command
@click.argument("from_version", type=int)
@click.argument("to_version", type=int, required=False)
@click.option("--path", help="A file or directory (default: the whole workspace).")
@click.option("-U", "--unified", "context_lines", default=3, show_default=True)
async def diff(
    ctx: click.Context,
    ws: Workspace,
    from_version: int,
    to_version: int | None,
    path: str | None,
    context_lines: int,
) -> None:
    """Unified diff between FROM_VERSION and TO_VERSION (default: the latest)."""
    r = await ws.diff(from_version, to_version, path, context_lines=context_lines)

    def human() -> str | None:
        if r.truncated:
            click.echo("quill: the diff was cut at the read limit; use --path", err=True)
        if not r.files:  # say what was compared (stdout stays a patch: empty)
            latest = "" if to_version is not None else ", the latest"
            hint = ""
            if r.from_version == r.to_version and r.from_version > 1:
                before = r.from_version - 1
                hint = f" (what version {r.from_version} changed: quill diff {ws.tenant}/"
                hint += f"{ws.name} {before} {r.from_version})"
            where = f" in {r.path}" if r.path else ""
            click.echo(
                f"quill: no file differs{where} from version {r.from_version} to version "
                f"{r.to_version}{latest}{hint}",
                err=True,
            )
        return r.diff.rstrip("\n") or None

    emit(ctx, r, human)


@commands.command()
@workspace_command
@click.argument("version", type=int)
@click.argument("path", required=False)
async def restore(ctx: click.Context, ws: Workspace, version: int, path: str | None) -> None:
    """Bring PATH (default: the whole workspace) back to VERSION, as a new change."""
    r = await ws.restore(version, path)
    what = r.path or "the workspace"

    def human() -> str:
        if not r.committed:
            return f"unchanged: {what} is already as at version {r.version}"
        return (
            f"restored {what} from version {r.version} ({_paths(r.changed, r.changed_total)}): "
            f"now workspace version {ws.last_version}"
        )

    emit(ctx, r, human)


@commands.command()
@workspace_command
@click.argument("path", required=False)
@click.option("--limit", default=20, show_default=True)
@click.option("--before", type=int, help="Only versions before this one.")
@click.option(
    "--follow/--no-follow",
    default=True,
    show_default=True,
    help="Follow PATH across the moves that brought the file there (its earlier names).",
)
async def history(
    ctx: click.Context,
    ws: Workspace,
    path: str | None,
    limit: int,
    before: int | None,
    follow: bool,
) -> None:
    """Revisions of PATH, or the workspace's events; newest first."""
    r = await ws.history(path, limit=limit, before=before, follow=follow and path is not None)

    def human() -> str:
        rows = []
        for v in r.revisions:
            paths = _paths(v.paths or [], v.changes_total or len(v.paths or []))
            what = v.change if path else f"{v.change} {paths}"
            if v.moved_from:
                what += f" from {v.moved_from}"
            if v.path:
                what += f" (as {v.path})"
            extra = f"  {size_text(v.size)}  {v.etag}" if v.size is not None else ""
            rows.append([f"v{v.version}", when(v.at), v.op, v.actor or "-", what + extra])
        text = columns(rows) or "(no history)"
        if r.truncated and r.revisions:
            asked = " ".join([f"{ws.tenant}/{ws.name}", *filter(None, [r.next_path or path])])
            text += f"\n(older: quill history {asked} --before {r.revisions[-1].version})"
        return text

    emit(ctx, r, human)


@commands.command(name="log")
@workspace_command
@click.option("--after", default=0, show_default=True, help="Events after this version.")
@click.option("--limit", default=50, show_default=True)
async def log_(ctx: click.Context, ws: Workspace, after: int, limit: int) -> None:
    """Show the workspace's events (oldest first)."""
    r = await ws.events(after=after, limit=limit)

    def human() -> str:
        rows = []
        for e in r.events:
            changes = _paths([f"{c.kind} {c.path}" for c in e.changes], e.changes_total)
            rows.append(
                [f"v{e.version}", f"seq {e.seq}", when(e.at), e.op, e.actor or "-",
                 e.hash[:12], changes]
            )  # fmt: skip
        return columns(rows) or "(no events)"

    emit(ctx, r, human)


def _since(value: str | None) -> datetime | None:
    if value is None:
        return None
    if DURATION_PATTERN.fullmatch(value):
        return datetime.now(UTC) - parse_duration(value)
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT, f"Bad --since {value!r}: use 10m or ISO time"
        ) from None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


RETRY_FIRST_S, RETRY_MOST_S = 0.5, 15.0
"""A follower's reconnection attempts: 0.5 s apart at first, doubling up to 15 s."""


async def _follow(
    ctx: click.Context, ws: Workspace, stream: AsyncIterator[T], line: Callable[[T], str]
) -> None:
    """Print each item of ``stream`` until Ctrl-C (SIGINT: exit 130). While NATS is away, say
    so once, retry with backoff (``RETRY_FIRST_S`` doubling to ``RETRY_MOST_S``) and say once
    when it is back; the client's own log lines (one per failed attempt) are kept off the
    terminal."""
    nc = ws.client.nc
    quiet = logging.getLogger("quill.bus")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)

    where = nc.connected_url.netloc if nc.connected_url else "?"

    async def watch_connection() -> None:
        wait, lost_at, bumped_at = RETRY_FIRST_S, 0.0, 0.0
        while True:
            await asyncio.sleep(0.2)
            now = loop.time()
            if nc.is_connected:
                if lost_at:
                    click.echo("quill: connected to NATS again", err=True)
                    wait, lost_at = RETRY_FIRST_S, 0.0
                    nc.options["reconnect_time_wait"] = wait
                continue
            if not lost_at:
                lost_at = bumped_at = now
                click.echo(
                    f"quill: lost the connection to NATS ({where}); retrying until it is back "
                    "(Ctrl-C to stop)",
                    err=True,
                )
            elif now - bumped_at >= wait and wait < RETRY_MOST_S:
                wait, bumped_at = min(wait * 2, RETRY_MOST_S), now
                nc.options["reconnect_time_wait"] = wait

    async def pump() -> None:
        async for item in stream:
            emit(ctx, item, line(item))

    # Ctrl-C ends the following even when SIGINT was ignored when this started (the background
    # job of a script: asyncio.run then installs no handler) and whatever the client is doing
    # (reconnecting, waiting in a subscription): this waits for the signal, not the stream.
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    handled = threading.current_thread() is threading.main_thread()  # else: signals can't be
    if handled:
        loop.add_signal_handler(signal.SIGINT, interrupted.set)
    monitor = asyncio.create_task(watch_connection())
    pumping = asyncio.create_task(pump())
    stopping = asyncio.create_task(interrupted.wait())
    try:
        await asyncio.wait({pumping, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if handled:  # a second Ctrl-C: KeyboardInterrupt at once
            loop.remove_signal_handler(signal.SIGINT)
        for task in (monitor, pumping, stopping):
            task.cancel()
        await asyncio.wait({pumping}, timeout=CLOSE_S)  # the subscription's own clean-up
        quiet.setLevel(level)
    if interrupted.is_set():
        raise KeyboardInterrupt  # run_client: exit 130
    pumping.result()


def _audit_line(rec: AuditRecord) -> str:
    code = f" {rec.error_code}" if rec.error_code else ""
    return (
        f"{when(rec.at)} {rec.kind}.{rec.op:<10} {rec.outcome}{code} "
        f"{rec.duration_ms:.1f}ms v{rec.version or '-'} {rec.actor or '-'} "
        f"{' '.join(rec.paths)}"
    )


def _update_line(update: WorkspaceUpdated) -> str:
    more = update.paths_total - len(update.paths)
    line = f"v{update.version} {update.op} by {update.actor or '-'}: {', '.join(update.paths)}"
    return line + (f" (+{more})" if more > 0 else "")


@commands.command()
@workspace_command
@click.option("--follow", "-f", is_flag=True, help="Keep printing new records.")
@click.option("--since", help="Start at this time (ISO 8601) or this long ago (30s, 10m, 2h).")
async def audit(ctx: click.Context, ws: Workspace, follow: bool, since: str | None) -> None:
    """Print the workspace's audit records."""
    records = ws.audit(since=_since(since), follow=follow)
    if follow:
        await _follow(ctx, ws, records, _audit_line)
        return
    async for rec in records:
        emit(ctx, rec, _audit_line(rec))


@commands.command()
@workspace_command
@click.option(
    "--wait",
    is_flag=True,
    help="Wait for a workspace that does not exist yet (else: WORKSPACE_NOT_FOUND, exit 3).",
)
async def watch(ctx: click.Context, ws: Workspace, wait: bool) -> None:
    """Print workspace.updated notifications as they happen (Ctrl-C to stop)."""
    if wait:
        try:
            await ws.stat(".")
        except QuillError as exc:
            if exc.code != ErrorCode.WORKSPACE_NOT_FOUND:
                raise
            click.echo(f"quill: waiting for {ws.tenant}/{ws.name} to be created", err=True)
    await _follow(ctx, ws, ws.watch(wait=wait), _update_line)
