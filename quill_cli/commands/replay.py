"""``quill replay``, ``quill verify``, ``quill export``/``import``, ``quill runs``: tooling
that works from the log alone (``quill_cli/tools/replay.py``; docs/replay.md)."""

from __future__ import annotations

import gzip
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import msgspec

from contracts.errors import ErrorCode, QuillError
from infra.blobs import Blobs
from quill.client import Workspace
from quill_cli.common import (
    DURATION,
    Commands,
    connected,
    emit,
    plural,
    run_client,
    short,
    size_text,
    when,
    workspace_command,
)
from quill_cli.progress import progress, quiet_option
from quill_cli.tools import replay as rpl

commands = Commands("admin")


def _tree_text(s: rpl.Summary) -> str:
    return (
        f"{plural(s.files, 'file')}, {plural(s.directories, 'directory', 'directories')}, "
        f"{size_text(s.bytes)}; tree hash {short(s.tree_hash)}"
    )


def _checked_text(s: rpl.Summary) -> str:
    text = f"{plural(s.events_verified, 'event')} verified (hash chain and tree hashes)"
    if s.compaction is not None:
        text += f", from the compaction at version {s.compaction} (history kept from {s.floor})"
    return text


@commands.command()
@workspace_command
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory to write the tree to (absent or empty).",
)
@click.option("--to-version", type=int, help="Rebuild this version (default: the latest).")
@click.option("--run", "run_id", help="Rebuild what this run read (default: the global --run).")
@quiet_option
async def replay(
    ctx: click.Context,
    ws: Workspace,
    out: Path,
    to_version: int | None,
    run_id: str | None,
    quiet: bool,
) -> None:
    """Rebuild WORKSPACE from its log alone into a directory, checking the hash chain and that
    the tree hashes to what the log recorded; two replays give identical trees."""
    js, subjects = ws.client.nc.jetstream(), ws.client.subjects
    if run_id is not None and to_version is not None:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Give --run or --to-version, not both")
    if run_id is None and to_version is None:
        run_id = ctx.obj["run"]  # quill --run ID replay ..., or $QUILL_RUN
    if run_id is not None:
        to_version = (await rpl.find_run(js, subjects, ws.tenant, ws.name, run_id)).version
    contents = rpl.Contents()
    try:
        with progress(quiet) as bar:
            fold = await rpl.replay(
                js, subjects, ws.tenant, ws.name, to_version=to_version, contents=contents,
                progress=bar,
            )  # fmt: skip
            await rpl.write_tree(fold, Blobs(js), out, contents, bar)
    finally:
        contents.close()
    s = fold.summary(run=run_id, out=str(out))
    run = f" (what run {run_id} read)" if run_id else ""
    emit(
        ctx,
        s,
        f"replayed {ws.tenant}/{ws.name} version {s.version}{run} into {out}: {_tree_text(s)}\n"
        f"{_checked_text(s)}",
    )


class RunList(msgspec.Struct, kw_only=True):
    tenant: str
    workspace: str
    version: int
    runs: list[rpl.RunRecord]


def _runs_text(r: RunList) -> str:
    if not r.runs:
        return f"no runs in {r.tenant}/{r.workspace}"
    rows = [("RUN", "VERSION", "STATUS", "ACTOR", "STARTED", "ENDED")]
    for run in r.runs:
        rows.append(
            (run.run, str(run.version), run.status, run.actor or "-",
             when(run.started), when(run.ended))
        )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


@commands.command()
@workspace_command
@quiet_option
async def runs(ctx: click.Context, ws: Workspace, quiet: bool) -> None:
    """List WORKSPACE's runs from its log: the version each read, whether it ended, who
    started it, when (replay one with quill replay --run ID)."""
    js, subjects = ws.client.nc.jetstream(), ws.client.subjects
    with progress(quiet) as bar:
        fold = await rpl.replay(js, subjects, ws.tenant, ws.name, progress=bar)
    found = sorted(fold.runs.values(), key=lambda r: r.started_version)
    result = RunList(tenant=ws.tenant, workspace=ws.name, version=fold.version, runs=found)
    emit(ctx, result, lambda: _runs_text(result))


class Verified(msgspec.Struct, kw_only=True):
    ok: bool
    log: rpl.Summary
    replicas: list[rpl.ReplicaCheck]


def _verified_text(v: Verified) -> str:
    s = v.log
    lines = [f"log: {s.tenant}/{s.workspace} version {s.version}: {_checked_text(s)}"]
    lines.append(f"  {_tree_text(s)}")
    for r in v.replicas:
        if r.ok:
            lines.append(f"reader {r.instance}: ok (tree hash {short(r.tree_hash)})")
        else:
            lines.append(f"reader {r.instance}: MISMATCH: {'; '.join(r.problems)}")
    return "\n".join(lines)


@commands.command()
@workspace_command
@click.option(
    "--deep",
    is_flag=True,
    help="Compute each replica's tree hash from its answers (a listing and a stat of every "
    "file) instead of taking the one it records.",
)
@click.option("--timeout", type=DURATION, default="10s", show_default=True, help="Per replica.")
@click.option(
    "--ping-wait",
    type=DURATION,
    default="500ms",
    show_default=True,
    help="How long to gather the replicas' answers to the ping.",
)
@quiet_option
async def verify(
    ctx: click.Context, ws: Workspace, deep: bool, timeout: int, ping_wait: int, quiet: bool
) -> None:
    """Check WORKSPACE's log (hash chain, tree hashes) and that every live reader replica
    answers the same tree at its latest version; exit 1 on any mismatch."""
    nc, subjects = ws.client.nc, ws.client.subjects
    with progress(quiet) as bar:
        fold = await rpl.replay(nc.jetstream(), subjects, ws.tenant, ws.name, progress=bar)
        instances = await rpl.live_readers(nc, subjects, ping_wait / 1000)
        checks = [  # one replica at a time: one bar, and 32 requests in flight, not 32 each
            await rpl.check_replica(
                nc, subjects, fold, i, deep=deep, timeout=timeout / 1000, progress=bar
            )
            for i in instances
        ]
    result = Verified(ok=all(c.ok for c in checks), log=fold.summary(), replicas=list(checks))
    emit(ctx, result, lambda: _verified_text(result))
    if not instances:
        click.echo("quill: no reader replica answered the ping: only the log was checked", err=True)
    bad = [c.instance for c in checks if not c.ok]
    if bad:
        raise QuillError(
            ErrorCode.INTERNAL,
            f"{len(bad)} of {len(checks)} reader replicas disagree with the log at version "
            f"{fold.version}: {', '.join(bad)}",
        )


@commands.command(name="export")
@workspace_command
@click.argument("file")
@quiet_option
async def export_(ctx: click.Context, ws: Workspace, file: str, quiet: bool) -> None:
    """Write WORKSPACE with its whole history (its events, and the contents they keep in
    WS_BLOBS) to FILE: JSON lines, gzip-compressed if FILE ends in .gz; - for stdout."""
    js, subjects = ws.client.nc.jetstream(), ws.client.subjects
    fold = rpl.Fold(ws.tenant, ws.name)
    if file == "-":
        moved = await rpl.export(js, subjects, fold, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    else:
        path = Path(file)
        tmp = path.with_name(f".{path.name}.partial")
        try:
            with (
                progress(quiet) as bar,
                gzip.open(tmp, "wb") if path.suffix == ".gz" else open(tmp, "wb") as out,
            ):
                moved = await rpl.export(js, subjects, fold, out, bar)
            tmp.rename(path)
        finally:
            tmp.unlink(missing_ok=True)
    text = (
        f"exported {ws.tenant}/{ws.name} version {moved.version} to {file}: "
        f"{plural(moved.events, 'event')}, {plural(moved.blobs, 'content')} from WS_BLOBS"
    )
    if file == "-" and not ctx.obj["json"]:
        click.echo(text, err=True)
    elif file != "-":
        emit(ctx, moved, text)


def _reader(path: Path) -> Callable[[], Any]:
    """Opens ``path`` for reading, through gzip if it is gzip-compressed."""
    with open(path, "rb") as probe:
        compressed = probe.read(2) == b"\x1f\x8b"
    return (lambda: gzip.open(path, "rb")) if compressed else (lambda: open(path, "rb"))


@commands.command(name="import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("workspace")
@quiet_option
@click.pass_context
def import_(ctx: click.Context, file: Path, workspace: str, quiet: bool) -> None:
    """Import an export FILE as WORKSPACE, which must not exist yet: the whole file is checked
    first (contents, hash chain, tree hashes), then appended, then the new log replayed."""

    async def go() -> rpl.Moved:
        async with connected(ctx) as quill:
            ws = quill.workspace(workspace)
            with progress(quiet) as bar:
                return await rpl.import_file(
                    quill.nc, quill.subjects, _reader(file), str(file), ws.tenant, ws.name, bar
                )

    moved = run_client(go())
    note = " (re-hashed under the new name)" if moved.rehashed else " (hashes kept)"
    emit(
        ctx,
        moved,
        f"imported {moved.source} as {moved.tenant}/{moved.workspace}: version {moved.version}, "
        f"{plural(moved.events, 'event')}, {plural(moved.blobs, 'content')}{note}; "
        f"tree hash {short(moved.tree_hash)}",
    )
