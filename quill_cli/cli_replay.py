"""``quill replay``, ``quill verify``, ``quill export``/``import``, ``quill runs``: tooling
that works from the log alone (``quill_cli/tools/replay.py``; docs/replay.md); ``quill scrub``,
which rewrites a log to take a leaked secret out of it (``quill_cli/tools/scrub.py``)."""

from __future__ import annotations

import contextlib
import gzip
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import click
import msgspec
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from contracts.errors import ErrorCode, QuillError
from core.secrets import Secrets
from infra import secret_registry
from infra.blobs import Blobs
from infra.secret_registry import ENV_FILE
from quill.client import Workspace
from quill_cli.cli import DURATION, _run, connect, emit, main, size_text, workspace_command
from quill_cli.tools import replay as rpl
from quill_cli.tools import scrub as scr


def _short(digest: str | None) -> str:
    return f"{digest[:12]}…" if digest else "-"


def _plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else words or word + 's'}"


def _tree_text(s: rpl.Summary) -> str:
    return (
        f"{_plural(s.files, 'file')}, {_plural(s.directories, 'directory', 'directories')}, "
        f"{size_text(s.bytes)}; tree hash {_short(s.tree_hash)}"
    )


def _checked_text(s: rpl.Summary) -> str:
    text = f"{_plural(s.events_verified, 'event')} verified (hash chain and tree hashes)"
    if s.compaction is not None:
        text += f", from the compaction at version {s.compaction} (history kept from {s.floor})"
    return text


# ---------------------------------------------------------------- progress

BAR_DELAY_S = 1.0
"""A bar appears only for what takes longer than this."""

quiet_option = click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="No progress bar (there is none either when stdout or stderr is not a terminal).",
)


class Bar:
    """``rpl.Progress`` drawn with rich on stderr, once a phase has run ``BAR_DELAY_S``."""

    def __init__(self, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True)
        self._lock = threading.Lock()
        self._rich: Progress | None = None
        self._task: TaskID | None = None
        self._what, self._total, self._done = "", cast(int | None, None), 0
        self._since = time.monotonic()

    def start(self, what: str, total: int | None) -> None:
        with self._lock:
            if self._rich is not None and self._task is not None:
                self._rich.update(self._task, completed=self._total or self._done)
                self._task = self._rich.add_task(what, total=total)
            self._what, self._total, self._done = what, total, 0

    def update(self, completed: int) -> None:
        with self._lock:
            self._done = completed
            if self._rich is None and time.monotonic() - self._since >= BAR_DELAY_S:
                self._rich = Progress(
                    SpinnerColumn(),
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TimeRemainingColumn(),
                    console=self._console,
                )
                self._rich.start()
                self._task = self._rich.add_task(self._what, total=self._total)
            if self._rich is not None and self._task is not None:
                self._rich.update(self._task, completed=completed)

    def close(self) -> None:
        with self._lock:
            if self._rich is not None:
                self._rich.stop()
                self._rich = None


def _tty() -> bool:
    return sys.stdout.isatty() and sys.stderr.isatty()


@contextlib.contextmanager
def progress(quiet: bool) -> Iterator[rpl.Progress]:
    """A bar on the terminal, or nothing with ``--quiet`` or when not on a terminal."""
    if quiet or not _tty():
        yield rpl.QUIET
        return
    bar = Bar()
    try:
        yield bar
    finally:
        bar.close()


@main.command()
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
        ended = f"{run.ended:%Y-%m-%d %H:%M:%S}" if run.ended else "-"
        rows.append(
            (run.run, str(run.version), run.status, run.actor or "-",
             f"{run.started:%Y-%m-%d %H:%M:%S}", ended)
        )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


@main.command()
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
            lines.append(f"reader {r.instance}: ok (tree hash {_short(r.tree_hash)})")
        else:
            lines.append(f"reader {r.instance}: MISMATCH: {'; '.join(r.problems)}")
    return "\n".join(lines)


@main.command()
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


@main.command(name="export")
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
        f"{_plural(moved.events, 'event')}, {_plural(moved.blobs, 'content')} from WS_BLOBS"
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


@main.command(name="import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("workspace")
@quiet_option
@click.pass_context
def import_(ctx: click.Context, file: Path, workspace: str, quiet: bool) -> None:
    """Import an export FILE as WORKSPACE, which must not exist yet: the whole file is checked
    first (contents, hash chain, tree hashes), then appended, then the new log replayed."""

    async def go() -> rpl.Moved:
        quill = await connect(ctx)
        try:
            ws = quill.workspace(workspace)
            with progress(quiet) as bar:
                return await rpl.import_file(
                    quill.nc, quill.subjects, _reader(file), str(file), ws.tenant, ws.name, bar
                )
        finally:
            await quill.close()

    moved = _run(go())
    note = " (re-hashed under the new name)" if moved.rehashed else " (hashes kept)"
    emit(
        ctx,
        moved,
        f"imported {moved.source} as {moved.tenant}/{moved.workspace}: version {moved.version}, "
        f"{_plural(moved.events, 'event')}, {_plural(moved.blobs, 'content')}{note}; "
        f"tree hash {_short(moved.tree_hash)}",
    )


def _scrubbed_text(s: scr.Scrubbed) -> str:
    name, ids = f"{s.tenant}/{s.workspace}", ", ".join(s.secret_ids)
    found = (
        f"{_plural(s.events_changed, 'event')}, {_plural(s.contents_changed, 'content')}, "
        f"{_plural(len(s.paths_changed), 'path')}, {_plural(s.audit_records, 'audit record')}, "
        f"{_plural(s.kv_entries, 'KV entry', 'KV entries')}"
        + (f", {_plural(s.outputs_purged, 'command output')}" if s.outputs_purged else "")
    )
    if s.dry_run:
        return f"dry run: {ids} found in {name}: {found}; nothing changed" + _shared_text(s)
    text = f"scrubbed {ids} from {name}: {found}\n"
    if s.form == "unchanged":
        return text + f"the log carried none: kept as it was (head {_short(s.head)})"
    kept = (
        "every event re-chained"
        if s.form == "events"
        else "history kept in the scrub's manifest (too many events for one atomic batch)"
    )
    return (
        text
        + (
            f"log: version {s.old_version} head {_short(s.old_head)} -> version {s.version} "
            f"head {_short(s.head)} ({kept}); tree hash {_short(s.tree_hash)}; "
            f"{_plural(s.blobs_deleted, 'blob')} deleted; verified\n"
            f"{_plural(len(s.replicas), 'reader replica')} rebuilt and agreeing"
        )
        + _shared_text(s)
    )


def _shared_text(s: scr.Scrubbed) -> str:
    """The other workspaces that name a blob that held a secret (kept for them)."""
    if not s.shared_with:
        return ""
    one = len(s.shared_with) == 1
    kept = "would be kept" if s.dry_run else "kept"
    return (
        f"\n{_plural(s.blobs_kept, 'blob')} {kept}: {', '.join(s.shared_with)} "
        f"{'holds' if one else 'hold'} the same content: scrub {'it' if one else 'them'} too"
    )


@main.command()
@click.argument("workspaces", metavar="WORKSPACE...", nargs=-1, required=True)
@click.option(
    "--secrets",
    "secrets_file",
    envvar=ENV_FILE,
    required=True,
    help="The secrets registry (TOML, as quill up --secrets; default $QUILL_SECRETS): each "
    "secret it holds is scrubbed. - reads it from stdin. Never give a value on the command line.",
)
@click.option("--dry-run", is_flag=True, help="Report where the secrets occur; change nothing.")
@click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=scr.MAX_BATCH,
    show_default=True,
    help="Most events appended as one atomic batch (the server's jetstream.limits.batch."
    "max_msgs); a longer log keeps its scrubbed history in the scrub's manifest.",
)
@click.pass_context
def scrub(
    ctx: click.Context,
    workspaces: tuple[str, ...],
    secrets_file: str,
    dry_run: bool,
    max_batch: int,
) -> None:
    """Take leaked secrets out of each WORKSPACE's history: rewrite its log with every
    occurrence redacted (contents, paths, messages, actors...), re-chain and verify it, replace
    it atomically (refused if the workspace is written meanwhile), delete the blobs (unless
    another workspace names one: it is kept and that workspace named), audit records and KV
    values that held them; replicas rebuild. Audited (op scrub, secret ids). Several
    workspaces are scrubbed in turn: a blob they share goes with the last of them."""
    path = Path("/dev/stdin") if secrets_file == "-" else Path(secrets_file)
    try:
        secrets = secret_registry.load(path)
    except (OSError, ValueError) as exc:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"--secrets: {exc}") from None

    async def go() -> None:
        quill = await connect(ctx)
        try:
            for name in dict.fromkeys(workspaces):
                ws = quill.workspace(name)
                result = await _scrub_one(ctx, ws, secrets, dry_run, max_batch)
                emit(ctx, result, _scrubbed_text(result))
        finally:
            await quill.close()

    _run(go())


async def _scrub_one(
    ctx: click.Context, ws: Workspace, secrets: Secrets, dry_run: bool, max_batch: int
) -> scr.Scrubbed:
    result = await scr.scrub(
        ws.client.nc,
        ws.client.subjects,
        ws.tenant,
        ws.name,
        secrets,
        actor=ctx.obj["actor"],
        dry_run=dry_run,
        max_batch=max_batch,
    )
    if not dry_run:  # the replicas rebuilt: each answers the new log's tree
        nc, subjects = ws.client.nc, ws.client.subjects
        fold = await rpl.replay(nc.jetstream(), subjects, ws.tenant, ws.name)
        checks = [
            await rpl.check_replica(nc, subjects, fold, instance, deep=False)
            for instance in await rpl.live_readers(nc, subjects)
        ]
        result.replicas = [c.instance for c in checks if c.ok]
        bad = [f"{c.instance} ({'; '.join(c.problems)})" for c in checks if not c.ok]
        if bad:
            raise QuillError(
                ErrorCode.INTERNAL,
                f"The log of {ws.tenant}/{ws.name} is scrubbed, but reader replicas disagree "
                f"with it: {', '.join(bad)}",
            )
    return result
