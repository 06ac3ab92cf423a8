"""``quill grep``, ``glob``, ``tree``: finding things in a workspace (with its default
exclusions unless ``--exclude``/``--no-exclude`` say otherwise)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from quill.client import Workspace
from quill_cli.common import Commands, emit, size_text, when, workspace_command

commands = Commands("files")


EXCLUDE_HELP = "Leave out paths matching this glob (repeatable)."


def _exclusions(verb: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--exclude`` (repeatable) and ``--no-exclude``: "VERB everything" (``_patterns``)."""

    def options(fn: Callable[..., Any]) -> Callable[..., Any]:
        everything = f"{verb} everything (no default exclusions)."
        fn = click.option("--no-exclude", is_flag=True, help=everything)(fn)
        return click.option("--exclude", multiple=True, help=EXCLUDE_HELP)(fn)

    return options


def _patterns(values: tuple[str, ...], none: bool) -> list[str] | None:
    """``--exclude`` values; none given means the workspace's default exclusions."""
    return [] if none else list(values) or None


@commands.command()
@workspace_command
@click.argument("pattern")
@click.argument("path", default=".")
@click.option("-F", "--fixed-strings", "literal", is_flag=True, help="PATTERN is literal text.")
@click.option("-i", "--ignore-case", is_flag=True)
@click.option("-C", "--context", "context_lines", default=0, help="Lines of context.")
@click.option("--include", multiple=True, help="Only files matching this glob (repeatable).")
@_exclusions("Search")
@click.option("--max-results", type=int, help="Matching lines to show.")
@click.option("--version", "at", type=int, help="As of this workspace version.")
async def grep(
    ctx: click.Context,
    ws: Workspace,
    pattern: str,
    path: str,
    literal: bool,
    ignore_case: bool,
    context_lines: int,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    no_exclude: bool,
    max_results: int | None,
    at: int | None,
) -> None:
    """Lines matching the regular expression PATTERN in PATH: a file, or the files under a
    directory (exit status 1: none)."""
    r = await ws.grep(
        pattern,
        path,
        literal=literal,
        ignore_case=ignore_case,
        include=list(include) or None,
        exclude=_patterns(exclude, no_exclude),
        context_lines=context_lines,
        max_results=max_results,
        version=at,
    )

    def human() -> str | None:
        # Like grep: "path:n:text" for a match, "path-n-text" for context, "--" between groups.
        files: dict[str, dict[int, tuple[str, bool]]] = {}
        for m in r.matches:
            numbered = files.setdefault(m.path, {})
            for n, text in enumerate(m.before, m.line - len(m.before)):
                numbered.setdefault(n, (text, False))
            numbered[m.line] = (m.text, True)
            for n, text in enumerate(m.after, m.line + 1):
                numbered.setdefault(n, (text, False))
        lines: list[str] = []
        previous: tuple[str, int] | None = None
        for file, numbered in files.items():
            for n in sorted(numbered):
                text, hit = numbered[n]
                if context_lines and lines and previous != (file, n - 1):
                    lines.append("--")
                mark = ":" if hit else "-"
                lines.append(f"{file}{mark}{n}{mark}{text}")
                previous = (file, n)
        if r.truncated:
            click.echo(
                f"quill: {len(r.matches)} of {r.total} matching lines shown; use --max-results",
                err=True,
            )
        return "\n".join(lines) if lines else None

    emit(ctx, r, human)
    if not r.matches:
        sys.exit(1)


@commands.command(name="glob")
@workspace_command
@click.argument("pattern")
@click.argument("path", default=".")
@click.option("--type", "kind", type=click.Choice(["file", "directory", "any"]), default="any")
@_exclusions("Match")
@click.option("--max-results", type=int)
@click.option("--version", "at", type=int, help="As of this workspace version.")
async def glob_(
    ctx: click.Context,
    ws: Workspace,
    pattern: str,
    path: str,
    kind: str,
    exclude: tuple[str, ...],
    no_exclude: bool,
    max_results: int | None,
    at: int | None,
) -> None:
    """Paths under PATH matching PATTERN (*, **, ?, [abc], {a,b}), newest first."""
    r = await ws.glob(
        pattern,
        path,
        kind=kind,  # type: ignore[arg-type]
        exclude=_patterns(exclude, no_exclude),
        max_results=max_results,
        version=at,
    )

    def human() -> str | None:
        if r.truncated:
            total = r.total if r.total_exact else f"at least {r.total}"
            click.echo(f"quill: {len(r.entries)} of {total} shown; use --max-results", err=True)
        names = [e.path + ("/" if e.kind == "directory" else "") for e in r.entries]
        return "\n".join(names) if names else None

    emit(ctx, r, human)


@commands.command()
@workspace_command
@click.argument("path", default=".")
@click.option("-L", "--depth", "max_depth", default=3, show_default=True, help="Levels to show.")
@_exclusions("Show")
@click.option("-l", "long", is_flag=True, help="Sizes and modification times.")
@click.option("--max-results", type=int)
@click.option("--version", "at", type=int, help="As of this workspace version.")
async def tree(
    ctx: click.Context,
    ws: Workspace,
    path: str,
    max_depth: int,
    exclude: tuple[str, ...],
    no_exclude: bool,
    long: bool,
    max_results: int | None,
    at: int | None,
) -> None:
    """The tree under PATH, directories first (default exclusions such as .git left out)."""
    r = await ws.explore(
        path,
        recursive=True,
        max_depth=max_depth,
        exclude=_patterns(exclude, no_exclude),
        metadata=long,
        max_results=max_results,
        version=at,
    )

    def human() -> str:
        lines = []
        for e in r.entries:
            name = e.path.rsplit("/", 1)[-1] + ("/" if e.kind == "directory" else "")
            size = f"{size_text(e.size or 0):>10}  " if long else ""
            stamp = f"{when(e.modified)}  " if long and e.modified else ""
            lines.append(f"{size}{stamp}{'  ' * (e.depth - 1)}{name}")
        if r.truncated:
            lines.append(f"... {r.total - len(r.entries)} more")
        return "\n".join(lines) or f"(empty: {r.path or '.'})"

    emit(ctx, r, human)
