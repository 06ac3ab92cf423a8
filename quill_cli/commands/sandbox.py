"""``quill exec``, ``output``, ``git``: commands run in the workspace's sandbox, their kept
output, and what they changed (on stderr: stdout is the command's)."""

from __future__ import annotations

import os
import shlex
import stat
import sys

import click

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import EXEC_STDIN_MAX_BYTES
from quill.client import Workspace
from quill_cli.common import Commands, columns, emit, plural, when, workspace_command

commands = Commands("exec")


def _changes_note(changes: rp.CapturedChanges | None) -> None:
    """What a command did to the workspace, on stderr (stdout is the command's)."""
    if changes is None:
        return
    if changes.committed:
        click.echo(
            f"quill: committed {plural(changes.total, 'path')} as version {changes.version}",
            err=True,
        )
    for conflict in changes.conflicts:
        click.echo(f"quill: not committed: {conflict.path}: {conflict.reason}", err=True)
    for skipped in changes.skipped:
        click.echo(f"quill: not committed: {skipped.path} ({skipped.reason})", err=True)
    if changes.ignored:
        total = max(changes.ignored_total, len(changes.ignored))
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(changes.ignored_reasons.items()))
        shown = ", ".join(changes.ignored[:5]) + (", ..." if total > 5 else "")
        click.echo(
            f"quill: left out {plural(total, 'ignored path')}{f' ({why})' if why else ''}: {shown}",
            err=True,
        )
    for warning in changes.warnings:
        click.echo(f"quill: warning: {warning}", err=True)
    if changes.error:
        click.echo(f"quill: nothing committed: {changes.error}", err=True)


def _piped_stdin() -> bytes | None:
    """What was piped or redirected into ``quill exec`` (a pipe or a file), read to its end;
    None from a terminal or /dev/null, where there is nothing to give (the command's stdin is
    then closed, as without one).

    Raises:
        QuillError: ``SIZE_LIMIT_EXCEEDED`` past ``EXEC_STDIN_MAX_BYTES`` (read no further).
    """
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError):  # no stdin at all
        return None
    if not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
        return None
    data = sys.stdin.buffer.read(EXEC_STDIN_MAX_BYTES + 1)
    if len(data) > EXEC_STDIN_MAX_BYTES:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"stdin is over {EXEC_STDIN_MAX_BYTES} bytes, the most a command may be given: "
            "not sent (put it in the workspace with quill put, and have the command read it)",
            {"max_stdin_bytes": EXEC_STDIN_MAX_BYTES},
        )
    return data


@commands.command(name="exec")
@workspace_command
@click.option("-C", "--workdir", default="", help="Working directory in the workspace.")
@click.option("-t", "--timeout", "timeout_s", type=float, help="Seconds (default 30).")
@click.option("-e", "--env", multiple=True, help="NAME=VALUE for the command (repeatable).")
@click.option("--version", "at", type=int, help="Run against this workspace version.")
@click.option(
    "-n", "--no-stdin", is_flag=True, help="Do not read stdin (as ssh -n): the command's is closed."
)
@click.option(
    "-b",
    "--background",
    is_flag=True,
    help="Start it and print its id: it runs on (quill attach-output, quill kill, quill ps).",
)
@click.option(
    "-s",
    "--shell",
    "shell_id",
    help="Run in this open shell (quill shell-open): its cwd, variables and processes carry over.",
)
@click.option("-q", "--queue", is_flag=True, help="With --shell: wait for its running command.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
async def exec_(
    ctx: click.Context,
    ws: Workspace,
    workdir: str,
    timeout_s: float | None,
    env: tuple[str, ...],
    at: int | None,
    no_stdin: bool,
    background: bool,
    shell_id: str | None,
    queue: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND in the workspace's sandbox (after --), streaming its output; exit with its
    status. One argument is a shell line; several are words, quoted for the shell. What is
    piped or redirected into quill exec (up to 1 MiB, read whole before the command starts) is
    the command's standard input; from a terminal, or with -n, its stdin is closed. With
    --shell it runs in that open shell instead of a fresh sandbox."""
    line = command[0] if len(command) == 1 else shlex.join(command)
    variables = _variables(env)
    as_json = ctx.obj["json"]

    shown = {"stdout": 0, "stderr": 0}

    def live(stream: str, chunk: bytes) -> None:
        shown[stream] += len(chunk)
        out = sys.stdout.buffer if stream == "stdout" else sys.stderr.buffer
        out.write(chunk)
        out.flush()

    stdin = None if no_stdin else _piped_stdin()
    if shell_id is not None and not stdin:
        stdin = None  # nothing piped: a shell command's stdin is closed
    r = await ws.exec(
        line,
        shell=shell_id,
        queue=queue,
        workdir=workdir,
        timeout_ms=int(timeout_s * 1000) if timeout_s is not None else None,
        env=variables or None,
        version=at,
        on_output=None if as_json or background else live,
        stdin=stdin,
        yield_ms=0 if background else None,
    )
    if background:
        emit(ctx, r, lambda: click.echo(r.command_id))
        return
    if as_json:
        emit(ctx, r, lambda: None)
    else:
        if r.timed_out:
            click.echo(f"quill: timed out after {r.duration_ms / 1000:.1f}s", err=True)
        _exec_notes(r, shown, f"{ws.tenant}/{ws.name}")
        _changes_note(r.changes)
    sys.exit(min(r.exit_code, 255))


def _exec_notes(r: rp.CommandResult, shown: dict[str, int], workspace: str) -> None:
    """What the live output did not show (past what is streamed), and what the command left
    running or tried to read."""
    for stream, total in (("stdout", r.stdout_bytes), ("stderr", r.stderr_bytes)):
        if shown[stream] < total:
            how = (
                f"quill output {workspace} {r.command_id} --stream {stream} "
                f"--offset {shown[stream]}"
                if r.output_kept
                else "it was not kept"
            )
            click.echo(
                f"quill: {stream}: {total - shown[stream]} bytes past the first "
                f"{shown[stream]} were not streamed; the rest: {how}",
                err=True,
            )
    if r.background_killed:
        n = r.background_killed
        click.echo(
            f"quill: the command left {n} process{'' if n == 1 else 'es'} running in the "
            "background, killed when it ended",
            err=True,
        )
    if r.stdin_read:
        click.echo(
            "quill: the command read its standard input, which is closed (end of file); "
            "pipe or redirect input into quill exec to give it some",
            err=True,
        )


@commands.command(name="output")
@workspace_command
@click.argument("command_id")
@click.option(
    "--stream", type=click.Choice(["stdout", "stderr"]), default="stdout", show_default=True
)
@click.option("--offset", type=click.IntRange(min=0), default=0, help="First byte (default 0).")
@click.option("--length", type=click.IntRange(min=1), help="Most bytes (default: to the end).")
async def output(
    ctx: click.Context,
    ws: Workspace,
    command_id: str,
    stream: str,
    offset: int,
    length: int | None,
) -> None:
    """Print the kept output of command COMMAND_ID (its id: `quill exec --json`, or the note
    `quill exec` prints past what it streamed), from --offset. Output is kept an hour after
    the command ended. With --json: one page (64 KiB unless --length) as JSON."""
    which: rq.OutputStream = "stderr" if stream == "stderr" else "stdout"
    if ctx.obj["json"]:
        page = await ws.command_output(
            command_id, stream=which, offset=offset, length=min(length or 65536, 1024**2)
        )
        emit(ctx, page, lambda: None)
        return
    end = None if length is None else offset + length
    while end is None or offset < end:
        size = 1024**2 if end is None else min(end - offset, 1024**2)
        page = await ws.command_output(command_id, stream=which, offset=offset, length=size)
        sys.stdout.write(page.text)
        offset += page.length
        if not page.more or not page.length:
            break
    sys.stdout.flush()


@commands.command()
@workspace_command
@click.argument(
    "action",
    type=click.Choice(
        ["status", "diff", "commit", "checkout", "branch", "log", "push", "pull", "clone"]
    ),
)
@click.option("-C", "--workdir", default="", help="The repository's directory.")
@click.option("-m", "--message", help="commit: the message.")
@click.option("-f", "--file", "files", multiple=True, help="commit: stage only these paths.")
@click.option("-b", "--branch", help="checkout/push/pull: the branch.")
@click.option("--remote", default="origin", show_default=True)
@click.option("--url", help="clone: the repository to clone.")
@click.option("--path", help="diff/log: only this path.")
@click.option("-n", "--limit", default=20, show_default=True, help="log: commits.")
async def git(
    ctx: click.Context,
    ws: Workspace,
    action: str,
    workdir: str,
    message: str | None,
    files: tuple[str, ...],
    branch: str | None,
    remote: str,
    url: str | None,
    path: str | None,
    limit: int,
) -> None:
    """Run a git ACTION on the repository in the workspace (its .git is versioned too)."""
    r = await ws.git(
        action,  # type: ignore[arg-type]
        workdir=workdir,
        message=message,
        files=list(files) or None,
        branch=branch,
        remote=remote,
        url=url,
        path=path,
        limit=limit,
    )

    def human() -> str | None:
        if r.status is not None:
            st = r.status
            track = f" ({st.upstream}: +{st.ahead} -{st.behind})" if st.upstream else ""
            lines = [f"## {st.branch or '(detached)'}{track}"]
            lines += [f"staged    {f.status:<12} {f.path}" for f in st.staged]
            lines += [f"unstaged  {f.status:<12} {f.path}" for f in st.unstaged]
            lines += [f"untracked {'':<12} {p}" for p in st.untracked]
            return "\n".join(lines)
        if r.log is not None:
            return columns([[c.sha[:10], when(c.at), c.author, c.subject] for c in r.log])
        if r.branches is not None:
            return "\n".join(("* " if b == r.branch else "  ") + b for b in r.branches)
        if r.commit is not None:
            return f"[{r.branch or 'detached'} {r.commit[:10]}] {message or ''}".rstrip()
        return r.output.rstrip("\n") or None

    emit(ctx, r, human)
    if not ctx.obj["json"]:
        if r.output_truncated:
            click.echo("quill: output truncated", err=True)
        _changes_note(r.changes)


def _variables(env: tuple[str, ...]) -> dict[str, str]:
    """The ``--env NAME=VALUE`` options as a mapping.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for an item without ``=``.
    """
    variables: dict[str, str] = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Bad --env {item!r}: use NAME=VALUE")
        variables[name] = value
    return variables


@commands.command(name="shell-open")
@workspace_command
@click.option("-C", "--workdir", default="", help="Its first working directory.")
@click.option("-e", "--env", multiple=True, help="NAME=VALUE exported in it (repeatable).")
@click.option("--idle", "idle_s", type=float, help="Close it after this many idle seconds.")
async def shell_open(
    ctx: click.Context, ws: Workspace, workdir: str, env: tuple[str, ...], idle_s: float | None
) -> None:
    """Open a shell on the workspace and print its id: quill exec --shell ID runs in it, and
    what one command leaves (cwd, exported variables, /tmp, background processes) the next
    finds. Close it with quill shell-close."""
    variables = _variables(env)
    sh = await ws.shell(
        workdir=workdir,
        env=variables or None,
        idle_timeout_ms=int(idle_s * 1000) if idle_s is not None else None,
    )
    emit(ctx, {"shell": sh.id}, sh.id)


@commands.command(name="shell-close")
@workspace_command
@click.argument("shell_id")
async def shell_close(ctx: click.Context, ws: Workspace, shell_id: str) -> None:
    """Close the open shell SHELL_ID: its processes are killed, what they changed since its
    last command is committed."""
    closed = await ws.shell_of(shell_id).close()

    def human() -> str:
        return f"closed {shell_id}: {plural(closed.killed, 'process', 'processes')} killed"

    emit(ctx, closed, human)
    if not ctx.obj["json"]:
        _changes_note(closed.background)


@commands.command(name="ps")
@workspace_command
async def ps(ctx: click.Context, ws: Workspace) -> None:
    """List the commands running on in the workspace (quill exec --background), on every
    executor."""
    listed = await ws.running()

    def show() -> None:
        rows = [[c.command_id, when(c.started), c.actor or "-", c.command] for c in listed.commands]
        click.echo(columns([["ID", "STARTED", "ACTOR", "COMMAND"], *rows]))

    emit(ctx, listed, show)


@commands.command(name="kill")
@workspace_command
@click.argument("command_id")
@click.option(
    "-s",
    "--signal",
    "name",
    type=click.Choice(["INT", "TERM", "KILL", "HUP"]),
    default="TERM",
    show_default=True,
    help="TERM is followed by KILL after 5 s if it still runs.",
)
async def kill(ctx: click.Context, ws: Workspace, command_id: str, name: str) -> None:
    """Send a signal to every process of the live command COMMAND_ID."""
    sent = await ws.command(command_id).signal(name)  # type: ignore[arg-type]
    emit(
        ctx,
        sent,
        lambda: click.echo(f"{name} sent to {plural(sent.processes, 'process', 'processes')}"),
    )


@commands.command(name="attach-output")
@workspace_command
@click.argument("command_id")
async def attach_output(ctx: click.Context, ws: Workspace, command_id: str) -> None:
    """Follow the output of the live command COMMAND_ID from its start to its end; exit with
    its status."""

    def live(stream: str, chunk: bytes) -> None:
        out = sys.stdout.buffer if stream == "stdout" else sys.stderr.buffer
        out.write(chunk)
        out.flush()

    done = await ws.command(command_id).wait(None if ctx.obj["json"] else live)
    if ctx.obj["json"]:
        emit(ctx, done, lambda: None)
    sys.exit(min(done.exit_code if done.exit_code is not None else 1, 255))
