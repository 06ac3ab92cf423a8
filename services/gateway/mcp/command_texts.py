"""What the MCP command tools say to a model: a command's result and what it changed, a
command still running and how to go on with it (``read_command_output``, ``write_stdin``,
``send_signal``), output kept and dropped, git. The file tools' texts and the error texts are
in ``texts``."""

from __future__ import annotations

from contracts import replies as rp
from core.words import plural
from services.gateway.mcp.texts import stamp


def changes_text(changes: rp.CapturedChanges | None) -> str:
    """What a command or git action did to the workspace's files."""
    if changes is None:
        return ""
    lines: list[str] = []
    if changes.committed:
        shown = ", ".join(f"{p.path} ({p.change})" for p in changes.paths[:20])
        more = changes.total - min(len(changes.paths), 20)
        lines.append(
            f"Committed {plural(changes.total, 'changed path')} as version {changes.version}: "
            f"{shown}{f' and {more} more' if more > 0 else ''}"
        )
    for c in changes.conflicts:
        lines.append(f"Not committed: {c.path} ({c.reason}; someone changed it meanwhile)")
    for s in changes.skipped:
        lines.append(f"Not committed: {s.path} ({s.reason})")
    if changes.ignored:
        total = max(changes.ignored_total, len(changes.ignored))
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(changes.ignored_reasons.items()))
        more = total - len(changes.ignored)
        lines.append(
            f"Ignored (kept out of the workspace's history): {plural(total, 'path')}"
            f"{f' ({why})' if why else ''}: {', '.join(changes.ignored)}"
            f"{f' and {more} more' if more > 0 else ''}"
        )
    for warning in changes.warnings:
        lines.append(f"Warning: {warning}")
    if changes.error:
        lines.append(f"Nothing committed: {changes.error}")
    return "\n".join(lines)


def command_text(r: rp.CommandResult) -> str:
    """``execute_command``'s answer: exit code, both streams (each labelled; a long one as its
    head and tail, with what is left out between and the exact call that reads it), what the
    command left running or tried to read, what changed."""
    parts = [f"Exit code: {r.exit_code}" + (" (timed out)" if r.timed_out else "")]
    if r.timed_out:
        parts.append(
            f"The command ran past its timeout ({r.duration_ms / 1000:.1f}s): it was stopped "
            "(SIGTERM, then SIGKILL); the output below is what it wrote until then."
        )
    streams: tuple[tuple[str, str, str, int, int, int, bool], ...] = (
        ("stdout", r.stdout, r.stdout_tail, r.stdout_omitted_bytes, r.stdout_omitted_offset,
         r.stdout_bytes, r.stdout_truncated),
        ("stderr", r.stderr, r.stderr_tail, r.stderr_omitted_bytes, r.stderr_omitted_offset,
         r.stderr_bytes, r.stderr_truncated),
    )  # fmt: skip
    for name, head, tail, omitted, offset, total, truncated in streams:
        if omitted:
            parts.append(
                f"--- {name} ({total} bytes: the first and the last part; {omitted} bytes "
                f"in the middle left out) ---\n{head}"
                + _omitted_note(r, name, omitted, offset)
                + f"\n{tail.rstrip(chr(10))}"
            )
        elif truncated:  # only its beginning (a local workspace's command)
            parts.append(
                f"--- {name} ---\n{head.rstrip(chr(10))}\n[{name} truncated: the first "
                f"{len(head.encode())} of {total} bytes shown; the rest was not kept: run the "
                "command again with its output redirected to a file (cmd > out.log 2>&1) and "
                "read the file]"
            )
        elif head:
            parts.append(f"--- {name} ---\n{head.rstrip(chr(10))}")
    if r.stdin_read:
        parts.append(
            "Note: the command tried to read standard input, which is closed (a prompt such "
            "as `read -p` or input() cannot be answered): it got end of file. Give the input "
            "in the command (`echo yes | cmd`, `cmd < answers.txt`) or use a non-interactive "
            "option (`-y`, `--yes`)."
        )
    if r.background_killed:
        n = r.background_killed
        parts.append(
            f"Note: the command left {n} process{'' if n == 1 else 'es'} running in "
            "the background, killed when it ended: nothing runs between commands. Start a "
            "server and what uses it in one command (`server & sleep 1; curl ...`)."
        )
    changed = changes_text(r.changes)
    if changed:
        parts.append(changed)
    return "\n\n".join(parts)


RUNNING_SHOWN = 32 * 1024
"""Characters of each stream a still-running command's answer shows at most (its last ones)."""


def going_on(command_id: str, cursor: str) -> str:
    """How to continue with a command still running."""
    return (
        f'Call read_command_output with command_id="{command_id}" and cursor="{cursor}" to '
        "wait for more output (and its exit code once it ends), write_stdin to type into it, "
        "send_signal to stop it."
    )


def _live_streams(stdout: str, stderr: str) -> list[str]:
    """Both streams of a live command's answer, labelled; a long one as its last part."""
    parts = []
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        if len(text) > RUNNING_SHOWN:
            left_out = len(text[:-RUNNING_SHOWN].encode())
            text = f"[... the first {left_out} bytes left out ...]\n{text[-RUNNING_SHOWN:]}"
        if text:
            parts.append(f"--- {name} ---\n{text.rstrip(chr(10))}")
    return parts


def running_text(r: rp.CommandResult) -> str:
    """``execute_command``'s answer when the command still runs at ``yield_ms``: its id, its
    output so far and how to go on."""
    said_so = f"Command {r.command_id} is still running ({r.duration_ms / 1000:.0f} s)."
    streams = _live_streams(r.stdout, r.stderr)
    parts = [said_so + (" Output so far:" if streams else " No output so far."), *streams]
    if r.stdout_truncated:
        parts.append("[more output is kept after this: read on with the cursor]")
    parts.append(going_on(r.command_id, r.cursor))
    return "\n\n".join(parts)


def command_or_running_text(r: rp.CommandResult) -> str:
    """``execute_command``'s answer: as one-shot when it ended, else ``running_text``."""
    return running_text(r) if r.running else command_text(r)


def dropped_text(n: int) -> str:
    """A poll's note of output that is not kept (``CommandStatus.dropped``)."""
    return (
        f"Output dropped: {n} bytes after your cursor are no longer kept (only a bounded "
        "part of a command's output is); what follows comes after them."
    )


def poll_text(r: rp.CommandStatus) -> str:
    """``read_command_output``'s answer with a cursor: the output after it, whether the command
    still runs and how to go on, or how it ended and what it committed."""
    streams = _live_streams(r.stdout, r.stderr)
    if r.dropped:
        streams.insert(0, dropped_text(r.dropped))
    if r.running:
        head = f"Command {r.command_id} is still running."
        head += " New output:" if streams else " No new output yet."
        return "\n\n".join([head, *streams, going_on(r.command_id, r.cursor)])
    head = f"Command {r.command_id} has ended. Exit code: {r.exit_code}"
    head += " (timed out)" if r.timed_out else ""
    parts = [head, *streams]
    if r.more:
        parts.append(
            "[more output is kept: call read_command_output with "
            f'command_id="{r.command_id}" and cursor="{r.cursor}" for it]'
        )
    if r.version is not None:
        parts.append(f"Committed {plural(r.changed, 'changed path')} as version {r.version}")
    elif r.error:
        parts.append(f"Nothing committed: {r.error}")
    else:
        parts.append("It changed no files.")
    return "\n\n".join(parts)


def input_text(command_id: str, sent: int, r: rp.InputWritten) -> str:
    """``write_stdin``'s answer."""
    text = f"Wrote {plural(r.written, 'byte')} to the standard input of command {command_id}"
    if r.written < sent:
        text += f" ({sent - r.written} more were not read within 5 s: send them again later)"
    if r.closed:
        text += "; its standard input is closed now (a read gets end of file)"
    return (
        f"{text}. Call read_command_output with its command_id and your last cursor for what "
        "it answers."
    )


def signal_text(r: rp.SignalSent) -> str:
    """``send_signal``'s answer."""
    then = " (KILL follows in 5 s if it still runs)" if r.signal == "TERM" else ""
    return (
        f"Sent {r.signal} to command {r.command_id} ({plural(r.processes, 'process')}){then}. "
        "Call read_command_output with its command_id and your last cursor for how it ends."
    )


def live_commands_text(r: rp.LiveCommands) -> str:
    """``list_commands``'s answer: each command still running, or none."""
    if not r.commands:
        return "No commands are running in this workspace."
    lines = [f"Commands running in this workspace ({len(r.commands)}):", ""]
    for c in r.commands:
        stdin = ", stdin open" if c.stdin_open else ""
        lines.append(
            f"{c.command_id}: started {stamp(c.started)} by {c.actor or '-'} in "
            f"{c.workdir or '.'}{stdin}: {c.command}"
        )
    lines += [
        "",
        'read_command_output with a command_id and cursor="" reads one\'s output from its start; '
        "send_signal stops one.",
    ]
    return "\n".join(lines)


def head_and_tail(head: str, tail: str, omitted: int) -> str:
    """A stream as one text: its head, what is left out, its tail (WAP's ``stdout``)."""
    if not omitted:
        return head
    return f"{head}[... {omitted} bytes left out ...]\n{tail}"


def _omitted_note(r: rp.CommandResult, name: str, omitted: int, offset: int) -> str:
    """What is left out of a long stream and the call that reads it."""
    where = f"bytes {offset}-{offset + omitted - 1} of {name}"
    if not r.output_kept:
        return (
            f"[... {omitted} bytes left out ({where}); the whole output was not kept: run "
            "the command again with its output redirected to a file (cmd > out.log 2>&1) "
            "and read the file ...]"
        )
    stream = "" if name == "stdout" else ', stream="stderr"'
    return (
        f"[... {omitted} bytes left out ({where}). To read them: "
        f'read_command_output(command_id="{r.command_id}"{stream}, offset={offset}), '
        "then again from the offset each page says; kept for an hour ...]"
    )


def command_output_text(r: rp.CommandOutput) -> str:
    """``read_command_output``'s answer: the page, where it lies and how to read on."""
    end = r.offset + r.length
    head = f"--- {r.stream} of command {r.command_id}, bytes {r.offset}-{end - 1} ---"
    if not r.length:
        head = f"--- {r.stream} of command {r.command_id}: nothing from byte {r.offset} ---"
    notes = []
    stream = "" if r.stream == "stdout" else ', stream="stderr"'
    if r.more and r.complete:
        notes.append(
            f"[{r.kept_bytes - end} more bytes (of {r.kept_bytes}): "
            f'read_command_output(command_id="{r.command_id}"{stream}, offset={end})]'
        )
    elif not r.complete:
        notes.append(
            "[the command is still running: more may come; "
            f'read_command_output(command_id="{r.command_id}"{stream}, offset={end})]'
        )
    else:
        notes.append(f"[end of the {r.stream} ({r.kept_bytes} bytes)]")
    if r.complete and r.total_bytes > r.kept_bytes:
        notes.append(
            f"[the command wrote {r.total_bytes} bytes: those past byte {r.kept_bytes} were "
            "not kept (the last part is in the command's own answer)]"
        )
    text = r.text + ("" if r.text.endswith("\n") or not r.text else "\n")
    return f"{head}\n{text}" + "\n".join(notes)


def git_text(r: rp.GitResult) -> str:
    """``git``'s answer, by action."""
    if r.status is not None:
        st = r.status
        track = f", {st.upstream}: {st.ahead} ahead, {st.behind} behind" if st.upstream else ""
        lines = [f"On branch {st.branch or '(detached HEAD)'}{track}"]
        for title, entries in (("Staged", st.staged), ("Not staged", st.unstaged)):
            if entries:
                lines.append(f"{title}:")
                lines += [f"  {f.status}: {f.path}" for f in entries]
        if st.untracked:
            lines.append("Untracked:")
            lines += [f"  {p}" for p in st.untracked]
        if len(lines) == 1:
            lines.append("Nothing to commit, working tree clean")
        text = "\n".join(lines)
    elif r.log is not None:
        text = (
            "\n".join(f"{c.sha[:10]} {stamp(c.at)} {c.author}: {c.subject}" for c in r.log)
            or "No commits"
        )
    elif r.branches is not None:
        text = "\n".join(("* " if b == r.branch else "  ") + b for b in r.branches)
    elif r.commit is not None:
        text = f"Committed {r.commit[:10]} on {r.branch or 'detached HEAD'}"
    elif r.action == "diff":
        text = (
            f"Staged changes:\n{r.staged_diff or '(none)'}\n\n"
            f"Unstaged changes:\n{r.unstaged_diff or '(none)'}"
        )
    else:
        text = r.output.strip() or f"git {r.action}: done"
    if r.output_truncated:
        text += "\n[output truncated]"
    changed = changes_text(r.changes)
    return f"{text}\n\n{changed}" if changed else text
