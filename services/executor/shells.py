"""Shells: one long-lived sandbox running bash, in a checkout of its own, where commands run one
at a time and what one leaves (cwd, exported variables, functions, ``/tmp``, background
processes) the next finds (``exec.shell_open``, ``exec.run`` with ``shell``,
``exec.checkpoint``, ``exec.shell_close``).

The sandbox a shell runs, its command server and the framing of what it writes back:
``infra.exec.sandbox.shell_server``.

Running a command in a shell, and committing its work and its background processes' (the
shell's own checkout, its conflicts kept): ``shell_runs``.

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
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nats.js.errors import NotFoundError

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError, no_workspace
from contracts.subjects import STREAM_OUTPUT, Address, Origin
from core.evolve import LockState
from infra.exec import sandbox
from infra.exec.sandbox import common as sandbox_common
from infra.exec.sandbox.ports import Ports
from infra.exec.sandbox.shell_server import (
    LOOP,
    PRIVATE_TMP,
    SERVER_PROCESSES,
    SUPERVISOR,
)
from infra.exec.watch import MAX_WATCHES, TreeWatch
from infra.loops import Loop
from services.executor import shell_runs
from services.executor.live import new_handle, route_of
from services.executor.shell_state import Shell, now_utc

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
SHELL_ID = re.compile(r"s[0-9a-f]{12}[A-Za-z0-9]{1,40}")


def _reap_failed(exc: Exception) -> None:
    log.exception("closing idle shells failed; trying again in a second")


class Shells:
    """The shells this executor holds (see the module docstring)."""

    def __init__(self, commands: Commands, data_dir: Path) -> None:
        self.commands = commands
        self.home = data_dir / "checkouts" / SHELLS
        self.held: dict[str, Shell] = {}
        self._reaper = Loop(
            "shell reaper", self._reap, every=1.0, wait_first=True, failed=_reap_failed
        )
        self._closing: set[asyncio.Future[None]] = set()
        """Shells being closed in the background (``close_later``)."""
        self.watching = True
        """Whether a shell's checkout is watched (``infra.exec.watch``: its commands and its
        quota cost what changed), or walked whole at each capture and quota sample (what the
        tests compare the watch with)."""
        self.max_watches = MAX_WATCHES
        """Watches (directories) one shell's checkout may hold; past it, walked."""

    # ------------------------------------------------------------------ lifetime
    async def start(self) -> None:
        """Remove what shells an earlier executor left (their sandboxes died with it)."""
        await self.commands.checkouts._discard(self.home)
        self._reaper.start()

    async def stop(self) -> None:
        await self._reaper.stop()
        for shell in list(self.held.values()):
            await self._end(shell)
            if shell.checkout.watch is not None:
                shell.checkout.watch.close()

    async def _reap(self) -> None:
        """Close shells idle past their timeout or past their lifetime (each second)."""
        now = time.monotonic()
        for shell in list(self.held.values()):
            idle = shell.running is None and now - shell.last_used > shell.idle_s
            old = datetime.now(UTC) >= shell.expires
            if (idle or old or not shell.alive) and not shell.closing:
                why = "idle" if idle else ("lifetime" if old else "ended")
                log.info("shell %s closed (%s)", shell.id, why)
                self.close_later(shell)

    def close_later(self, shell: Shell) -> None:
        """Close ``shell`` in the background, the task kept until it ends (the event loop
        holds only a weak reference to a task: one nobody keeps may vanish mid-way)."""
        task = asyncio.ensure_future(self._close_quietly(shell))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

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
        shell.recorded = shell.checkout.known
        facts = {"shell": {"version": shell.recorded, "closed": closed, "actor": shell.actor}}
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
        checkout.persist = False  # never opened again: discarded at its close and our start
        try:
            await asyncio.to_thread(checkout.open)
            await commands.checkouts.sync(checkout)
            if checkout.version == 0:
                raise no_workspace(address.tenant, address.workspace)
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
            if self.watching:  # before its sandbox can write: every change of it is seen
                checkout.watch = TreeWatch(checkout.tree, self.max_watches)
                await asyncio.to_thread(checkout.watch.arm, True)
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
                raise commands.checkouts.reserve.sandbox_failed(exc, "start the shell") from exc
        except BaseException:
            if checkout.watch is not None:
                checkout.watch.close()
            await commands.checkouts._discard(checkout.home)
            raise
        # for its whole life, the checkout counts against the checkouts budget and is held to
        # its quota and the disk's reserve, as a one-shot command's is while it runs: past
        # them the sandbox is killed, its changes since the last commit are discarded
        # (``quota.Stopped``), and the shell is closed
        guarded = commands.checkouts.guarded(checkout, shell.process.wait())
        context = sandbox_common.outlives_reply()  # its cgroup removed when it ends
        shell.ended = asyncio.get_running_loop().create_task(guarded, context=context)
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
            if shell.checkout.watch is not None:  # asked for: a whole walk, mmap writes too
                shell.checkout.watch.walk_next()
            changes, kept = await shell_runs.commit_background(self, address, shell, origin)
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
                    if shell.checkout.watch is not None:  # the last capture walks it whole
                        shell.checkout.watch.walk_next()
                    address = Address("exec", shell.tenant, shell.workspace, "shell_close")
                    origin = shell_runs.background_origin(shell)
                    changes, _ = await shell_runs.commit_background(
                        self, address, shell, origin, sync=False
                    )
        finally:
            self.held.pop(shell.id, None)
            if shell.checkout.watch is not None:
                shell.checkout.watch.close()
            await self._record(shell, closed=True)
            await self.commands.checkouts._discard(shell.checkout.home)
        version = changes.version if changes is not None else shell.checkout.known
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

    run = shell_runs.run
    """``exec.run`` with ``shell``, on the executor holding it (``shell_runs.run``)."""
