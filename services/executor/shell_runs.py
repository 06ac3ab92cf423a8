"""A command in a shell, and what a shell commits: ``exec.run`` with ``shell`` (its command
written to the shell's server, its output recorded, its changes committed as a one-shot
command's), and the background processes' changes committed before each command, at a
checkpoint and at the close, with the shell's checkout synced keeping its conflicts.

Apart from ``shells`` (which opens, finds, routes, reaps and closes shells): the flow of one
command in a shell and of a shell's commits, on a ``Shell`` that module holds.

The checkout. A shell has its own (``<data>/checkouts/.shells/<id>/``, an ``infra.exec``
``Checkout`` of the workspace built as any from a reader's tree and the log): its background
processes write into it while other commands of the workspace run in the live one. Before
each command, what it holds that differs from what it last committed is captured and
committed (attributed to the shell, its message ``[background] ...``), then it is synced to
the workspace's latest version; after the command its changes are committed as a one-shot
command's (``Commands._capture_and_commit``). A path changed both in the shell and in the
workspace since is a conflict of the commit (the writer keeps the workspace's change): the
shell keeps its own version, moved aside while the sync writes the workspace's and put back
after, uncommitted (``Manifest.present``/``local``: capture withholds it until it changes
again) and named in the reply (``kept_conflicts``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import stat
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import msgspec

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError, no_version
from contracts.limits import LIVE_POLL_MAX_BYTES
from contracts.subjects import Address, Origin
from infra.exec import sandbox
from infra.exec.answer import Job, timeout_ms
from infra.exec.capture import file_sig, key_of
from infra.exec.checkout import Checkout
from infra.exec.results import Output, audited, command_result
from infra.exec.sandbox.shell_server import Running
from infra.safefs import Dir, parent_of
from services.executor.commands import Commands, known_facts
from services.executor.live import INPUT_WAIT_S, LiveCommand, new_handle
from services.executor.output import Recorder
from services.executor.shell_state import Shell


class Shells(Protocol):
    """What a command in a shell needs of the registry holding it
    (``services.executor.shells.Shells``, which calls this module: named here, not
    imported)."""

    commands: Commands

    def _shell(self, address: Address, shell_id: str) -> Shell: ...

    def _taken(
        self, shell: Shell, queue: bool, wait_s: float
    ) -> contextlib.AbstractAsyncContextManager[Any]: ...

    async def _end(self, shell: Shell) -> int: ...

    async def _record(self, shell: Shell, closed: bool = False) -> None: ...

    def close_later(self, shell: Shell) -> None: ...


log = logging.getLogger("quill.executor.shells")

CONFLICT = "conflict: changed in the workspace too; the shell keeps its own version, uncommitted"
BACKGROUND = "[background]"
NO_STDIN, LIVE_STDIN = -1, -2
"""What a command's header says of its stdin, besides its length when given whole
(``shell_server``): ``/dev/null``, or a FIFO fed as ``exec.input`` comes."""
"""How the message of a commit of background changes starts."""


def background_origin(shell: Shell) -> Origin:
    shell.background_commits += 1
    return Origin(
        request_id=f"{shell.id}.bg{shell.background_commits}",
        actor=shell.actor,
        session=shell.session,
        run=shell.run,
    )


async def commit_background(
    shells: Shells, address: Address, shell: Shell, origin: Origin, sync: bool = True
) -> tuple[rp.CapturedChanges, list[str]]:
    """Commit what the shell's tree holds changed since its last commit (its background
    processes'), attributed to the shell; then bring it to the workspace's latest. The log's
    last message is read while the tree is walked: when nothing was committed and the
    workspace has not moved, there is nothing to sync."""
    checkout = shell.checkout
    base = checkout.version
    bg = background_origin(shell)  # the shell's, not the request's
    behind = asyncio.ensure_future(_behind(checkout)) if sync else None
    try:
        changes = await shells.commands._capture_and_commit(
            address, bg, checkout, base, f"{BACKGROUND} shell {shell.id}", None
        )
    except BaseException:
        if behind is not None:
            behind.cancel()
            with contextlib.suppress(BaseException):
                await behind  # its own failure, if any, is this one's
        raise
    kept: list[str] = []
    if behind is not None:
        moved = await behind
        if moved or changes.committed or changes.conflicts or checkout.version != base:
            kept = await _sync(shells, shell, changes)
        else:
            kept = _still_kept(checkout)
    await _recorded(shells, shell)
    return changes, kept


async def _behind(checkout: Checkout) -> bool:
    try:
        return await checkout.behind()
    except Exception as exc:
        raise QuillError(ErrorCode.UNAVAILABLE, f"The log is not reachable: {exc}") from exc


async def _recorded(shells: Shells, shell: Shell) -> None:
    """The shell's record says the version it is at (its last commit's, or the workspace's
    it synced to): kept again when that moved."""
    if shell.checkout.known != shell.recorded:
        await shells._record(shell)


def _still_kept(checkout: Checkout) -> list[str]:
    """The paths the shell keeps in conflict (put back by earlier syncs, unchanged since)."""
    present = checkout.manifest.present
    return sorted(k for k, (_, why) in present.items() if why == CONFLICT and k[:1] != "\0")


async def _sync(shells: Shells, shell: Shell, *results: rp.CapturedChanges) -> list[str]:
    """Bring the shell's checkout to the workspace's latest version, keeping the shell's
    own version of each path in conflict (moved aside, put back, withheld)."""
    checkout = shell.checkout
    conflicted = {c.path for r in results for c in r.conflicts}
    conflicted |= {p for p, (_, why) in checkout.manifest.present.items() if why == CONFLICT}
    stash = checkout.home / "kept"
    moved: list[tuple[str, str]] = []
    if conflicted:
        moved = await asyncio.to_thread(_stash, checkout, stash, sorted(conflicted))
    try:
        await shells.commands.checkouts.sync(checkout)
    finally:
        kept = await asyncio.to_thread(_unstash, checkout, stash, moved) if moved else []
    return kept


async def run(
    shells: Shells,
    address: Address,
    origin: Origin,
    req: rq.RunCommand,
    job: Job,
    details: dict[str, Any],
) -> tuple[int, rp.CommandResult]:
    """``exec.run`` with ``shell``, on the executor holding it."""
    assert req.shell is not None
    for name, given in (
        ("workdir", req.workdir),
        ("env", req.env),
        ("version", req.version),
    ):
        if given:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"{name} is not taken with shell (cd or export in it)",
                {"field": name},
            )
    commands = shells.commands
    shell = shells._shell(address, req.shell)
    shown = commands.described(req, details, shell=shell.id, workdir="")
    ms = timeout_ms(req, shell.checkout.limits.max_exec_ms)
    output = Output(shell.checkout.limits.max_output_bytes, commands.secrets)
    token = secrets.token_hex(16)

    yielding = req.yield_ms is not None
    handle = new_handle(commands.live.route) if yielding else origin.request_id
    recorder: Recorder | None = None
    if yielding:  # its output kept as it comes, for exec.poll (as a live command's)
        recorder = Recorder(
            commands.js,
            commands.subjects,
            address.tenant,
            address.workspace,
            handle,
            output=output,
            config=commands.config.output,
            facts=known_facts(origin, details, shell.checkout.version),
            live=True,
        )

    async def on_output(stream: sandbox.StreamName, chunk: bytes) -> None:
        if recorder is not None:
            await recorder.feed(stream, chunk)
        else:
            output.feed(stream, chunk)
        await job.output(stream, chunk)

    running = Running(handle, shown[:4096], token, on_output)
    held: list[LiveCommand] = []
    timer: list[asyncio.Task[None]] = []
    ending: list[tuple[rp.CapturedChanges | None, str | None]] = []
    try:
        async with shells._taken(shell, req.queue, ms / 1000):
            if not shell.alive:
                raise await _lost_here(shells, shell)
            shell.running = running  # named by a BUSY answer from now on
            background, kept = await commit_background(shells, address, shell, origin)
            checkout = shell.checkout
            if req.min_version is not None and req.min_version > checkout.version:
                raise no_version(req.min_version, checkout.version)
            await commands.approved.check(checkout, address, origin, "exec.run", req)
            base = checkout.version
            data = req.command.encode()
            started = time.monotonic()
            timed_out = False
            if recorder is not None and req.yield_ms is not None:
                live_stdin = req.stdin is None
                await _held_live(
                    shells, shell, address, origin, running, recorder, held, live_stdin
                )
                cap = min(checkout.limits.max_output_bytes, LIVE_POLL_MAX_BYTES)
                due = commands._yield(req.yield_ms, base, recorder, job, cap)
                timer.append(asyncio.create_task(due))
            try:
                assert shell.process is not None and shell.ended is not None
                fed = req.stdin
                given = len(fed) if fed is not None else (LIVE_STDIN if held else NO_STDIN)
                head = f"{token} {len(data)} {given}\n"
                await shell.process.write(head.encode() + data + (fed or b""), 10.0)
                done = asyncio.ensure_future(running.ended.wait())
                await asyncio.wait(
                    {done, shell.ended}, timeout=ms / 1000, return_when=asyncio.FIRST_COMPLETED
                )
                if not done.done():
                    done.cancel()
                    timed_out = not shell.ended.done()
                    await shells._end(shell)  # past its timeout (or exit): the shell ends
                    await running.flush()
            except BaseException:
                commands._forget(held, timer)
                raise
            finally:
                shell.running = None
            for task in timer:  # it ended before its yield: answered as a one-shot command
                task.cancel()
            if shell.stopped is not None:  # over the quota: nothing of it is kept
                commands._forget(held, timer)
                raise shell.stopped
            code = running.status
            if code is None:
                code = 124 if timed_out else (await shell.ended).exit_code
            outcome = sandbox.Outcome(
                exit_code=code,
                stdout=b"",
                stderr=b"",
                stdout_bytes=running.counts["stdout"],
                stderr_bytes=running.counts["stderr"],
                timed_out=timed_out,
                duration_ms=int((time.monotonic() - started) * 1000),
            )
            finishing = None
            if recorder is not None:  # alongside the capture
                finishing = asyncio.ensure_future(recorder.finish(outcome))
            else:
                output.finish(outcome)
            changes: rp.CapturedChanges | None = None
            failed: str | None = None
            try:
                changes = await commands._capture_and_commit(
                    address, origin, checkout, base, f"$ {shown}", None
                )
            except QuillError as exc:
                failed = str(exc.code)
                raise
            finally:
                if recorder is not None and finishing is not None:
                    await finishing
                    ending.append((changes, failed))
            assert changes is not None
            if changes.committed or changes.conflicts:  # synced past its own commit
                kept += [k for k in await _sync(shells, shell, changes) if k not in kept]
            else:  # nothing made: the next command's sync brings what others made
                kept += [k for k in _still_kept(checkout) if k not in kept]
            await _recorded(shells, shell)
        if not shell.alive and not shell.closing:
            shells.close_later(shell)
        audited(outcome, details, output.redacted | job.redacted)
        details.update(committed=changes.committed, changed=changes.total)
        kept_output = recorder.ok if recorder is not None else False
        result = command_result(
            outcome, output, changes, command_id=running.handle, output_kept=kept_output
        )
        bg = background if background.committed or background.conflicts else None
        result = msgspec.structs.replace(result, shell=shell.id, background=bg, kept_conflicts=kept)
        return changes.version, result

    finally:
        # its end is told once the shell is free again: a client that waits for the end
        # and sends the next command finds the shell taken no more (no BUSY)
        if recorder is not None:
            for changes, failed in ending:
                await recorder.end(changes, failed)
        commands._forget(held, timer)


async def _held_live(
    shells: Shells,
    shell: Shell,
    address: Address,
    origin: Origin,
    running: Running,
    recorder: Recorder,
    held: list[LiveCommand],
    stdin_open: bool,
) -> None:
    """A yielded command of the shell runs: listed as a live command (``exec.poll`` reads
    its output; ``exec.input`` writes to its stdin unless ``stdin`` was given whole;
    ``exec.signal`` reaches its processes: ``InShell``), its ``start`` kept."""
    command = LiveCommand(
        handle=running.handle,
        tenant=address.tenant,
        workspace=address.workspace,
        command=running.command,
        workdir="",
        actor=origin.actor,
        started=datetime.now(UTC),
        process=InShell(shell, running),
        stdin_open=stdin_open,
    )
    shells.commands.live.add(command)
    held.append(command)
    await recorder.begin({})


async def _lost_here(shells: Shells, shell: Shell) -> QuillError:
    shells.close_later(shell)
    return QuillError(
        ErrorCode.SHELL_NOT_FOUND,
        f"Shell {shell.id} has ended (a command ran exit, or it was killed)",
        {"shell": shell.id, "version": shell.checkout.known},
    )


class InShell:
    """A yielded shell command as ``exec.input``/``exec.signal`` see it (``sandbox.Live``),
    through the shell's server (``shell_server``): input goes to the command's stdin (a FIFO
    the server feeds; closed at ``eof``), a signal to the command's processes (the shell's
    children forked since it began, and theirs: never the server, the shell's bash, or what
    earlier commands left running). Each is answered by the server (``Running.acks``). KILL
    that finds no process of the command (a builtin such as ``read`` runs in the shell
    itself) ends the shell, as a timeout does."""

    def __init__(self, shell: Shell, running: Running) -> None:
        self.shell, self.running = shell, running
        self.lock = asyncio.Lock()
        """One frame (and its answer) at a time."""
        self.tasks: set[asyncio.Future[Any]] = set()

    async def _send(self, frame: bytes) -> None:
        process = self.shell.process
        if process is None or not self.shell.alive or self.running.ended.is_set():
            raise self._ended()
        await process.write(frame, INPUT_WAIT_S)

    async def _answer(self, kind: str, timeout_s: float | None = None) -> int:
        """The server's next answer (of ``kind``), or COMMAND_ENDED once the command ended."""
        got = asyncio.ensure_future(self.running.acks.get())
        ended = asyncio.ensure_future(self.running.ended.wait())
        waits: set[asyncio.Future[Any]] = {got, ended}
        if self.shell.ended is not None:
            waits.add(self.shell.ended)
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            if not got.done():
                got.cancel()
        if not got.done() or got.cancelled():
            if self.running.ended.is_set() or not self.shell.alive:
                raise self._ended()
            raise TimeoutError
        answered, value = got.result()
        if answered != kind:
            log.warning("shell %s: answer %r where %r was due", self.shell.id, answered, kind)
        return value

    def _ended(self) -> QuillError:
        handle = self.running.handle
        return QuillError(
            ErrorCode.COMMAND_ENDED,
            f"Command {handle} has ended (exec.poll says how)",
            {"command_id": handle},
        )

    async def write(self, data: bytes, timeout_s: float) -> int:
        """Write ``data`` to the command's stdin; what it did not take within ``timeout_s``
        is dropped (the bytes written, as a one-shot command's pipe answers)."""
        if not data:
            return 0
        async with self.lock:
            await self._send(b"!i %d\n" % len(data) + data)
            try:
                return await self._answer("i", timeout_s)
            except TimeoutError:
                await self._send(b"!c\n")
                written = await self._answer("i")
                await self._answer("c")
                return written

    def close_stdin(self) -> None:
        self._later(self._close())

    async def _close(self) -> None:
        async with self.lock:
            with contextlib.suppress(QuillError):
                await self._send(b"!e\n")

    async def relay_signal(self, signum: int) -> int:
        """Send ``signum`` to the command's processes; how many got it."""
        async with self.lock:
            await self._send(b"!s %d\n" % signum)
            sent = await self._answer("s", INPUT_WAIT_S)
        if sent == 0 and signum == signal.SIGKILL:  # it runs in the shell itself
            process = self.shell.process
            if process is not None and self.shell.alive:
                return max(0, process.signal(signal.SIGKILL) - self.shell.own)
        return sent

    def signal(self, signum: int) -> int:
        """``relay_signal`` in the background (a TERM's KILL after its grace)."""
        self._later(self.relay_signal(signum))
        return 0

    def _later(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(_quietly(self.tasks))

    async def wait(self) -> sandbox.Outcome:
        raise NotImplementedError


def _quietly(tasks: set[asyncio.Future[Any]]) -> Callable[[asyncio.Future[Any]], None]:
    def done(task: asyncio.Future[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("shell frame not sent: %r", task.exception())

    return done


def _stash(checkout: Checkout, stash: Path, paths: list[str]) -> list[tuple[str, str]]:
    """Move each of ``paths`` (a file or a link, never a directory) out of the shell's tree
    into ``stash``; the (path, name in the stash) moved."""
    if not paths:
        return []
    stash.mkdir(exist_ok=True)
    moved: list[tuple[str, str]] = []
    with Dir.open(checkout.tree, checkout.owner) as root, Dir.open(stash) as into:
        for n, path in enumerate(paths):
            with parent_of(root, path) as found:
                if found is None:
                    continue
                directory, name = found
                st = directory.lstat(name)
                if st is None or stat.S_ISDIR(st.st_mode):
                    continue
                directory.rename(name, str(n), into)
                moved.append((path, str(n)))
    return moved


def _unstash(checkout: Checkout, stash: Path, moved: list[tuple[str, str]]) -> list[str]:
    """Put what ``_stash`` moved back over what the sync wrote; each is withheld from capture
    until it changes again (``Manifest.present``/``local``). The paths put back."""
    kept: list[str] = []
    if not moved:
        return kept
    manifest = checkout.manifest
    with Dir.open(checkout.tree, checkout.owner) as root, Dir.open(stash) as source:
        for path, name in moved:
            try:
                with parent_of(root, path, create=True) as found:
                    if found is None:
                        continue
                    directory, leaf = found
                    st = directory.lstat(leaf)
                    if st is not None and stat.S_ISDIR(st.st_mode):
                        directory.remove(leaf)  # the workspace made a directory there
                    source.rename(name, leaf, directory)
                    st = directory.lstat(leaf)
            except OSError as exc:
                log.warning("shell conflict %s not put back: %r", path, exc)
                continue
            if st is None:
                continue
            key, shown = key_of(path)
            manifest.present[key] = (shown, CONFLICT)
            manifest.local[key] = file_sig(st)
            kept.append(path)
    return kept
