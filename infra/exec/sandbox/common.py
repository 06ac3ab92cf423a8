"""What both providers share: the command's environment, workdir and limits, the timeout
(``supervise``) and the ``Outcome``."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import posixpath
import shutil
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Protocol

from infra.exec.sandbox import proctree
from infra.exec.sandbox.interface import Limits, Outcome, SandboxError

GRACE_S = 5.0
"""Between SIGTERM and SIGKILL on a timeout."""

SANDBOX_USER = "quill"
PATH = "/usr/local/bin:/usr/bin:/bin"
"""The command's PATH, and where ``prlimit`` and ``setpriv`` are looked up."""
SHIMS = "/opt/quill/bin"
"""In a bwrap sandbox: commands the host lacks under their usual name (``python``, a link to
``python3``), last on the command's PATH (a host's own ``python`` comes first)."""
DRAIN_S = 2.0
"""Longest wait for the rest of the output once the command has ended."""

_RESCAN_S = 0.1

Later = list[Callable[[], Awaitable[None]]]
_later: contextvars.ContextVar[Later | None] = contextvars.ContextVar("later", default=None)


@contextlib.contextmanager
def after_reply(later: Later) -> Iterator[None]:
    """Within it, a provider may leave tidying that proves nothing (removing an empty cgroup)
    to ``later``, which the caller runs once it has replied. What a caller's reply promises
    (nothing of the command still runs) is checked before the provider returns, as without."""
    token = _later.set(later)
    try:
        yield
    finally:
        _later.reset(token)


def outlives_reply() -> contextvars.Context:
    """The context for waiting on a sandbox that outlives the request that started it (a
    shell): its tidying is done when it ends, not left to a reply that has long been sent
    (a task started within ``after_reply`` would append its cgroup's removal to a list
    nobody runs any more)."""
    context = contextvars.copy_context()
    context.run(_later.set, None)
    return context


def deferred() -> Later | None:
    """Where tidying may go (``after_reply``); None: do it now."""
    return _later.get()


SENT = (signal.SIGINT, signal.SIGQUIT)
"""Signals a command is sent that a process can have been started ignoring (a shell ignores
them for its background jobs: ``quill executor &``, a test run as ``pytest &``)."""


def default_signals() -> list[str]:
    """Undo, in this (the executor's) process, an ignore of the signals commands are sent: a
    command inherits what its parent ignores, and bash cannot undo an ignore it started with
    ("signals ignored upon entry to the shell cannot be trapped or reset"), so an ``exec.signal``
    INT or a terminal's Ctrl-C would reach a command that ignores it. Handled signals are left
    as they are (a handler is reset to the default across ``exec`` anyway). Returns the names
    of those it reset; only the main thread may (elsewhere: none)."""
    if threading.current_thread() is not threading.main_thread():
        return []
    reset = []
    for sig in SENT:
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
            reset.append(sig.name)
    return reset


def environment(home: str, extra: Mapping[str, str], shims: str | None = None) -> dict[str, str]:
    """The command's whole environment: a clean base, then ``extra`` (never the executor's);
    ``shims`` (a directory) ends the PATH."""
    base = {
        "PATH": f"{PATH}:{shims}" if shims else PATH,
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "USER": SANDBOX_USER,
        "LOGNAME": SANDBOX_USER,
    }
    return base | dict(extra)


def shim_links() -> dict[str, str]:
    """The links a shims directory holds: ``python`` → the host's ``python3`` when the host
    has a ``python3`` on PATH and no ``python``."""
    python3 = shutil.which("python3", path=PATH)
    if python3 is None or shutil.which("python", path=PATH) is not None:
        return {}
    return {"python": python3}


class Process(Protocol):
    """A started process, as ``supervise`` and ``reap`` use it (asyncio's, or bwrap's own)."""

    @property
    def returncode(self) -> int | None: ...

    @property
    def pid(self) -> int: ...

    async def wait(self) -> int: ...


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
        shutil.which("prlimit", path=PATH) or "prlimit",
        f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
        f"--data={limits.memory_bytes}",
        f"--nproc={limits.processes}",
        f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}",
        "--core=0",
        "--",
    ]


def exit_code(returncode: int) -> int:
    """An ``Outcome.exit_code`` from a ``returncode`` (negative: killed by that signal)."""
    return 128 - returncode if returncode < 0 else returncode


def memfd(name: str, data: str | bytes) -> int:
    """An anonymous file holding ``data``, positioned at its start."""
    fd = os.memfd_create(name)
    view = memoryview(data.encode() if isinstance(data, str) else data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


async def supervise(
    proc: Process,
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


def outcome(
    out: proctree.Output,
    exit_code: int,
    timed_out: bool,
    started: float,
    oom_killed: bool = False,
    *,
    stdin_read: bool = False,
    left_running: int = 0,
) -> Outcome:
    """The ``Outcome`` of a command started at ``started`` (``time.monotonic()``)."""
    return Outcome(
        exit_code=exit_code,
        stdout=bytes(out.kept["stdout"]),
        stderr=bytes(out.kept["stderr"]),
        stdout_bytes=out.counts["stdout"],
        stderr_bytes=out.counts["stderr"],
        timed_out=timed_out,
        duration_ms=int((time.monotonic() - started) * 1000),
        oom_killed=oom_killed,
        stdin_read=stdin_read,
        left_running=0 if timed_out else left_running,
    )


async def reap(proc: Process) -> None:
    """SIGKILL ``proc`` (if it still runs) and wait for it.

    The signal goes through a pidfd, not ``proc.kill()``: ``Popen.send_signal`` first polls
    (``waitpid`` with WNOHANG), which reaps a process that has just exited before asyncio's
    child watcher does; the watcher then finds no child and reports exit code 255 instead of
    the command's own (seen as 255 for a command killed on its timeout).
    """
    if proc.returncode is None:
        try:
            fd = os.pidfd_open(proc.pid)
        except ProcessLookupError:
            pass  # reaped already: ``wait`` says how it ended
        else:
            try:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            finally:
                os.close(fd)
    await proc.wait()
