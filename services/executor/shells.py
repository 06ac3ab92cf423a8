"""Shells: one long-lived sandbox running bash, in a checkout of its own, where commands run one
at a time and what one leaves (cwd, exported variables, functions, ``/tmp``, background
processes) the next finds (``exec.shell_open``, ``exec.run`` with ``shell``,
``exec.checkpoint``, ``exec.shell_close``).

The sandbox a shell runs, its command server and the framing of what it writes back:
``infra.exec.sandbox.shell_server``.

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

Ids and routing: ``s`` + the holder's route + a random part (``live.new_handle``); any
executor forwards a request on a shell it does not hold to the holder
(``<root>.exechold.<route>.<t>.<w>.<op>``, the message as it came, answered by the holder to
the client's inbox). A shell's ``start`` record in ``WS_OUTPUT`` (updated with the version it
last committed) tells a lost shell (``SHELL_LOST``, with that version) from an unknown one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import signal
import stat
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from nats.js.errors import NotFoundError

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import LIVE_POLL_MAX_BYTES
from contracts.subjects import STREAM_OUTPUT, Address, Origin
from core.evolve import LockState
from infra.exec import sandbox
from infra.exec.answer import Job, timeout_ms
from infra.exec.capture import file_sig, key_of
from infra.exec.checkout import Checkout
from infra.exec.results import Output, audited, command_result
from infra.exec.sandbox.ports import Ports
from infra.exec.sandbox.shell_server import (
    LOOP,
    PRIVATE_TMP,
    SERVER_PROCESSES,
    SUPERVISOR,
    Running,
)
from infra.safefs import Dir, parent_of
from services.executor import quota
from services.executor.commands import known_facts
from services.executor.live import LiveCommand, new_handle, route_of
from services.executor.output import Recorder

if TYPE_CHECKING:
    from services.executor.commands import Commands

log = logging.getLogger("quill.executor.shells")

SHELLS = ".shells"
"""Under ``<data>/checkouts``: each shell's checkout (removed when it closes, and at a start)."""
IDLE_S = 30 * 60.0
"""A shell is closed after this long without a command (``ShellOpen.idle_timeout_ms``)."""
LIFETIME_S = 24 * 3600.0
"""A shell is closed this long after it opened, whatever it does."""
PER_WORKSPACE = 8
"""Shells one executor holds open on one workspace at most."""
CONFLICT = "conflict: changed in the workspace too; the shell keeps its own version, uncommitted"
BACKGROUND = "[background]"
"""How the message of a commit of background changes starts."""
SHELL_ID = re.compile(r"s[0-9a-f]{12}[A-Za-z0-9]{1,40}")


@dataclass
class Shell:
    """An open shell, on the executor holding it."""

    id: str
    tenant: str
    workspace: str
    actor: str | None
    session: str | None
    run: str | None
    checkout: Checkout
    idle_s: float
    started: datetime
    expires: datetime
    process: sandbox.Live | None = None
    ended: asyncio.Task[sandbox.Outcome] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    running: Running | None = None
    last_used: float = field(default_factory=time.monotonic)
    last_used_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    background_commits: int = 0
    dropped: int = 0
    """Bytes background processes wrote while no command ran (dropped)."""
    closing: bool = False
    ports: Ports | None = None
    own: int = SERVER_PROCESSES
    """Processes of its sandbox that are not the user's: the server's and the provider's
    around it (``Provider.wrappers``), left out of what a close reports killed."""
    """Its loopback ports, as the gateway reaches them (``services.executor.ports``)."""

    def touch(self) -> None:
        self.last_used, self.last_used_at = time.monotonic(), datetime.now(UTC)

    @property
    def stopped(self) -> quota.Stopped | None:
        """Why its sandbox was stopped over its quota or the disk's reserve, if it was."""
        ended = self.ended
        if ended is None or not ended.done() or ended.cancelled():
            return None
        exc = ended.exception()
        return exc if isinstance(exc, quota.Stopped) else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.ended is not None and not self.ended.done()

    async def on_output(self, stream: sandbox.StreamName, chunk: bytes) -> None:
        running = self.running
        if running is None:
            self.dropped += len(chunk)
            return
        await running.feed(stream, chunk)

    def listed(self) -> rp.LiveShell:
        return rp.LiveShell(
            shell=self.id,
            actor=self.actor,
            started=self.started,
            last_used=self.last_used_at,
            version=self.checkout.version,
            running=self.running.handle if self.running is not None else None,
        )


def now_utc() -> datetime:
    return datetime.now(UTC)


class Shells:
    """The shells this executor holds (see the module docstring)."""

    def __init__(self, commands: Commands, data_dir: Path) -> None:
        self.commands = commands
        self.home = data_dir / "checkouts" / SHELLS
        self.held: dict[str, Shell] = {}
        self._reaper: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifetime
    async def start(self) -> None:
        """Remove what shells an earlier executor left (their sandboxes died with it)."""
        await self.commands.checkouts._discard(self.home)
        self._reaper = asyncio.create_task(self._reap())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for shell in list(self.held.values()):
            await self._end(shell)

    async def _reap(self) -> None:
        """Close shells idle past their timeout or past their lifetime."""
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for shell in list(self.held.values()):
                idle = shell.running is None and now - shell.last_used > shell.idle_s
                old = datetime.now(UTC) >= shell.expires
                if (idle or old or not shell.alive) and not shell.closing:
                    why = "idle" if idle else ("lifetime" if old else "ended")
                    log.info("shell %s closed (%s)", shell.id, why)
                    asyncio.ensure_future(self._close_quietly(shell))

    async def _close_quietly(self, shell: Shell) -> None:
        try:
            await self.close_shell(shell)
        except Exception as exc:
            log.warning("shell %s not closed cleanly: %r", shell.id, exc)

    def count(self, tenant: str) -> int:
        return sum(1 for s in self.held.values() if s.tenant == tenant)

    def listed(
        self, tenant: str, workspace: str
    ) -> tuple[list[rp.LiveCommand], list[rp.LiveShell]]:
        commands, shells = [], []
        for s in self.held.values():
            if (s.tenant, s.workspace) != (tenant, workspace):
                continue
            shells.append(s.listed())
            if s.running is not None:
                commands.append(
                    rp.LiveCommand(
                        command_id=s.running.handle,
                        command=s.running.command,
                        workdir="",
                        actor=s.actor,
                        started=s.last_used_at,
                        shell=s.id,
                    )
                )
        return commands, shells

    def find(self, address: Address, shell_id: str) -> Shell | None:
        shell = self.held.get(shell_id)
        if shell is None or (shell.tenant, shell.workspace) != (address.tenant, address.workspace):
            return None
        return shell

    def held_here(self, shell_id: str) -> bool:
        return route_of(shell_id) == self.commands.live.route

    async def why_not(self, address: Address, shell_id: str) -> QuillError:
        """``SHELL_LOST`` (its start kept, no end: its executor died with it) or
        ``SHELL_NOT_FOUND``."""
        subject = self.commands.subjects.cmdout(
            address.tenant, address.workspace, shell_id, "start"
        )
        try:
            msg = await self.commands.js.get_last_msg(STREAM_OUTPUT, subject, direct=True)
            record = json.loads(msg.data or b"{}")
        except (NotFoundError, ValueError):
            record = None
        except Exception as exc:
            raise QuillError(
                ErrorCode.UNAVAILABLE, f"The shell's record could not be read ({exc!r}); retry"
            ) from None
        facts = record.get("shell") if isinstance(record, dict) else None
        if isinstance(facts, dict) and not facts.get("closed"):
            return QuillError(
                ErrorCode.SHELL_LOST,
                f"Shell {shell_id} is lost: the executor holding it is gone, and its processes "
                "with it; what it committed stays",
                {"shell": shell_id, "version": facts.get("version")},
            )
        return QuillError(
            ErrorCode.SHELL_NOT_FOUND,
            f"No open shell {shell_id} in this workspace",
            {"shell": shell_id},
        )

    async def _record(self, shell: Shell, closed: bool = False) -> None:
        """The shell's ``start`` record: it exists, its last committed version, closed."""
        subjects = self.commands.subjects
        subject = subjects.cmdout(shell.tenant, shell.workspace, shell.id, "start")
        facts = {
            "shell": {"version": shell.checkout.version, "closed": closed, "actor": shell.actor}
        }
        try:
            await self.commands.js.publish(subject, json.dumps(facts).encode(), timeout=5)
        except Exception as exc:
            log.warning("shell %s record not kept: %r", shell.id, exc)

    # ------------------------------------------------------------------ ops
    async def open(
        self, address: Address, origin: Origin, req: rq.ShellOpen, details: dict[str, Any]
    ) -> tuple[int, rp.ShellOpened]:
        commands = self.commands
        tenant = address.tenant
        live_count = sum(1 for c in commands.live.held.values() if c.tenant == tenant)
        if live_count + self.count(tenant) >= commands.live.per_tenant:
            raise QuillError(
                ErrorCode.SIZE_LIMIT_EXCEEDED,
                f"Tenant {tenant!r} has {self.count(tenant)} shells and {live_count} live commands "
                "on this executor, the most it may: close one (exec.shell_close)",
                {"shells": self.count(tenant), "max_live_commands": commands.live.per_tenant},
            )
        key = (address.tenant, address.workspace)
        here = [s for s in self.held.values() if (s.tenant, s.workspace) == key]
        if len(here) >= PER_WORKSPACE:
            raise QuillError(
                ErrorCode.SIZE_LIMIT_EXCEEDED,
                f"Workspace has {len(here)} shells open, the most it may: close one",
                {"shells": len(here), "max_shells": PER_WORKSPACE},
            )
        shell_id = "s" + new_handle(commands.live.route)[1:]
        details.update(shell=shell_id, workdir=req.workdir, env=sorted(req.env or {}))
        details.update(summary=f"shell open {shell_id}")
        checkout = commands.checkouts.new(self.home / shell_id, address)
        try:
            await asyncio.to_thread(checkout.open)
            await commands.checkouts.sync(checkout)
            if checkout.version == 0:
                raise QuillError(
                    ErrorCode.WORKSPACE_NOT_FOUND,
                    f"Workspace not found: {address.tenant}/{address.workspace}",
                    {"tenant": address.tenant, "workspace": address.workspace},
                )
            if checkout.manifest.trust == "restricted":
                raise QuillError(
                    ErrorCode.DENIED,
                    "Shells are not offered on a restricted workspace (each command needs an "
                    "approval: exec.run without shell)",
                    {"trust": "restricted"},
                )
            lock = checkout.manifest.lock  # a locked workspace: the lock holder's only
            if lock is not None and LockState(*lock).held_by_other(origin.session, now_utc()):
                raise LockState(*lock).refusal()
            workdir = commands._workdir(checkout, req.workdir)
            idle_s = (req.idle_timeout_ms or IDLE_S * 1000) / 1000
            now = datetime.now(UTC)
            lifetime = LIFETIME_S
            shell = Shell(
                id=shell_id,
                tenant=address.tenant,
                workspace=address.workspace,
                actor=origin.actor,
                session=origin.session,
                run=origin.run,
                checkout=checkout,
                idle_s=idle_s,
                started=now,
                expires=now + timedelta(seconds=lifetime),
            )
            shell.ports = Ports(checkout.home / "ports")
            argv = ["python3", "-I", "-S", "-c", SUPERVISOR, LOOP]
            if commands.provider.name == "local" and os.geteuid() == 0:
                tree = str(checkout.tree)
                argv = ["unshare", "--mount", "--", "bash", "-c", PRIVATE_TMP, "-", tree, *argv]
            spawn = sandbox.Spawn(
                argv=argv,
                workdir=workdir,
                env=dict(req.env or {}),
                timeout_s=lifetime,
                output_cap=1,
                live_stdin=True,
                count_left=True,
                egress=commands.egress.grant(address, origin) if commands.egress else None,
                ports=shell.ports,
            )
            limits = commands._limits(lifetime, checkout)
            shell.own = SERVER_PROCESSES + commands.provider.wrappers(spawn)
            try:
                shell.process = await commands.provider.start(
                    checkout.tree, spawn, limits, shell.on_output
                )
            except sandbox.SandboxError as exc:
                raise QuillError(
                    ErrorCode.EXECUTION_FAILED, f"The sandbox could not start the shell: {exc}"
                ) from exc
        except BaseException:
            await commands.checkouts._discard(checkout.home)
            raise
        # for its whole life, the checkout counts against the checkouts budget and is held to
        # its quota and the disk's reserve, as a one-shot command's is while it runs: past
        # them the sandbox is killed, its changes since the last commit are discarded
        # (``quota.Stopped``), and the shell is closed
        guarded = commands.checkouts.guarded(checkout, shell.process.wait())
        shell.ended = asyncio.ensure_future(guarded)
        self.held[shell_id] = shell
        await self._record(shell)
        return checkout.version, rp.ShellOpened(
            shell=shell_id,
            version=checkout.version,
            idle_timeout_ms=int(idle_s * 1000),
            expires=shell.expires,
        )

    def _shell(self, address: Address, shell_id: str) -> Shell:
        shell = self.find(address, shell_id)
        if shell is None or shell.closing:
            raise QuillError(
                ErrorCode.SHELL_NOT_FOUND,
                f"No open shell {shell_id} in this workspace",
                {"shell": shell_id},
            )
        return shell

    @contextlib.asynccontextmanager
    async def _taken(self, shell: Shell, queue: bool, wait_s: float) -> Any:
        """The shell's one command at a time: ``BUSY`` naming the running one, or waited for."""
        if shell.lock.locked() and not queue:
            running = shell.running
            raise QuillError(
                ErrorCode.BUSY,
                f"Shell {shell.id} runs a command already"
                + (f" ({running.handle}: {running.command[:200]})" if running else "")
                + "; send with queue to wait for it",
                {
                    "shell": shell.id,
                    "command_id": running.handle if running else None,
                    "command": running.command[:500] if running else None,
                },
            )
        try:
            await asyncio.wait_for(shell.lock.acquire(), wait_s)
        except TimeoutError:
            raise QuillError(
                ErrorCode.TIMEOUT, f"Shell {shell.id} stayed busy", {"shell": shell.id}
            ) from None
        try:
            if shell.closing:
                raise QuillError(
                    ErrorCode.SHELL_NOT_FOUND, f"Shell {shell.id} closed", {"shell": shell.id}
                )
            shell.touch()
            yield
        finally:
            shell.running = None
            shell.touch()
            shell.lock.release()

    async def checkpoint(
        self, address: Address, origin: Origin, req: rq.ShellCheckpoint, details: dict[str, Any]
    ) -> tuple[int, rp.ShellCheckpointed]:
        shell = self._shell(address, req.shell)
        details.update(shell=shell.id, summary=f"checkpoint {shell.id}")
        async with self._taken(shell, True, 60.0):
            changes, kept = await self._background(address, shell, origin)
        details.update(committed=changes.committed, changed=changes.total)
        return changes.version, rp.ShellCheckpointed(
            shell=shell.id, background=changes, kept_conflicts=kept
        )

    async def close(
        self, address: Address, origin: Origin, req: rq.ShellClose, details: dict[str, Any]
    ) -> tuple[int, rp.ShellClosed]:
        shell = self._shell(address, req.shell)
        details.update(shell=shell.id, summary=f"shell close {shell.id}")
        if shell.running is not None and shell.process is not None:
            shell.process.signal(signal.SIGKILL)  # the command it runs ends with it
        return await self.close_shell(shell)

    async def close_shell(self, shell: Shell) -> tuple[int, rp.ShellClosed]:
        """End the sandbox (every process of it), then commit what it left."""
        shell.closing = True
        killed = await self._end(shell)
        changes: rp.CapturedChanges | None = None
        try:
            async with shell.lock:
                if shell.stopped is None:  # else its changes were discarded: none to commit
                    address = Address("exec", shell.tenant, shell.workspace, "shell_close")
                    origin = self._origin(shell)
                    changes, _ = await self._background(address, shell, origin, sync=False)
        finally:
            self.held.pop(shell.id, None)
            await self._record(shell, closed=True)
            await self.commands.checkouts._discard(shell.checkout.home)
        version = changes.version if changes is not None else shell.checkout.version
        return version, rp.ShellClosed(shell=shell.id, background=changes, killed=killed)

    async def _end(self, shell: Shell) -> int:
        """Kill every process of the shell's sandbox and wait for it; how many it had left."""
        process, ended = shell.process, shell.ended
        if process is None or ended is None:
            return 0
        # every process of the sandbox gets it (bwrap: but its init and shim), the server's
        # two (the supervisor and its bash) among them; before its stdin closes (the server
        # would end, and with it the sandbox: what it had left would be gone uncounted)
        hit = process.signal(signal.SIGKILL) if not ended.done() else 0
        process.close_stdin()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(ended), sandbox.GRACE_S + 5)
        return max(0, hit - shell.own)

    def _origin(self, shell: Shell) -> Origin:
        shell.background_commits += 1
        return Origin(
            request_id=f"{shell.id}.bg{shell.background_commits}",
            actor=shell.actor,
            session=shell.session,
            run=shell.run,
        )

    async def _background(
        self, address: Address, shell: Shell, origin: Origin, sync: bool = True
    ) -> tuple[rp.CapturedChanges, list[str]]:
        """Commit what the shell's tree holds changed since its last commit (its background
        processes'), attributed to the shell; then bring it to the workspace's latest."""
        checkout = shell.checkout
        base = checkout.version
        await asyncio.to_thread(checkout.begin)
        bg = self._origin(shell)  # the shell's, not the request's
        changes = await self.commands._capture_and_commit(
            address, bg, checkout, base, f"{BACKGROUND} shell {shell.id}", None
        )
        kept: list[str] = []
        if sync:
            kept = await self._sync(shell, changes)
        else:
            await asyncio.to_thread(checkout.save)
        await self._record(shell)
        return changes, kept

    async def _sync(self, shell: Shell, *results: rp.CapturedChanges) -> list[str]:
        """Bring the shell's checkout to the workspace's latest version, keeping the shell's
        own version of each path in conflict (moved aside, put back, withheld)."""
        checkout = shell.checkout
        conflicted = {c.path for r in results for c in r.conflicts}
        conflicted |= {p for p, (_, why) in checkout.manifest.present.items() if why == CONFLICT}
        stash = checkout.home / "kept"
        moved = await asyncio.to_thread(_stash, checkout, stash, sorted(conflicted))
        try:
            await self.commands.checkouts.sync(checkout)
        finally:
            kept = await asyncio.to_thread(_unstash, checkout, stash, moved)
            await asyncio.to_thread(checkout.save)
        return kept

    async def run(
        self,
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
        commands = self.commands
        shell = self._shell(address, req.shell)
        shown = commands.secrets.redact(req.command)[0]
        details.update(shell=shell.id, command=shown[:4096], workdir="", summary=f"$ {shown[:500]}")
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
        async with self._taken(shell, req.queue, ms / 1000):
            if not shell.alive:
                raise await self._lost_here(shell)
            shell.running = running  # named by a BUSY answer from now on
            background, kept = await self._background(address, shell, origin)
            checkout = shell.checkout
            if req.min_version is not None and req.min_version > checkout.version:
                raise QuillError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"Version {req.min_version} does not exist (the latest is {checkout.version})",
                    {"version": req.min_version, "latest_version": checkout.version},
                )
            await commands._approved(checkout, address, origin, "exec.run", req)
            base = checkout.version
            await asyncio.to_thread(checkout.begin)
            data = req.command.encode()
            started = time.monotonic()
            timed_out = False
            if recorder is not None and req.yield_ms is not None:
                await self._held_live(shell, address, origin, running, recorder, held)
                cap = min(checkout.limits.max_output_bytes, LIVE_POLL_MAX_BYTES)
                due = commands._yield(req.yield_ms, base, recorder, job, cap)
                timer.append(asyncio.create_task(due))
            try:
                assert shell.process is not None and shell.ended is not None
                fed = req.stdin
                head = f"{token} {len(data)} {len(fed) if fed is not None else -1}\n"
                await shell.process.write(head.encode() + data + (fed or b""), 10.0)
                done = asyncio.ensure_future(running.ended.wait())
                await asyncio.wait(
                    {done, shell.ended}, timeout=ms / 1000, return_when=asyncio.FIRST_COMPLETED
                )
                if not done.done():
                    done.cancel()
                    timed_out = not shell.ended.done()
                    await self._end(shell)  # past its timeout (or exit): the shell ends
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
                    await recorder.end(changes, failed)
                commands._forget(held, timer)
            assert changes is not None
            kept += [k for k in await self._sync(shell, changes) if k not in kept]
            await self._record(shell)
        if not shell.alive and not shell.closing:
            asyncio.ensure_future(self._close_quietly(shell))
        audited(outcome, details, output.redacted | job.redacted)
        details.update(committed=changes.committed, changed=changes.total)
        kept_output = recorder.ok if recorder is not None else False
        result = command_result(
            outcome, output, changes, command_id=handle, output_kept=kept_output
        )
        bg = background if background.committed or background.conflicts else None
        return changes.version, _with(result, shell=shell.id, background=bg, kept_conflicts=kept)

    async def _held_live(
        self,
        shell: Shell,
        address: Address,
        origin: Origin,
        running: Running,
        recorder: Recorder,
        held: list[LiveCommand],
    ) -> None:
        """A yielded command of the shell runs: listed as a live command (``exec.poll`` reads
        its output; ``exec.input`` finds its stdin closed; ``exec.signal`` KILL ends the
        shell), its ``start`` kept."""
        command = LiveCommand(
            handle=running.handle,
            tenant=address.tenant,
            workspace=address.workspace,
            command=running.command,
            workdir="",
            actor=origin.actor,
            started=datetime.now(UTC),
            process=InShell(shell),
            stdin_open=False,
        )
        self.commands.live.add(command)
        held.append(command)
        await recorder.begin({})

    async def _lost_here(self, shell: Shell) -> QuillError:
        asyncio.ensure_future(self._close_quietly(shell))
        return QuillError(
            ErrorCode.SHELL_NOT_FOUND,
            f"Shell {shell.id} has ended (a command ran exit, or it was killed)",
            {"shell": shell.id, "version": shell.checkout.version},
        )


class InShell:
    """A yielded shell command as ``exec.input``/``exec.signal`` see it (``sandbox.Live``):
    its stdin is closed (given whole, or ``/dev/null``); KILL ends the shell, as a timeout
    does (its processes cannot be told from the shell's); other signals are refused."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell

    async def write(self, data: bytes, timeout_s: float) -> int:
        return 0

    def close_stdin(self) -> None:
        pass

    def signal(self, signum: int) -> int:
        process = self.shell.process
        if signum != signal.SIGKILL:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                "A command in a shell takes KILL only (it ends the shell); close the shell, or "
                "run the command without shell to signal it alone",
                {"shell": self.shell.id},
            )
        if process is None or not self.shell.alive:
            return 0
        return max(0, process.signal(signal.SIGKILL) - SERVER_PROCESSES)

    async def wait(self) -> sandbox.Outcome:
        raise NotImplementedError


def _with(result: rp.CommandResult, **fields: Any) -> rp.CommandResult:
    return msgspec.structs.replace(result, **fields)


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
