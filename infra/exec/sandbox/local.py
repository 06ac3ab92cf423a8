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
from infra.exec.sandbox.interface import Limits, OnOutput, Outcome, SandboxError, Spawn
from infra.exec.sandbox.stdin import StdinWatch, available
from infra.safefs import Dir, remove_tree

MARKER = "QUILL_EXEC_TOKEN"
"""Environment variable tagging a local command's processes."""
LOCAL_QUIET_SCANS = 3


class LocalProvider:
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

    async def run(
        self, checkout: Path, spawn: Spawn, limits: Limits, on_output: OnOutput | None = None
    ) -> Outcome:
        if spawn.egress is not None:  # the host's network anyway: the variables only
            async with spawn.egress.open(tcp=True) as port:
                return await self.run(checkout, forwarder.in_local(spawn, port), limits, on_output)
        started = time.monotonic()
        deadline = asyncio.get_running_loop().time() + spawn.timeout_s
        cwd = checkout / common.workdir(spawn.workdir)
        token = secrets.token_hex(16)
        out = proctree.Output(spawn.output_cap, on_output)
        home = tempfile.mkdtemp(prefix="quill-home-")
        watch = StdinWatch() if spawn.stdin is None and spawn.watch_stdin and available() else None
        left = 0
        try:
            shims = _shims(home)
            env = common.environment(home, spawn.env, shims) | {MARKER: token}
            stdin = common.memfd("stdin", spawn.stdin) if spawn.stdin is not None else None
            if watch is not None:
                stdin, watch.read_end = watch.read_end, None
            since = proctree.ticks_now() - 1
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            try:
                proc = await asyncio.create_subprocess_exec(
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
            if watch is not None:
                watch.start()
            await out.attach("stdout", out_r)
            await out.attach("stderr", err_r)
            tree = proctree.marked(proc.pid, f"{MARKER}={token}".encode(), since)
            try:
                timed_out = await common.supervise(proc, out, deadline, proctree.Terminator(tree))
            finally:
                # Marks are read from /proc/<pid>/environ, which can read empty while a
                # process execs: only several empty scans in a row mean none is left.
                left = await proctree.kill_all(tree, quiet_scans=LOCAL_QUIET_SCANS)
                await common.reap(proc)
                await out.finish(common.DRAIN_S)
        finally:
            if watch is not None:
                await watch.close()
            later = common.deferred()
            if later is not None:  # nothing of the command is left to use it (``kill_all``)
                later.append(functools.partial(asyncio.to_thread, _remove, home))
            else:
                _remove(home)
        return common.outcome(
            out,
            common.exit_code(proc.returncode or 0),
            timed_out,
            started,
            stdin_read=watch is not None and watch.seen,
            left_running=left if spawn.count_left else 0,
        )


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
