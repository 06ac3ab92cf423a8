"""``quill workspaces`` (a tenant's workspaces), ``quill archive``/``unarchive``,
``quill purge`` (with ``--export`` first, by the export of ``quill export``), ``quill fork``,
``quill forks`` and ``quill merge`` (its conflicts in words: ``core.merge_words``)."""

from __future__ import annotations

import gzip
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from contracts.merging import Strategy
from core.merge_words import TERMINAL, merged_text, refused_text
from quill.client import Workspace
from quill_cli.common import Commands, connected, emit, fail, run_client, workspace_command
from quill_cli.progress import progress
from quill_cli.tools import replay as rpl

commands = Commands()

COLUMNS = ("NAME", "VERSION", "FILES", "SIZE", "UPDATED", "BY", "TRUST", "LOCKED BY", "STATE")


def when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def table(listing: rp.WorkspaceList) -> str:
    """Aligned columns, a line a workspace (numbers right-aligned)."""
    if not listing.workspaces:
        return f"no workspaces in tenant {listing.tenant}"
    rows = [COLUMNS] + [
        (
            w.workspace,
            str(w.version),
            f"{w.files:,}",
            f"{w.total_bytes:,}",
            when(w.updated),
            w.updated_by or "-",
            w.trust,
            w.lock_holder or "-",
            "archived" if w.archived else "active",
        )
        for w in listing.workspaces
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    numeric = {1, 2, 3}
    lines = [
        "  ".join(
            cell.rjust(widths[i]) if i in numeric and n else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()
        for n, row in enumerate(rows)
    ]
    if listing.next:
        lines.append(f"more: quill workspaces {listing.tenant} --after {listing.next}")
    return "\n".join(lines)


@commands.command()
@click.argument("tenant", default="default")
@click.option("--after", metavar="NAME", help="List the workspaces after this name.")
@click.option(
    "--limit", type=click.IntRange(1, 1000), default=100, show_default=True, help="Per page."
)
@click.option("--prefix", help="Only names starting with this.")
@click.option("--all", "every", is_flag=True, help="Every page, not just the first.")
@click.pass_context
def workspaces(
    ctx: click.Context,
    tenant: str,
    after: str | None,
    limit: int,
    prefix: str | None,
    every: bool,
) -> None:
    """List TENANT's workspaces (default: default) by name: version, files, size, last change
    and by whom, trust, lock holder, archived or not."""

    async def go() -> None:
        async with connected(ctx) as quill:
            page = await quill.workspaces(tenant, after=after, limit=limit, prefix=prefix)
            found = list(page.workspaces)
            while every and page.next is not None:
                page = await quill.workspaces(tenant, after=page.next, limit=limit, prefix=prefix)
                found += page.workspaces
            listing = rp.WorkspaceList(tenant=page.tenant, workspaces=found, next=page.next)
            emit(ctx, listing, lambda: table(listing))

    run_client(go())


@commands.command()
@click.argument("source")
@click.argument("new")
@click.option("--version", type=click.IntRange(1), help="The source's version (default: latest).")
@click.pass_context
def fork(ctx: click.Context, source: str, new: str, version: int | None) -> None:
    """Fork SOURCE (tenant/workspace) as NEW (a name of the same tenant) at --version: nothing
    is copied; NEW's history up to there is SOURCE's, and it goes on from the next version."""

    async def go() -> None:
        async with connected(ctx) as quill:
            done = await quill.fork(source, new, version=version)
            emit(ctx, done, f"forked {done.source} at version {done.version} as {done.workspace}")

    run_client(go())


@commands.command()
@workspace_command
@click.option(
    "--limit", type=click.IntRange(1, 1000), default=100, show_default=True, help="At most."
)
async def forks(ctx: click.Context, ws: Workspace, limit: int) -> None:
    """List WORKSPACE's forks: the version each was forked at, and how many versions the
    fork (ahead) and WORKSPACE (behind) have made since."""
    listing = await ws.forks(limit=limit)

    def text() -> str:
        lines = [f"{'FORK':<32} {'AT':>8} {'AHEAD':>8} {'BEHIND':>8}"]
        lines += [
            f"{f.workspace:<32} {f.version:>8} {f.ahead:>8} {f.behind:>8}" for f in listing.forks
        ]
        return "\n".join(lines) if listing.forks else f"{listing.workspace} has no forks"

    emit(ctx, listing, text)


@commands.command()
@click.argument("fork")
@click.argument("target")
@click.option("--dry-run", is_flag=True, help="Show what it would change and the conflicts.")
@click.option(
    "--strategy",
    type=click.Choice(["fail", "ours", "theirs", "markers"]),
    default="fail",
    show_default=True,
    help="On conflict: commit nothing, decide for TARGET (ours) or FORK (theirs), or write "
    "conflict markers into the texts.",
)
@click.pass_context
def merge(ctx: click.Context, fork: str, target: str, dry_run: bool, strategy: Strategy) -> None:
    """Merge FORK (a workspace of TARGET's tenant: name or tenant/name) into TARGET
    (tenant/workspace): three-way per path against their merge base, one change. Prints
    what it changed and each conflict (both sides, the three-way hunks); exits non-zero on
    conflicts it leaves (nothing committed) or a refusal."""

    async def go() -> None:
        async with connected(ctx) as quill:
            ws = quill.workspace(target)
            try:
                done = await ws.merge(fork, strategy=strategy, dry_run=dry_run)
            except QuillError as exc:
                if exc.code == ErrorCode.MERGE_CONFLICT and not ctx.obj["json"]:
                    ours, theirs = f"{ws.tenant}/{ws.name}", f"{ws.tenant}/{fork.split('/')[-1]}"
                    said = refused_text("", exc.details, ours, theirs, TERMINAL, "--strategy ")
                    click.echo(said, err=True)
                raise
            emit(ctx, done, lambda: merged_text(done, ws.last_version, TERMINAL, "--strategy "))
            if done.refused:
                sys.exit(1)

    run_client(go())


@commands.command()
@workspace_command
@click.option("--reason", help="Why (recorded, shown by quill workspaces).")
async def archive(ctx: click.Context, ws: Workspace, reason: str | None) -> None:
    """Archive WORKSPACE: every later change and command is refused (WORKSPACE_ARCHIVED)
    until quill unarchive; reads, history and export still work."""
    done = await ws.archive(reason)
    name = f"{ws.tenant}/{ws.name}"
    emit(ctx, done, f"archived {name}" if done.changed else f"{name} was archived already")


@commands.command()
@workspace_command
async def unarchive(ctx: click.Context, ws: Workspace) -> None:
    """Take WORKSPACE out of the archive: it takes changes and commands again."""
    done = await ws.unarchive()
    name = f"{ws.tenant}/{ws.name}"
    emit(ctx, done, f"unarchived {name}" if done.changed else f"{name} was not archived")


@commands.command()
@workspace_command
@click.option(
    "--export",
    "export_to",
    metavar="FILE",
    help="First export WORKSPACE to FILE (as quill export); the purge then happens only if "
    "nothing changed it since.",
)
@click.option("--yes", is_flag=True, help="Yes, delete it for good (required).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar for --export.")
async def purge(
    ctx: click.Context, ws: Workspace, export_to: str | None, yes: bool, quiet: bool
) -> None:
    """Delete WORKSPACE for good: its history, kept command output, every reader replica's
    copy and every executor's checkout. Audited. The name may be created again (version 1).
    The audit trail stays."""
    name = f"{ws.tenant}/{ws.name}"
    if not yes:
        fail(
            QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"quill purge deletes {name} for good: add --yes (and --export FILE to keep "
                "a copy)",
            )
        )
    expected = None
    if export_to is not None:
        moved = await _export(ws, Path(export_to), quiet)
        expected = moved.version
        if not ctx.obj["json"]:
            click.echo(f"exported {name} version {moved.version} to {export_to}", err=True)
    try:
        done = await ws.purge(expected_version=expected)
    except QuillError as exc:
        if exc.code == ErrorCode.CONFLICT and export_to is not None:
            raise QuillError(
                ErrorCode.CONFLICT,
                f"{name} changed after the export (now version "
                f"{exc.details.get('current_version')}): nothing purged; export again",
                exc.details,
            ) from None
        raise
    emit(ctx, done, f"purged {name} (it was at version {done.version})")


async def _export(ws: Workspace, path: Path, quiet: bool) -> rpl.Moved:
    """``quill export WORKSPACE FILE``'s export (gzip when FILE ends in .gz), whole or not at
    all: written to a partial file renamed at the end."""
    js, subjects = ws.client.nc.jetstream(), ws.client.subjects
    tmp = path.with_name(f".{path.name}.partial")
    try:
        with (
            progress(quiet) as bar,
            gzip.open(tmp, "wb") if path.suffix == ".gz" else open(tmp, "wb") as out,
        ):
            moved = await rpl.export(js, subjects, rpl.Fold(ws.tenant, ws.name), out, bar)
        tmp.rename(path)
    finally:
        tmp.unlink(missing_ok=True)
    if moved.events == 0:
        raise QuillError(ErrorCode.WORKSPACE_NOT_FOUND, f"Workspace not found: {ws.tenant}/"
                         f"{ws.name}")  # fmt: skip
    return moved
