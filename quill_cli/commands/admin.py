"""``quill scrub``, which rewrites a log to take a leaked secret out of it
(``quill_cli/tools/scrub.py``), ``quill snapshot``, which asks a reader replica to snapshot its
projection now (``infra/snapshots.py``), and ``quill nats-auth``, the NATS servers'
authorization for a tenants file (``quill_cli/tenants.py``; docs/operations.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import nats.errors

from contracts.errors import ErrorCode, QuillError
from core.secrets import Secrets
from infra import secret_registry
from infra import snapshots as snaps
from infra.secret_registry import ENV_FILE
from quill.client import Workspace
from quill_cli.common import Commands, connected, emit, fail, plural, refusing, run_client, short
from quill_cli.tools import replay as rpl
from quill_cli.tools import scrub as scr

commands = Commands("admin")


def _scrubbed_text(s: scr.Scrubbed) -> str:
    name, ids = f"{s.tenant}/{s.workspace}", ", ".join(s.secret_ids)
    found = (
        f"{plural(s.events_changed, 'event')}, {plural(s.contents_changed, 'content')}, "
        f"{plural(len(s.paths_changed), 'path')}, {plural(s.audit_records, 'audit record')}, "
        f"{plural(s.kv_entries, 'KV entry', 'KV entries')}"
        + (f", {plural(s.outputs_purged, 'command output')}" if s.outputs_purged else "")
        + (f", {plural(s.approvals, 'approval entry', 'approval entries')}" if s.approvals else "")
    )
    if s.dry_run:
        return f"dry run: {ids} found in {name}: {found}; nothing changed" + _shared_text(s)
    text = f"scrubbed {ids} from {name}: {found}\n"
    if s.form == "unchanged":
        return text + f"the log carried none: kept as it was (head {short(s.head)})"
    kept = (
        "every event re-chained"
        if s.form == "events"
        else "history kept in the scrub's manifest (too many events for one atomic batch)"
    )
    return (
        text
        + (
            f"log: version {s.old_version} head {short(s.old_head)} -> version {s.version} "
            f"head {short(s.head)} ({kept}); tree hash {short(s.tree_hash)}; "
            f"{plural(s.blobs_deleted, 'blob')} deleted; verified\n"
            f"{plural(len(s.replicas), 'reader replica')} rebuilt and agreeing"
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
        f"\n{plural(s.blobs_kept, 'blob')} {kept}: {', '.join(s.shared_with)} "
        f"{'holds' if one else 'hold'} the same content: scrub {'it' if one else 'them'} too"
    )


@commands.command()
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
        fail(QuillError(ErrorCode.INVALID_ARGUMENT, f"--secrets: {exc}"))

    async def go() -> None:
        async with connected(ctx) as quill:
            for name in dict.fromkeys(workspaces):
                ws = quill.workspace(name)
                result = await _scrub_one(ctx, ws, secrets, dry_run, max_batch)
                emit(ctx, result, _scrubbed_text(result))

    run_client(go())


async def _forks(ws: Workspace) -> list[str]:
    """The workspace's forks, by name (a reader's ``qry.forks``; a first page names enough)."""
    return [f.workspace for f in (await ws.forks()).forks]


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
        forks=lambda: _forks(ws),
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


@commands.command()
@click.option("--list", "listing", is_flag=True, help="List the snapshots kept; make none.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Seconds to wait for the replica making it.",
)
@click.pass_context
def snapshot(ctx: click.Context, listing: bool, timeout: float) -> None:
    """Snapshot the readers' projection now: one reader replica copies its projection into the
    WS_SNAPSHOTS object store (the oldest beyond its --snapshot-keep deleted), where a new or
    wiped reader (or a writer with no projection) starts from. With --list, the snapshots kept,
    newest first."""

    async def go() -> None:
        async with connected(ctx) as quill:
            if listing:
                found = await snaps.listing(quill.nc.jetstream(), "reader")
                rows = [
                    {"name": s.name, "position": s.position, "bytes": s.size,
                     "stored_bytes": s.stored, "made": s.made.isoformat(), "by": s.by}
                    for s in found
                ]  # fmt: skip
                text = "\n".join(
                    f"{r['name']}  log position {r['position']:,}  {r['bytes']:,} bytes "
                    f"({r['stored_bytes']:,} stored)  {r['made']}  by {r['by']}"
                    for r in rows
                )
                emit(ctx, rows, text or "no snapshots")
                return
            subject = quill.subjects.snapshot("reader")
            try:
                reply = await quill.nc.request(subject, b"", timeout=timeout)
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
                raise QuillError(
                    ErrorCode.UNAVAILABLE, f"No reader replica made a snapshot: {exc!r}"
                ) from None
            made = json.loads(reply.data)
            if not made.get("ok"):
                raise QuillError(ErrorCode.UNAVAILABLE, str(made.get("error")))
            emit(
                ctx,
                made,
                f"{made['name']}: log position {made['position']:,}, {made['bytes']:,} bytes "
                f"({made['stored_bytes']:,} stored), by {made['by']}",
            )

    run_client(go())


@commands.command("nats-auth")
@click.argument("tenants_file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--root", default="ws", show_default=True, help="Subject root.")
def nats_auth(tenants_file: Path, root: str) -> None:
    """Print the nats-server authorization block for TENANTS_FILE (put it in the
    configuration of every server of yours). The services' password is $QUILL_NATS_PASSWORD."""
    from quill_cli import tenants as tenancy

    password = os.environ.get("QUILL_NATS_PASSWORD", "")
    with refusing(AssertionError):
        if len(password) < tenancy.MIN_PASSWORD or not password.isascii():
            raise ValueError(
                "set QUILL_NATS_PASSWORD to the services' password (at least "
                f"{tenancy.MIN_PASSWORD} ASCII characters; never on the command line)"
            )
        block = tenancy.authorization(tenancy.load(tenants_file), password, root)
    click.echo(block, nl=False)
