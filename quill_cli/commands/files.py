"""``quill create``, ``info``, ``put``, ``cat``, ``ls``, ``stat``, ``rm``, ``mv``, ``mkdir``,
``edit``: a workspace and its files, as a person would use them."""

from __future__ import annotations

import sys
from typing import Any

import click
import msgspec

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from contracts.limits import CEILINGS, LimitsPatch
from contracts.paths import display, normalize
from quill.client import Workspace
from quill_cli.common import (
    DURATION,
    Commands,
    columns,
    emit,
    plural,
    size_text,
    value_text,
    when,
    workspace_command,
)

commands = Commands("files")


@commands.command()
@workspace_command
@click.option("--trust", type=click.Choice(["full", "restricted"]), default="full")
@click.option("--max-file-bytes", type=int)
@click.option("--max-files", type=int)
@click.option("--max-versions", type=int, help="Revisions kept per file (at least; default: all).")
@click.option(
    "--max-checkout-bytes", type=int, help="Disk an executor's checkout of it may hold (4 GiB)."
)
@click.option(
    "--gitignore/--no-gitignore",
    default=None,
    help="Whether commands' changes honour .gitignore files as git does (default: yes).",
)
@click.option(
    "--approval-ttl",
    "approval_ttl_ms",
    type=DURATION,
    help="restricted: how long a request waits for its approval before it expires (24h).",
)
@click.option("--exist-ok", is_flag=True, help="Succeed if it already exists.")
async def create(
    ctx: click.Context,
    ws: Workspace,
    trust: str,
    max_file_bytes: int | None,
    max_files: int | None,
    max_versions: int | None,
    max_checkout_bytes: int | None,
    gitignore: bool | None,
    approval_ttl_ms: int | None,
    exist_ok: bool,
) -> None:
    """Create WORKSPACE (tenant/workspace)."""
    limits = LimitsPatch(
        max_file_bytes=max_file_bytes,
        max_files=max_files,
        max_versions=max_versions,
        max_checkout_bytes=max_checkout_bytes,
        gitignore=gitignore,
        approval_ttl_s=max(1, approval_ttl_ms // 1000) if approval_ttl_ms is not None else None,
    )
    r = await ws.create(trust=trust, limits=limits, exist_ok=exist_ok)  # type: ignore[arg-type]
    emit(
        ctx,
        r,
        lambda: (
            f"{'created' if r.created else 'exists:'} {r.tenant}/{r.workspace} (trust {r.trust})"
        ),
    )


@commands.command()
@workspace_command
@click.option("--version", "at", type=int)
async def info(ctx: click.Context, ws: Workspace, at: int | None) -> None:
    """Show the workspace's version, limits and counters."""
    r: rp.WorkspaceInfo = await ws.info(version=at)
    emit(
        ctx,
        r,
        lambda: "\n".join(
            [
                f"workspace: {r.tenant}/{r.workspace}",
                f"version: {r.version}",
                f"trust: {r.trust}",
                f"files: {r.files:,}  directories: {r.directories:,}  "
                f"size: {size_text(r.total_bytes)}",
                f"created: {value_text(r.created)}",
                f"updated: {value_text(r.updated)}",
                f"tree hash: {r.tree_hash}",
                f"limits: {value_text(r.limits)}",
                f"default exclusions: {' '.join(r.default_exclusions)}",
            ]
        ),
    )


async def _read_bounded(ws: Workspace, source: Any) -> bytes:
    """SOURCE's bytes, reading no more than the workspace's ``max_file_bytes`` + 1.

    Raises:
        QuillError: ``SIZE_LIMIT_EXCEEDED`` for a bigger source.
    """
    try:
        most = (await ws.info()).limits.max_file_bytes
    except QuillError:  # the write will say what is wrong; bound the read all the same
        most = CEILINGS.max_file_bytes
    data = bytearray()
    while len(data) <= most:
        chunk = source.read(min(1 << 20, most + 1 - len(data)))
        if not chunk:
            return bytes(data)
        data += chunk
    name = getattr(source, "name", "SOURCE")
    raise QuillError(
        ErrorCode.SIZE_LIMIT_EXCEEDED,
        f"{'stdin' if name == '<stdin>' else name} is over {most} bytes, the largest file "
        f"{ws.tenant}/{ws.name} takes (max_file_bytes): not sent",
        {"max_file_bytes": most},
    )


@commands.command()
@workspace_command
@click.argument("path")
@click.argument("source", type=click.File("rb"), required=False)
@click.option("--text", help="Content to write (instead of SOURCE or stdin).")
@click.option("--append", is_flag=True, help="Append instead of overwriting.")
@click.option("--create-only", is_flag=True, help="Fail if the file exists.")
@click.option("--if-match", help="Only if the file's etag is this one.")
async def put(
    ctx: click.Context,
    ws: Workspace,
    path: str,
    source: Any,
    text: str | None,
    append: bool,
    create_only: bool,
    if_match: str | None,
) -> None:
    """Write PATH from SOURCE (a file, or - for stdin), or from --text.

    At most the workspace's max_file_bytes (plus one) is read from SOURCE: a bigger source is
    refused (SIZE_LIMIT_EXCEEDED) without reading the rest."""
    if text is not None:
        content: str | bytes = text
    else:
        content = await _read_bounded(ws, source or sys.stdin.buffer)
    mode = "append" if append else "create" if create_only else "overwrite"
    r = await ws.write(path, content, mode=mode, if_match=if_match)  # type: ignore[arg-type]
    versions = f"file version {r.file_version}, workspace version {ws.last_version}"
    if append:  # what was added, and what the file is now
        line = f"appended {plural(r.bytes_written, 'byte')} to {r.path}: now "
        line += f"{plural(r.size, 'byte')}, {versions}"
    else:
        line = f"wrote {r.path}: {plural(r.bytes_written, 'byte')}, {versions}"
    emit(ctx, r, line)


@commands.command()
@workspace_command
@click.argument("path")
@click.option("--version", "at", type=int, help="As of this workspace version.")
@click.option("-n", "--line-numbers", is_flag=True)
@click.option("--head", type=int)
@click.option("--tail", type=int)
@click.option("--offset", type=int, help="First line (1-based).")
@click.option("--limit", type=int, help="Number of lines.")
async def cat(
    ctx: click.Context,
    ws: Workspace,
    path: str,
    at: int | None,
    line_numbers: bool,
    head: int | None,
    tail: int | None,
    offset: int | None,
    limit: int | None,
) -> None:
    """Print PATH (binary files are written as raw bytes)."""
    r = await ws.read(
        path,
        version=at,
        line_numbers=line_numbers,
        head=head,
        tail=tail,
        offset=offset,
        limit=limit,
    )
    if r.kind == "directory":  # as read_file says (MCP, REST): cat reads files
        raise QuillError(
            ErrorCode.NOT_A_FILE,
            f"Not a file: {r.path} is a directory (quill ls {ws.tenant}/{ws.name} {r.path} "
            "lists it)",
            {"path": r.path},
        )
    if ctx.obj["json"]:
        emit(ctx, r, lambda: None)
    elif r.binary:
        sys.stdout.buffer.write(await ws.read_bytes(path, version=at))
    else:
        click.echo(r.content or "", nl=False)
        if r.truncated:
            click.echo(
                f"\nquill: output truncated ({r.returned_lines} of {r.total_lines} "
                "lines); use --offset/--limit",
                err=True,
            )


@commands.command()
@workspace_command
@click.argument("path", default=".")
@click.option("--version", "at", type=int)
@click.option("-l", "long", is_flag=True, help="Long listing.")
@click.option("-R", "--recursive", is_flag=True, help="Everything beneath PATH, by path.")
async def ls(
    ctx: click.Context, ws: Workspace, path: str, at: int | None, long: bool, recursive: bool
) -> None:
    """List a directory (every entry: page after page, as of one version)."""
    entries = [e async for e in ws.list_all(path, recursive=recursive, version=at)]

    def human() -> str:
        rows = []
        for e in entries:
            label = (e.path if recursive else e.name) + ("/" if e.kind == "directory" else "")
            if long:
                fv = f"v{e.file_version}" if e.file_version else "-"
                rows.append([size_text(e.size), when(e.modified), fv, label])
            else:
                rows.append([label])
        aligned = frozenset({0, 2}) if long else frozenset()
        return columns(rows, right=aligned) if rows else f"(empty: {shown})"

    shown = display(normalize(path))  # valid: the listing succeeded
    listing = rp.Listing(path=shown, entries=entries, total=len(entries), truncated=False)
    emit(ctx, listing, human)


@commands.command()
@workspace_command
@click.argument("path", default=".")
@click.option("--version", "at", type=int)
async def stat(ctx: click.Context, ws: Workspace, path: str, at: int | None) -> None:
    """Show metadata of a file or directory."""
    r = await ws.stat(path, version=at)
    fields = msgspec.structs.asdict(r)
    emit(
        ctx,
        r,
        lambda: columns([[f"{k}:", value_text(v)] for k, v in fields.items() if v is not None]),
    )


@commands.command()
@workspace_command
@click.argument("path")
@click.option("-r", "--recursive", is_flag=True)
@click.option("--if-match")
async def rm(
    ctx: click.Context, ws: Workspace, path: str, recursive: bool, if_match: str | None
) -> None:
    """Delete a file (or a directory with -r)."""
    r = await ws.delete(path, recursive=recursive, if_match=if_match)
    emit(
        ctx,
        r,
        lambda: (
            f"deleted {r.path} ({plural(r.deleted, 'entry', 'entries')}), "
            f"workspace version {ws.last_version}"
        ),
    )


@commands.command()
@workspace_command
@click.argument("source")
@click.argument("destination")
@click.option("--overwrite", is_flag=True)
async def mv(
    ctx: click.Context, ws: Workspace, source: str, destination: str, overwrite: bool
) -> None:
    """Move or rename a file or directory."""
    r = await ws.move(source, destination, overwrite=overwrite)
    emit(
        ctx,
        r,
        lambda: (
            f"moved {r.path} -> {r.to} ({plural(r.moved, 'entry', 'entries')}), "
            f"workspace version {ws.last_version}"
        ),
    )


@commands.command()
@workspace_command
@click.argument("path")
async def mkdir(ctx: click.Context, ws: Workspace, path: str) -> None:
    """Create a directory and its parents."""
    r = await ws.mkdir(path)
    emit(ctx, r, lambda: f"created {', '.join(r.created)}" if r.created else f"exists: {r.path}")


@commands.command()
@workspace_command
@click.argument("path")
@click.argument("old")
@click.argument("new")
@click.option("--all", "replace_all", is_flag=True, help="Replace every occurrence.")
@click.option("--if-match", help="Only if the file's etag is this one.")
async def edit(
    ctx: click.Context,
    ws: Workspace,
    path: str,
    old: str,
    new: str,
    replace_all: bool,
    if_match: str | None,
) -> None:
    """Replace the text OLD with NEW in PATH: exactly one occurrence, or every one with --all."""
    r = await ws.edit(path, old, new, replace_all=replace_all, if_match=if_match)
    emit(
        ctx,
        r,
        lambda: (
            f"edited {r.path}: {plural(r.replacements, 'occurrence')} replaced, "
            f"{plural(r.lines_changed, 'line')} changed, "
            f"file version {r.file_version}, workspace version {ws.last_version}"
        ),
    )
