"""The process that mounts commands' overlays (``sandbox.overlay``), in a mount namespace of its
own: never the host's, and one for all sandboxes.

Why a process. The overlay is mounted by root in the host's user namespace (what gives it
``redirect_dir=on``), so not by bwrap, which mounts inside the sandbox's. Mounting it in a new
namespace per sandbox (``unshare``, a shell, ``mount(8)``, then bwrap) cost three programs more
and a namespace torn down with each command: tens of milliseconds a command on a busy host. The
executor cannot enter another namespace itself (it has threads), and mounting in the host's
namespace would leave mounts behind if it died (and systemd makes a unit of every mount). So
one small Python process, started once under ``unshare --mount --propagation private``, makes
each mount with one ``mount(2)`` (and ``umount2(MNT_DETACH)`` when the sandbox has ended), and
bwrap is started in its namespace by ``nsenter``. It reads requests on its stdin: when the
executor dies, it sees end of file and exits; its namespace, and every overlay in it, goes
with the last sandbox in it (they die with the executor too).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

UTIL_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"

_HELPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
out = sys.stdout
for line in sys.stdin:
    op, *args = line.rstrip("\n").split("\0")
    if op == "mount":
        cwd, target, options = args
        os.chdir(cwd)
        ok = libc.mount(b"quill", target.encode(), b"overlay", 0, options.encode())
    else:
        ok = libc.umount2(args[0].encode(), 2)
    err = 0 if ok == 0 else ctypes.get_errno()
    out.write(f"{err} {os.strerror(err) if err else ''}\n")
    out.flush()
"""
"""``mount\\0CWD\\0TARGET\\0OPTIONS`` or ``umount\\0TARGET``, one a line; answered ``0`` or
``ERRNO message``. ``MNT_DETACH`` (2): the overlay goes once the sandbox using it has."""


class MountError(OSError):
    """The overlay could not be mounted (or the mounter is gone)."""


class Mounter:
    """One mounter process (see the module docstring); its methods block (call them from a
    thread); one request at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None

    def _started(self) -> subprocess.Popen[str]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        unshare = shutil.which("unshare", path=UTIL_PATH)
        if unshare is None:
            raise MountError("no unshare (util-linux)")
        self._proc = subprocess.Popen(
            [unshare, "--mount", "--propagation", "private", "--"]
            + [sys.executable, "-I", "-S", "-c", _HELPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        return self._proc

    @property
    def namespace(self) -> str:
        """The mount namespace to start bwrap in (``nsenter --mount=``)."""
        with self._lock:
            return f"/proc/{self._started().pid}/ns/mnt"

    def _ask(self, *words: str) -> None:
        with self._lock:
            proc = self._started()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write("\0".join(words) + "\n")
                proc.stdin.flush()
                answer = proc.stdout.readline()
            except OSError as exc:
                raise MountError(f"the mounter is gone: {exc}") from exc
        code, _, why = answer.strip().partition(" ")
        if not answer:
            raise MountError("the mounter is gone")
        if code != "0":
            raise MountError(int(code) if code.isdigit() else 0, why or answer.strip())

    def mount(self, cwd: Path, target: str, options: str) -> None:
        """Mount an overlay of ``options`` (paths relative to ``cwd``) at ``target``.

        Raises:
            MountError: the kernel refused it, or the mounter died.
        """
        self._ask("mount", str(cwd), target, options)

    def unmount(self, target: Path) -> None:
        """Detach the overlay at ``target`` (it goes once no sandbox uses it)."""
        with contextlib.suppress(MountError):
            self._ask("umount", str(target))

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def nsenter(namespace: str, cwd: Path, argv: list[str]) -> list[str]:
    """``argv`` run in the mount namespace ``namespace``, in ``cwd`` (entering a mount
    namespace moves a process to its root)."""
    program = shutil.which("nsenter", path=UTIL_PATH) or "nsenter"
    return [program, f"--mount={namespace}", f"--wd={os.fspath(cwd)}", "--", *argv]
