"""``LocalProvider`` ("local"): a command as a plain process; no sandbox (the package says why).

Its processes are those started after it that are in its session or carry its random
``QUILL_EXEC_TOKEN`` in their environment (found in /proc, so ``setsid`` does not hide them);
they are killed when the command ends or times out. No subreaper: it would make the whole
executor the parent of every orphan, for no better way to tell whose they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import subprocess
import tempfile
import time
from pathlib import Path

from infra.exec.sandbox import common, forwarder, proctree
from infra.exec.sandbox.interface import (
    EgressPort,
    Limits,
    Live,
    OnOutput,
    Outcome,
    SandboxError,
    Spawn,
)
from infra.exec.sandbox.stdin import StdinPipe, StdinWatch, available
from infra.safefs import Dir, remove_tree

MARKER = "QUILL_EXEC_TOKEN"
"""Environment variable tagging a local command's processes."""
LOCAL_QUIET_SCANS = 3


class LocalProvider(forwarder.Starts):
    """Runs commands as plain processes (see the module docstring)."""

    name = "local"
    cgroups = False
    no_cgroups = "the local provider makes none"
    owner: tuple[int, int] | None = None
    overlays = False
    no_overlays = (
        "the local provider has no sandbox to mount one in: its commands change the checkout "
        "itself, which capture walks"
    )

    def layers(self, checkouts: Path) -> None:
        """Nothing (``no_overlays`` says why)."""

    async def sweep(self, checkouts: Path) -> int:
        """Nothing: a local command's processes carry a marker of their own command only, so
        what a killed executor left cannot be told apart (docs/executor.md says so)."""
        return 0

    def warm(self, checkout: Path, limits: Limits, overlay: int | None = None) -> None:
        """Nothing: a local command starts in a few milliseconds anyway."""

    def discard(self, checkout: Path) -> None:
        """Nothing (``warm`` keeps nothing)."""

    async def close(self) -> None:
        """Nothing (``warm`` keeps nothing)."""

    egress_tcp = True  # the host's network anyway: a loopback port, the variables only

    def egress_wrap(self, spawn: Spawn, port: EgressPort) -> Spawn:
        return forwarder.in_local(spawn, port)

    async def _start(
        self, checkout: Path, spawn: Spawn, limits: Limits, on_output: OnOutput | None = None
    ) -> Live:
        live = LocalLive(spawn, on_output)
        try:
            await live.begin(checkout, limits)
        except BaseException:
            await live.tidy()
            raise
        return live


class LocalLive:
    """One local command from start to end (``LocalProvider.start``; ``interface.Live``)."""

    def __init__(self, spawn: Spawn, on_output: OnOutput | None) -> None:
        self.spawn = spawn
        self.started = time.monotonic()
        self.deadline = asyncio.get_running_loop().time() + spawn.timeout_s
        self.out = proctree.Output(spawn.output_cap, on_output)
        self.home = tempfile.mkdtemp(prefix="quill-home-")
        self.watch: StdinWatch | None = None
        if spawn.stdin is None and spawn.watch_stdin and not spawn.live_stdin and available():
            self.watch = StdinWatch()
        self.pipe = StdinPipe() if spawn.stdin is None and spawn.live_stdin else None
        self.proc: asyncio.subprocess.Process | None = None
        self.tree: proctree.Marked | None = None
        self._waited = False

    async def begin(self, checkout: Path, limits: Limits) -> None:
        spawn = self.spawn
        cwd = checkout / common.workdir(spawn.workdir)
        token = secrets.token_hex(16)
        shims = _shims(self.home)
        env = common.environment(self.home, spawn.env, shims) | {MARKER: token}
        stdin = common.memfd("stdin", spawn.stdin) if spawn.stdin is not None else None
        if self.watch is not None:
            stdin, self.watch.read_end = self.watch.read_end, None
        if self.pipe is not None:
            stdin, self.pipe.read_end = self.pipe.read_end, None
        since = proctree.ticks_now() - 1
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *common.prlimit_argv(limits),
                *spawn.argv,
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        except (OSError, ValueError) as e:
            _close(out_r)
            _close(err_r)
            raise SandboxError(f"cannot start {spawn.argv[:1]} in {cwd}: {e}") from e
        finally:
            for end in (out_w, err_w, stdin):
                if end is not None:
                    os.close(end)
        self.tree = proctree.marked(self.proc.pid, f"{MARKER}={token}".encode(), since)
        if self.watch is not None:
            self.watch.start()
        await self.out.attach("stdout", out_r)
        await self.out.attach("stderr", err_r)

    async def write(self, data: bytes, timeout_s: float) -> int:
        return await self.pipe.write(data, timeout_s) if self.pipe is not None else 0

    def close_stdin(self) -> None:
        if self.pipe is not None:
            self.pipe.close()

    def signal(self, signum: int) -> int:
        if self.tree is None or self._waited:
            return 0
        return proctree.send(self.tree, signum)

    async def wait(self) -> Outcome:
        assert self.proc is not None and self.tree is not None and not self._waited
        proc, tree, out = self.proc, self.tree, self.out
        left = 0
        try:
            try:
                timed_out = await common.supervise(
                    proc, out, self.deadline, proctree.Terminator(tree)
                )
            finally:
                self._waited = True
                # Marks are read from /proc/<pid>/environ, which can read empty while a
                # process execs: only several empty scans in a row mean none is left.
                left = await proctree.kill_all(tree, quiet_scans=LOCAL_QUIET_SCANS)
                await common.reap(proc)
                await out.finish(common.DRAIN_S)
        finally:
            await self.tidy()
        return common.outcome(
            out,
            common.exit_code(proc.returncode or 0),
            timed_out,
            self.started,
            stdin_read=self.watch is not None and self.watch.seen,
            left_running=left if self.spawn.count_left else 0,
        )

    async def tidy(self) -> None:
        """Free what it holds: its stdin and its private HOME (``wait`` does; a start that
        failed too)."""
        if self.watch is not None:
            await self.watch.close()
        if self.pipe is not None:
            self.pipe.close()
            self.pipe.close_read()
        later = common.deferred()
        if later is not None:  # nothing of the command is left to use it (``kill_all``)
            later.append(functools.partial(asyncio.to_thread, _remove, self.home))
        else:
            _remove(self.home)


def _shims(home: str) -> str | None:
    """A directory in the command's private HOME with ``common.shim_links`` (None: none)."""
    links = common.shim_links()
    if not links:
        return None
    shims = os.path.join(home, ".quill-bin")
    os.mkdir(shims)
    for name, target in links.items():
        os.symlink(target, os.path.join(shims, name))
    return shims


def _remove(home: str) -> None:
    """Remove the command's private HOME, however deep it made it (``safefs.remove_tree``)."""
    with contextlib.suppress(OSError), Dir.open(Path(home).parent) as parent:
        remove_tree(parent, os.path.basename(home))


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
