"""One bwrap sandbox: bwrap's process, its descriptors, and its command from go to end.

Only ``bwrap`` uses this module: ``BwrapProvider`` starts a sandbox (``Box``, bwrap started by
``BwrapProcess``), ``wait_init`` reads its init and maps its users, ``BwrapLive`` hands it
its command (``shim``) and sees it through.

Limits. Where a cgroup can be made (``cgroups``), each sandbox gets its own: ``memory_bytes``
for all its processes and /tmp together (the OOM killer ends one of them past it: exit 137,
``Outcome.oom_killed`` and ``OOM_NOTE`` in stderr) and ``processes`` for all its processes and
threads; the rlimits apply as well (``prlimit(2)`` on the waiting shim).

Timeout: SIGTERM to every process of the sandbox's PID namespace but its init (rescanned every
0.1 s during the grace, each process signalled once), then SIGKILL to the init, which takes the
whole namespace with it; the same SIGKILL ends whatever a finished command left behind. The
command's exit status comes from ``--json-status-fd``; a sandbox that never ran the command
(bad bind, no user namespaces) raises ``SandboxError`` with bwrap's message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import os
import resource
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.exec.layers import MERGED
from infra.exec.sandbox import cgroups as cg
from infra.exec.sandbox import common, overlay, proctree
from infra.exec.sandbox.interface import Limits, OnOutput, Outcome, SandboxError, Spawn
from infra.exec.sandbox.mounter import Mounter
from infra.exec.sandbox.stdin import StdinPipe, StdinWatch
from infra.exec.sandbox.users import map_users

log = logging.getLogger(__name__)

SETUP_S = 10.0
"""How long a sandbox may take to start (its init, its shim ready) past the command's deadline."""

OOM_NOTE = (
    "\nquill: out of memory: the sandbox reached its memory limit ({mib} MiB, /tmp included)"
    " and the kernel killed {n} of its processes\n"
)
"""Added to the stderr of a command whose sandbox the OOM killer took processes from."""

_SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="quill-bwrap")
"""The one thread that starts bwrap, for the life of the process: bwrap's ``--die-with-parent``
(PR_SET_PDEATHSIG) fires when the *thread* that forked it ends, so it must be one that ends
with the process only (a pool that retires idle threads would kill running sandboxes)."""


class Fds:
    """File descriptors to close once, whatever happens (a second close could hit a descriptor
    another thread has opened since)."""

    def __init__(self) -> None:
        self._open: set[int] = set()

    def add(self, fd: int) -> int:
        self._open.add(fd)
        return fd

    def pipe(self) -> tuple[int, int]:
        r, w = os.pipe()
        return self.add(r), self.add(w)

    def take(self, fd: int) -> int:
        """Hand ``fd`` over to whoever closes it."""
        self._open.discard(fd)
        return fd

    def close(self, fd: int | None) -> None:
        if fd is not None and fd in self._open:
            self._open.discard(fd)
            os.close(fd)

    def close_all(self) -> None:
        for fd in list(self._open):
            self.close(fd)


class Box:
    """One bwrap sandbox and what the provider holds of it: started by ``BwrapProvider._launch``,
    given its command by ``go``, ended by ``end`` and ``close``."""

    def __init__(self, checkout: Path) -> None:
        self.checkout = checkout
        self.fds = Fds()
        self.pipes = proctree.Output(0, None)
        """Readers of bwrap's status and the shim's report."""
        self.cgroup: cg.Cgroup | None = None
        self.watch: StdinWatch | None = None
        self.pipe: StdinPipe | None = None
        """A live command's stdin (``Spawn.live_stdin``): its write end."""
        self.proc: BwrapProcess | None = None
        self.init: tuple[int, int, int] | None = None
        """A pidfd of the sandbox's init, its host pid and its PID namespace's inode."""
        self.status: asyncio.StreamReader | None = None
        self.report: asyncio.StreamReader | None = None
        self.out_r = self.err_r = self.go_w = self.spec = -1
        self._shim: int | None = None
        self._report = b""
        self._ended = self._closed = False
        self.layer: Path | None = None
        """Its overlay's layer (``Spawn.overlay``): removed with it unless handed over."""
        self.mounter: Mounter | None = None
        """Who mounted its overlay (unmounted when it ends)."""
        self._mounted: Path | None = None
        self.lower: tuple[int, int] | None = None
        """(device, inode) of the checkout's directory its overlay is mounted over."""

    def hand_over(self) -> Path | None:
        """The layer, now the caller's (``Outcome.layer``; unmounted when the sandbox is
        closed, before the caller merges it)."""
        layer, self.layer = self.layer, None
        self._mounted = layer
        return layer

    async def ready(self, deadline: float) -> int | None:
        """The host pid of the shim once it waits for its command; None if it never will."""
        if self._shim is not None or self.init is None or self.report is None:
            return self._shim
        loop = asyncio.get_running_loop()
        try:
            line = await asyncio.wait_for(
                self.report.readline(), max(SETUP_S, deadline - loop.time())
            )
        except TimeoutError:
            return None
        children = proctree.children(self.init[1])
        if line == b"R\n" and len(children) == 1:
            self._shim = children[0]
        return self._shim

    def binds_checkout(self) -> bool:
        """Whether the waiting shim's directory (/workspace) is the checkout's directory as it
        is now: a reset replaces it (its mount pins the inode, so the same inode, still linked,
        is the same directory). Over an overlay: whether the checkout's directory is the one
        it was mounted over, and its layer still there."""
        if self._shim is None:
            return False
        if self.layer is not None:
            try:
                st = os.stat(self.checkout)
            except OSError:
                return False
            return (st.st_dev, st.st_ino) == self.lower and self.layer.is_dir()
        try:
            here, there = os.stat(self.checkout), os.stat(f"/proc/{self._shim}/cwd")
        except OSError:
            return False
        return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino) and there.st_nlink > 0

    async def end(self) -> list[dict[str, Any]]:
        """SIGKILL the sandbox's init (the kernel takes every process of it along), reap bwrap;
        bwrap's status reports (the command's exit)."""
        if self._ended:
            return []
        self._ended = True
        self.fds.close(self.go_w)  # a shim still waiting gets end of file and exits
        if self.init is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.init[0], signal.SIGKILL)
            await proctree.wait_exited([self.init[0]], common.GRACE_S)
        if self.proc is not None:
            await common.reap(self.proc)
        reports: list[dict[str, Any]] = []
        if self.status is not None:
            with contextlib.suppress(TimeoutError):
                rest = await asyncio.wait_for(self.status.read(), common.DRAIN_S)
                reports = [json.loads(line) for line in rest.splitlines() if line.strip()]
        if self.report is not None:
            with contextlib.suppress(TimeoutError):
                self._report = await asyncio.wait_for(self.report.read(), common.DRAIN_S)
        return reports

    def reported(self) -> tuple[str | None, int]:
        """What the shim reported once ended: (the directory it could not enter, or None;
        the processes it found left, 0 if none or it was killed)."""
        lines = self._report.decode(errors="replace").splitlines()
        for line in lines:
            if line.startswith("E "):
                return line[2:], 0
        counts = [int(line) for line in lines if line.strip().isdigit()]
        return None, max(counts[-1], 0) if counts else 0

    async def close(self, later: common.Later | None = None) -> int:
        """End it if it is not yet, free what is left (its stdin watch, descriptors, cgroup);
        how many processes the OOM killer took from it. With ``later``, a cgroup that holds no
        process any more (read here: nothing of the sandbox runs on once this returns) is
        removed from there."""
        if self._closed:
            return 0
        self._closed = True
        try:
            await self.end()
        finally:
            if self.watch is not None:
                await self.watch.close()
            if self.pipe is not None:
                self.pipe.close()
                self.pipe.close_read()
            self.pipes.close()
            self.fds.close_all()
            if self.proc is not None:
                self.proc.close()
            mounted = self.layer or self._mounted
            if self.mounter is not None and mounted is not None:
                await asyncio.to_thread(self.mounter.unmount, mounted / MERGED)
            if self.layer is not None:  # never handed over: what it holds goes with it
                layer, self.layer = self.layer, None
                try:
                    await asyncio.to_thread(overlay.remove, layer)
                except OSError as exc:
                    log.warning("cannot remove the sandbox's layer %s: %s", layer, exc)
        if self.cgroup is None:
            return 0
        oom_kills = self.cgroup.oom_kills()
        if later is not None and not self.cgroup.pids():
            later.append(functools.partial(_remove, self.cgroup))
        else:
            await _remove(self.cgroup)
        return oom_kills


class BwrapProcess:
    """bwrap's process: started by ``subprocess.Popen`` in ``_SPAWNER`` (a fork from the
    executor, a large process, stalls whichever thread makes it, and asyncio's own subprocesses
    cost twice as much), waited for through a pidfd."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._pidfd = os.pidfd_open(popen.pid)  # our child, not reaped before we wait

    @classmethod
    async def start(cls, popen: Callable[[], subprocess.Popen[bytes]]) -> BwrapProcess:
        """Start it; the descriptors it is given stay open until this returns (a caller
        cancelled meanwhile still waits for the thread, then ends what it started).

        Raises:
            SandboxError: it could not be started.
        """
        future = asyncio.get_running_loop().run_in_executor(_SPAWNER, popen)
        try:
            started = await asyncio.shield(future)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                orphan = await future
                orphan.kill()
                await asyncio.to_thread(orphan.wait)
            raise
        except (OSError, ValueError) as e:
            raise SandboxError(f"cannot start bwrap: {e}") from e
        return cls(started)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        while self._popen.poll() is None:
            await proctree.wait_exited([self._pidfd], common.GRACE_S)
        return self._popen.returncode

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


async def wait_init(
    status: asyncio.StreamReader, block_w: int, deadline: float, *, root: bool
) -> tuple[int, int, int] | None:
    """Read the sandbox's init and PID namespace; map its users if we are ``root``
    (``users.MAP``), then let bwrap go on (``block_w``: its ``--userns-block-fd``).

    Returns a pidfd of the init, its host pid and the namespace's inode; None if bwrap
    ended (or hung) before creating it.
    """
    loop = asyncio.get_running_loop()
    try:
        line = await asyncio.wait_for(status.readline(), max(SETUP_S, deadline - loop.time()))
    except TimeoutError:
        return None
    if not line:
        return None
    report = json.loads(line)
    pid = int(report["child-pid"])
    try:
        init = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    if root:
        with contextlib.suppress(OSError):  # it died already: bwrap says why
            map_users(pid)
            os.write(block_w, b"1")
    return init, pid, int(report["pid-namespace"])


class BwrapLive:
    """A sandbox handed its command (``begin``) and seen through (``wait``): its limits set
    (``prlimit``), its timeout, then the whole sandbox ended (``interface.Live``)."""

    def __init__(
        self,
        box: Box,
        spawn: Spawn,
        limits: Limits,
        on_output: OnOutput | None,
        deadline: float,
        started: float,
    ) -> None:
        self.box, self.spawn, self.limits = box, spawn, limits
        self.deadline, self.started = deadline, started
        self.out = proctree.Output(spawn.output_cap, on_output)
        self.tree: proctree.Finder | None = None
        self.shim: int | None = None
        self._waited = False

    async def begin(self, spec: bytes) -> None:
        """Hand ``spec`` to the sandbox's waiting first process. A sandbox that never got
        ready is left to ``wait`` to report; a failure here ends it."""
        box = self.box
        assert box.proc is not None
        try:
            await self.out.attach("stdout", box.fds.take(box.out_r))
            await self.out.attach("stderr", box.fds.take(box.err_r))
            shim = await box.ready(self.deadline) if box.init is not None else None
            if box.init is not None and shim is not None:
                _prlimit(shim, self.limits)
                _write_all(box.spec, spec)
                os.lseek(box.spec, 0, os.SEEK_SET)
                os.write(box.go_w, b"1")
                box.fds.close(box.go_w)
                if box.watch is not None:
                    box.watch.start()
                self.shim = shim
                self.tree = proctree.in_pid_namespace(box.init[2], spare=box.init[1])
        except BaseException:
            try:
                await box.end()
                await self.out.finish(common.DRAIN_S)
            finally:
                await box.close(common.deferred())
            raise

    async def write(self, data: bytes, timeout_s: float) -> int:
        pipe = self.box.pipe
        return await pipe.write(data, timeout_s) if pipe is not None else 0

    def close_stdin(self) -> None:
        if self.box.pipe is not None:
            self.box.pipe.close()

    def signal(self, signum: int) -> int:
        """Every process of the sandbox but its init and the shim waiting for the command
        (which reports its end)."""
        if self.tree is None or self._waited:
            return 0
        return proctree.send(self.tree, signum, but=self.shim)

    async def wait(self) -> Outcome:
        assert not self._waited
        box, spawn, limits, out = self.box, self.spawn, self.limits, self.out
        assert box.proc is not None
        oom_kills = left = 0
        reports: list[dict[str, Any]] = []
        timed_out = False
        refused: str | None = None
        exits: list[int] = []
        layer: Path | None = None
        try:
            try:
                if self.tree is not None:
                    timed_out = await common.supervise(
                        box.proc, out, self.deadline, proctree.Terminator(self.tree)
                    )
            finally:
                self._waited = True
                reports = await box.end()
                await out.finish(common.DRAIN_S)
                refused, left = box.reported()
            exits = [r["exit-code"] for r in reports if "exit-code" in r]
            if refused is None and (exits or timed_out or box.cgroup is not None):
                layer = box.hand_over()  # the command ran (or may have): its changes count
        finally:
            oom_kills = await box.close(common.deferred())
        if refused is not None:
            raise SandboxError(f"cannot enter the workdir {refused}: not a directory")
        if not exits and oom_kills:  # the OOM killer took bwrap (or the sandbox's init) itself
            exits = [common.exit_code(-signal.SIGKILL)]
        if not exits and not timed_out:
            if layer is not None:
                await asyncio.to_thread(overlay.remove, layer)
            message = bytes(out.kept["stderr"]).decode(errors="replace").strip()
            raise SandboxError(message or f"bwrap failed (exit {box.proc.returncode})")
        code = exits[0] if exits else common.exit_code(box.proc.returncode or 0)
        if oom_kills:
            note = OOM_NOTE.format(n=oom_kills, mib=limits.memory_bytes // 1024**2)
            out.kept["stderr"] += note.encode()
            out.counts["stderr"] += len(note)
        result = common.outcome(
            out,
            code,
            timed_out,
            self.started,
            oom_killed=oom_kills > 0,
            stdin_read=box.watch is not None and box.watch.seen,
            left_running=left if spawn.count_left else 0,
        )
        return dataclasses.replace(result, layer=layer)


def _prlimit(pid: int, limits: Limits) -> None:
    """Set ``limits`` on the sandbox's waiting first process (as ``common.prlimit_argv``)."""
    wanted = (
        (resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1)),
        (resource.RLIMIT_DATA, (limits.memory_bytes,) * 2),
        (resource.RLIMIT_NPROC, (limits.processes,) * 2),
        (resource.RLIMIT_FSIZE, (limits.file_bytes,) * 2),
        (resource.RLIMIT_NOFILE, (limits.open_files,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    )
    try:
        for which, values in wanted:
            resource.prlimit(pid, which, values)
    except (OSError, ValueError) as e:
        raise SandboxError(f"cannot set the command's limits: {e}") from e


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


async def _remove(cgroup: cg.Cgroup) -> None:
    await cgroup.remove()
    if any(path.exists() for path in cgroup.paths):
        log.warning("cannot remove the sandbox's cgroup %s", cgroup.paths[0])
