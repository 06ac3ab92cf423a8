"""``exec.run`` and ``exec.git`` on an executor: a checkout held (``checkouts``), the request
approved (a lock held by another session refuses it; a restricted workspace asks:
``approved``), run in the
sandbox within the checkout's quota, its output recorded (``output``), and what it changed
captured and committed to the log as one ``apply`` (``infra.exec.commit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
from nats.js import JetStreamContext

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import LIVE_POLL_MAX_BYTES, check_stdin
from contracts.paths import display, normalize
from contracts.subjects import Address, Origin, Subjects
from core.secrets import Secrets
from infra.approvals import Approvals
from infra.blobs import Blobs
from infra.exec import sandbox
from infra.exec.answer import Job, timeout_ms
from infra.exec.capture import Captured
from infra.exec.checkout import Checkout
from infra.exec.commit import changes_id, commit
from infra.exec.git import READ_ONLY_GIT, Credentials, run_git, sandbox_runner
from infra.exec.layers import Merged
from infra.exec.results import Output, audited, command_result
from infra.exec.sandbox import terminal
from infra.metrics import EXECUTOR_KILLS
from quill.client import Quill
from services.executor import quota
from services.executor.approved import Approved
from services.executor.checkouts import Checkouts
from services.executor.config import ExecutorConfig
from services.executor.egress import Egress
from services.executor.live import LiveCommand, LiveCommands, check_pty, new_handle
from services.executor.output import Recorder

log = logging.getLogger("quill.executor")


RunInShell = Callable[
    [Address, Origin, rq.RunCommand, Job, dict[str, Any]], Awaitable[tuple[int, rp.CommandResult]]
]
"""Where ``exec.run`` with ``shell`` goes (``services.executor.shells.Shells.run``, which runs
its commands with this module's capture and commit: handed in, not imported)."""


WHY = ("timeout", "memory", "background", "quota", "cancel")
KILLS = {why: EXECUTOR_KILLS.labels(why) for why in WHY}
"""``quill_executor_sandbox_kills_total`` by why, bound once."""


def count_kills(outcome: sandbox.Outcome) -> None:
    """Count what the sandbox killed of a command that ran: all of it at its timeout, a
    process the OOM killer took, what it left running when it ended."""
    if outcome.timed_out:
        KILLS["timeout"].inc()
    if outcome.oom_killed:
        KILLS["memory"].inc()
    if outcome.left_running:
        KILLS["background"].inc()


class Commands:
    """Runs commands and git actions for one executor (see the module docstring)."""

    egress: Egress | None = None
    """Which commands may reach which hosts through a proxy (set by the app); None: none."""

    def __init__(
        self,
        config: ExecutorConfig,
        provider: sandbox.Provider,
        checkouts: Checkouts,
        quill: Quill,
        blobs: Blobs,
        js: JetStreamContext,
        subjects: Subjects,
        *,
        credentials: Credentials,
        secrets: Secrets,
        scratch: Path,
        live: LiveCommands,
    ) -> None:
        self.config, self.provider, self.checkouts = config, provider, checkouts
        self.live = live
        """The commands that outlive their request (``yield_ms``): ``live``."""
        self.in_shell: RunInShell | None = None
        """Runs ``exec.run`` with ``shell`` (set by the executor: ``Shells.run``)."""
        self.quill, self.blobs, self.js, self.subjects = quill, blobs, js, subjects
        self.credentials, self.secrets, self.scratch = credentials, secrets, scratch
        self.approved = Approved(Approvals(js, subjects), quill, secrets)
        """A restricted workspace's commands parked for approval, and their outcome kept."""

    def _workdir(self, checkout: Checkout, workdir: str) -> str:
        path = normalize(workdir)
        is_directory = checkout.is_directory(path)  # never through a command's links
        if is_directory is None:
            raise QuillError(
                ErrorCode.FILE_NOT_FOUND, f"Directory not found: {display(path)}", {"path": path}
            )
        if not is_directory:
            raise QuillError(
                ErrorCode.NOT_A_DIRECTORY, f"Not a directory: {display(path)}", {"path": path}
            )
        return path

    def _limits(self, timeout_s: float, checkout: Checkout) -> sandbox.Limits:
        return sandbox.Limits(
            cpu_s=int(timeout_s) + 2,
            memory_bytes=self.config.memory_bytes,
            processes=self.config.processes,
            # no one file bigger than the checkout may hold, nor than the disk's room
            file_bytes=min(self.config.file_bytes, self.checkouts.file_bytes(checkout)),
        )

    async def _sandboxed(
        self,
        checkout: Checkout,
        spawn: sandbox.Spawn,
        on_output: sandbox.OnOutput | None,
        started: Callable[[sandbox.Live], Awaitable[None]] | None = None,
    ) -> sandbox.Outcome:
        """Run ``spawn``; ``started`` is told of it once it runs (a yielded command's)."""
        try:
            limits = self._limits(spawn.timeout_s, checkout)
            process = await self.provider.start(checkout.tree, spawn, limits, on_output)
            if started is not None:
                try:
                    await started(process)
                except BaseException:
                    process.signal(signal.SIGKILL)
                    with contextlib.suppress(Exception):
                        await process.wait()
                    raise
            return await process.wait()
        except sandbox.SandboxError as exc:
            raise self.checkouts.reserve.sandbox_failed(exc, "run the command") from exc

    async def _capture_and_commit(
        self,
        address: Address,
        origin: Origin,
        checkout: Checkout,
        base: int,
        message: str,
        live: Checkout | None,
        merged: Merged | None = None,
    ) -> rp.CapturedChanges:
        """Capture and commit what a command changed in ``checkout``; when it is the live
        one (``live``), save it and bring it past its own commit (a shell's saves and syncs
        its own: ``shells``)."""
        t0 = time.perf_counter()
        captured: Captured = await asyncio.to_thread(checkout.capture, merged)
        t1 = time.perf_counter()
        changes = await commit(
            self.quill,
            origin,
            address.tenant,
            address.workspace,
            checkout,
            captured,
            base,
            message,
            self.blobs,
        )
        t2 = time.perf_counter()
        if checkout is live:
            await asyncio.to_thread(checkout.save)
            # Past its own event: taken from the writer's answer when no other came between
            # (folded by the next command's sync, from the message it reads anyway), else
            # synced now (nothing made: the next command syncs before it runs).
            own = changes_id(origin.request_id)
            try:
                if changes.version != base and not checkout.answered(changes.version, own):
                    await checkout.sync()
            except Exception as exc:  # committed already; the next command syncs it
                log.warning("checkout of %s not synced after the commit: %r", address, exc)
        t3 = time.perf_counter()
        log.info(
            "capture %.1f ms, commit %.1f ms, sync %.1f ms",
            (t1 - t0) * 1e3,
            (t2 - t1) * 1e3,
            (t3 - t2) * 1e3,
        )
        return changes

    async def run(
        self,
        address: Address,
        origin: Origin,
        req: rq.RunCommand,
        job: Job,
        details: dict[str, Any],
    ) -> tuple[int, rp.CommandResult]:
        check_stdin(req.stdin)
        check_pty(req)
        if req.shell is not None:
            assert self.in_shell is not None
            return await self.in_shell(address, origin, req, job, details)
        if req.yield_ms is not None:
            self.live.check(address.tenant)
            details.update(yield_ms=req.yield_ms)
        self.described(req, details, workdir=req.workdir, env=sorted(req.env or {}))
        asked = [False]
        work = self._run(address, origin, req, job, details, asked)
        return await self.approved.keeping(address, origin, work, asked, rp.CommandResult)

    def described(self, req: rq.RunCommand, details: dict[str, Any], **more: Any) -> str:
        """``req``'s command as logged, audited and approved (its secrets redacted), put in
        ``details`` with ``more``; its stdin by its size, never its bytes."""
        shown = self.secrets.redact(req.command)[0]
        fed = f" < stdin ({len(req.stdin)} bytes)" if req.stdin is not None else ""
        details.update(command=shown[:4096], summary=f"$ {shown[:500]}{fed}", **more)
        if req.stdin is not None:
            details.update(stdin_bytes=len(req.stdin))
        return shown

    async def _run(
        self,
        address: Address,
        origin: Origin,
        req: rq.RunCommand,
        job: Job,
        details: dict[str, Any],
        asked: list[bool],
    ) -> tuple[int, rp.CommandResult]:
        shown = details["command"]
        async with (
            self.checkouts.hold(address) as live,
            self.checkouts.at(live, address, req) as checkout,
        ):
            asked[0] = await self.approved.check(live, address, origin, "exec.run", req)
            workdir = self._workdir(checkout, req.workdir)
            limits = checkout.limits
            ms = timeout_ms(req, limits.max_exec_ms)
            overlays = self.provider.overlays
            yielding = req.yield_ms is not None
            live_stdin = yielding and req.stdin is None  # a pipe, for exec.input
            spawn = sandbox.Spawn(
                argv=["bash", "-c", req.command],
                workdir=workdir,
                env=dict(req.env or {}),
                timeout_s=ms / 1000,
                output_cap=limits.max_output_bytes,
                stdin=req.stdin,
                # given none: tell if it waited to read some
                watch_stdin=req.stdin is None and not live_stdin,
                live_stdin=live_stdin,
                count_left=True,
                overlay=checkout.generation if overlays else None,
                egress=self.egress.grant(address, origin) if self.egress else None,
            )
            if req.pty is not None:
                spawn = terminal.in_terminal(spawn, req.pty.rows, req.pty.cols)
            command_id = new_handle(self.live.route) if yielding else origin.request_id
            output = Output(limits.max_output_bytes, self.secrets)
            recorder = Recorder(
                self.js,
                self.subjects,
                address.tenant,
                address.workspace,
                command_id,
                output=output,
                config=self.config.output,
                facts=known_facts(origin, details, checkout.version),
                live=yielding,
            )

            async def on_output(stream: sandbox.StreamName, chunk: bytes) -> None:
                await job.output(stream, chunk)
                await recorder.feed(stream, chunk)

            base = checkout.version
            await asyncio.to_thread(checkout.begin)
            merged: list[Merged | None] = []
            held: list[LiveCommand] = []
            timer: list[asyncio.Task[None]] = []

            async def started(process: sandbox.Live) -> None:
                """A yielded command runs: held (``exec.input``/``signal`` reach it), its
                ``start`` kept, its early answer due at ``yield_ms``."""
                assert req.yield_ms is not None
                command = LiveCommand(
                    handle=command_id,
                    tenant=address.tenant,
                    workspace=address.workspace,
                    command=shown,
                    workdir=workdir,
                    actor=origin.actor,
                    started=recorder.facts["started"] if recorder.facts else datetime.now(UTC),
                    process=process,
                    stdin_open=live_stdin,
                    pty=req.pty is not None,
                )
                self.live.add(command)
                held.append(command)
                await recorder.begin({})
                cap = min(limits.max_output_bytes, LIVE_POLL_MAX_BYTES)
                due = self._yield(req.yield_ms, base, recorder, job, cap)
                timer.append(asyncio.create_task(due))

            try:
                outcome = await self.checkouts.guarded(
                    checkout,
                    self._sandboxed(checkout, spawn, on_output, started if yielding else None),
                    merged=merged if overlays else None,
                )
            except quota.Stopped:
                KILLS["quota"].inc()
                self._forget(held, timer)
                raise
            except asyncio.CancelledError:  # the executor is stopping: the command is killed
                KILLS["cancel"].inc()
                self._forget(held, timer)  # lost: its ``end`` is never kept
                raise
            except BaseException:
                self._forget(held, timer)
                raise
            for task in timer:  # it ended before its yield: answered as a one-shot command
                task.cancel()
            for command in held:  # no process any more: no input, no signal, no slot of it
                command.process = None
            count_kills(outcome)
            if checkout is live:  # the next command here finds a sandbox started
                limits_next = self._limits(spawn.timeout_s, checkout)
                again = checkout.generation if overlays else None
                self.provider.warm(checkout.tree, limits_next, again)
            finishing = asyncio.ensure_future(recorder.finish(outcome))  # alongside the capture
            changes: rp.CapturedChanges | None = None
            failed: str | None = None
            try:
                changes = await self._capture_and_commit(
                    address,
                    origin,
                    checkout,
                    base,
                    f"$ {shown}",
                    live,
                    merged[0] if merged else None,
                )
            except QuillError as exc:
                failed = str(exc.code)
                raise
            finally:
                await finishing
                await recorder.end(changes, failed)  # what it committed: kept with its output
                self._forget(held, timer)
        audited(outcome, details, output.redacted | job.redacted)
        details.update(committed=changes.committed, changed=changes.total)
        details.update(background_killed=outcome.left_running, stdin_read=outcome.stdin_read)
        result = command_result(
            outcome, output, changes, command_id=command_id, output_kept=recorder.ok
        )
        return changes.version, result

    async def _yield(
        self, yield_ms: int, base: int, recorder: Recorder, job: Job, max_bytes: int
    ) -> None:
        """At ``yield_ms``, answer a command still running: ``running``, its id, its output so
        far and a cursor (read back as ``exec.poll`` reads it); it runs on."""
        await asyncio.sleep(yield_ms / 1000)
        await recorder.flush()
        _, t, w, handle = recorder.where
        poll = rq.CommandPoll(command_id=handle, max_bytes=max_bytes)
        status = await self.live.status(Address("exec", t, w, "poll"), poll)
        if not status.running:  # ended meanwhile: its own answer follows
            return
        empty = rp.CapturedChanges(
            base_version=base,
            committed=False,
            version=base,
            paths=[],
            total=0,
            conflicts=[],
            skipped=[],
            ignored=[],
        )
        result = rp.CommandResult(
            exit_code=-1,
            stdout=status.stdout,
            stderr=status.stderr,
            stdout_truncated=status.more,
            stderr_truncated=False,
            stdout_bytes=0,
            stderr_bytes=0,
            duration_ms=yield_ms,
            timed_out=False,
            changes=empty,
            command_id=handle,
            output_kept=recorder.ok,
            running=True,
            cursor=status.cursor,
        )
        await job.answer_early(base, result)

    def _forget(self, held: list[LiveCommand], timer: list[asyncio.Task[None]]) -> None:
        """A yielded command ended (or was killed): no longer held, no early answer due."""
        for task in timer:
            task.cancel()
        for command in held:
            self.live.remove(command)
        held.clear()

    async def git(
        self,
        address: Address,
        origin: Origin,
        req: rq.GitCommand,
        _job: Job,  # git streams no output: taken for the one signature of the exec ops
        details: dict[str, Any],
    ) -> tuple[int, rp.GitResult]:
        details.update(action=req.action, workdir=req.workdir, summary=f"git {req.action}")
        if req.url is not None:
            details["url"] = without_userinfo(req.url)
        asked = [False]
        work = self._git(address, origin, req, details, asked)
        return await self.approved.keeping(address, origin, work, asked, rp.GitResult)

    async def _git(
        self,
        address: Address,
        origin: Origin,
        req: rq.GitCommand,
        details: dict[str, Any],
        asked: list[bool],
    ) -> tuple[int, rp.GitResult]:
        async with (
            self.checkouts.hold(address) as live,
            self.checkouts.at(live, address, req) as checkout,
        ):
            asked[0] = await self.approved.check(live, address, origin, "exec.git", req)
            limits = checkout.limits
            ms = timeout_ms(req, limits.max_exec_ms)
            runner = sandbox_runner(self.provider, self._limits(ms / 1000, checkout))
            base = checkout.version
            mutating = req.action not in READ_ONLY_GIT
            if mutating:
                await asyncio.to_thread(checkout.begin)
            message = f"git {req.action}" + (f": {req.message}" if req.message else "")
            try:
                git = run_git(
                    msgspec.structs.replace(req, timeout_ms=ms),
                    checkout=checkout.tree,
                    run=runner,
                    actor=origin.actor,
                    credentials=self.credentials,
                    output_cap=limits.max_output_bytes,
                    scratch=self.scratch,
                    owner=self.provider.owner,
                )
                result = await self.checkouts.guarded(checkout, git, also=(self.scratch,))
            except quota.Stopped:
                raise  # nothing of it is kept
            except QuillError:
                if mutating:  # what git did before failing (an index update) is kept too
                    await self._capture_and_commit(address, origin, checkout, base, message, live)
                raise
            changes = None
            if mutating:
                changes = await self._capture_and_commit(
                    address, origin, checkout, base, message, live
                )
        details.update(committed=bool(changes and changes.committed))
        version = changes.version if changes is not None else base
        return version, msgspec.structs.replace(result, changes=changes)


def known_facts(origin: Origin, details: dict[str, Any], base: int) -> dict[str, Any]:
    """The fields of a command's ``rp.CommandFacts`` known before it runs (``details``: its
    audit record's, the command line redacted as audited)."""
    return {
        "command": details["command"],
        "workdir": details["workdir"],
        "actor": origin.actor,
        "session": origin.session,
        "run": origin.run,
        "started": datetime.now(UTC),
        "base_version": base,
    }


def without_userinfo(url: str) -> str:
    """``url`` with any ``user:password@`` masked (it is audited, and may carry a secret)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))
