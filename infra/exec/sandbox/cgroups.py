"""Per-sandbox cgroups: one memory limit and one process limit for a whole bwrap sandbox.

Why. RLIMIT_DATA and RLIMIT_NPROC are per process (per user): three processes under one
memory limit each hold that much, and /tmp, a tmpfs, is RAM no rlimit counts. A memory cgroup
counts every page of the sandbox, /tmp's too (tmpfs pages are charged to the memory cgroup of
the process that wrote them), and the OOM killer ends a process of that sandbox alone when it
goes over; pids.max holds every process and thread of it.

Where. One child per sandbox of the executor's own cgroup, ``quill-<owner>-<random>``
(``owner``: the executor's pid and start time, so that ``sweep`` can tell a dead executor's):

* cgroup v2 (a ``cgroup2`` hierarchy offering memory and pids): ``memory.max``,
  ``memory.swap.max`` 0, ``pids.max``. If the executor's cgroup does not hand those controllers
  to its children yet, ``detect`` enables them (``cgroup.subtree_control``), first moving the
  executor into a leaf ``quill-executor`` when its cgroup holds it (v2 allows controllers only
  below cgroups without processes).
* cgroup v1 (``memory`` and ``pids`` hierarchies): ``memory.limit_in_bytes``, the same for
  ``memory.memsw.limit_in_bytes`` where swap is accounted (memory plus swap: no swap on top),
  ``memory.swappiness`` 0, ``pids.max``.

How a sandbox gets in. The process that becomes bwrap writes itself into each ``cgroup.procs``
and only then execs bwrap (``Cgroup.wrap``), so every process of the sandbox starts inside, and
the cgroup namespace bwrap makes is rooted there (``/proc/self/cgroup`` shows ``/``).

Afterwards ``Cgroup.remove`` kills what is left (``cgroup.kill`` on v2, else each process by
pidfd) and removes the directories; ``Cgroup.oom_kills`` says how many processes the OOM killer
took. Where no cgroup can be made (not root, a read-only cgroupfs, a missing controller)
``detect`` says why, and the limits are per process only (docs/executor.md names the risk).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path

from infra.exec.sandbox import proctree
from infra.exec.sandbox.interface import Limits, SandboxError

PREFIX = "quill-"
LEAF = "quill-executor"
"""Where a v2 executor moves itself when its own cgroup must hand controllers down."""
REMOVE_S = 5.0

_NEEDED = ("memory", "pids")


@dataclass(frozen=True, slots=True)
class Cgroups:
    """Where this executor makes its sandboxes' cgroups: ``version`` 1 or 2, and the executor's
    own cgroup directory in each hierarchy used (v2: one; v1: memory and pids)."""

    version: int
    bases: tuple[Path, ...]

    def make(self, limits: Limits) -> Cgroup:
        """A new cgroup holding ``limits.memory_bytes`` and ``limits.processes``.

        Raises:
            SandboxError: it could not be made.
        """
        name = f"{PREFIX}{owner(os.getpid())}-{secrets.token_hex(6)}"
        cgroup = Cgroup(self.version, tuple(base / name for base in self.bases))
        try:
            for path in cgroup.paths:
                path.mkdir()
            _limit(cgroup, limits)
        except OSError as e:
            cgroup.rmdir()
            raise SandboxError(f"cannot make the sandbox's cgroup: {e}") from e
        return cgroup

    async def sweep(self) -> int:
        """Remove the cgroups an executor that is no longer alive left (with what runs in them);
        the number of processes killed."""
        killed = 0
        for base in self.bases:
            for path in base.glob(f"{PREFIX}*"):
                owner = path.name[len(PREFIX) :].rsplit("-", 1)[0]
                if path.name != LEAF and not _alive(owner):
                    killed += await Cgroup(self.version, (path,)).remove()
        return killed


@dataclass(frozen=True, slots=True)
class Cgroup:
    """One sandbox's cgroup (a directory in each hierarchy)."""

    version: int
    paths: tuple[Path, ...]

    def wrap(self, bash: str, argv: list[str], argv0: str) -> list[str]:
        """``argv`` (program first), run as ``argv0`` by a bash that first joins this cgroup."""
        joins = "".join(f'echo 0 > "${i + 1}" && ' for i in range(len(self.paths)))
        script = f'{joins}shift {len(self.paths)} && exec -a {argv0} "$@"'
        return [bash, "-c", script, argv0, *(str(p / "cgroup.procs") for p in self.paths), *argv]

    def oom_kills(self) -> int:
        """How many of its processes the OOM killer has killed."""
        memory = self.paths[0]
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.paths:
            with contextlib.suppress(OSError, ValueError):
                found |= {int(pid) for pid in (path / "cgroup.procs").read_text().split()}
        return found

    async def remove(self, timeout: float = REMOVE_S) -> int:
        """Kill what is left in it, wait for it, remove it; the number of processes killed.
        After ``timeout`` it is left for a later ``Cgroups.sweep`` (logged by the caller)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        killed = 0
        kill = self.paths[0] / "cgroup.kill"
        while True:
            pids = self.pids()
            if not pids and self.rmdir():
                return killed
            if loop.time() > deadline:
                return killed
            if pids and self.version == 2 and kill.exists():
                with contextlib.suppress(OSError):
                    kill.write_text("1")
            fds = []
            for pid in pids:
                with contextlib.suppress(OSError):
                    fds.append(os.pidfd_open(pid))
            try:
                for fd in fds:
                    with contextlib.suppress(ProcessLookupError):
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                killed += len(fds)
                await proctree.wait_exited(fds, max(0.0, deadline - loop.time()))
            finally:
                for fd in fds:
                    os.close(fd)
            await asyncio.sleep(0.005)  # an exited process leaves cgroup.procs a moment later

    def rmdir(self) -> bool:
        """Remove every directory; whether they are all gone."""
        gone = True
        for path in self.paths:
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                gone = False
        return gone


def detect() -> tuple[Cgroups | None, str]:
    """This executor's ``Cgroups``, checked by making one and removing it; or None and why not."""
    own = _own_cgroups()
    mounts = _mounts()
    reasons = []
    if "" in own and "cgroup2" in mounts:
        try:
            return _usable(2, (_v2(mounts["cgroup2"] / own[""].lstrip("/")),)), ""
        except (OSError, SandboxError) as e:
            reasons.append(f"cgroup v2: {e}")
    if all(name in own and name in mounts for name in _NEEDED):
        bases = tuple(mounts[name] / own[name].lstrip("/") for name in _NEEDED)
        try:
            return _usable(1, bases), ""
        except (OSError, SandboxError) as e:
            reasons.append(f"cgroup v1: {e}")
    else:
        reasons.append("no cgroup v1 memory and pids hierarchies")
    return None, "; ".join(reasons)


def _usable(version: int, bases: tuple[Path, ...]) -> Cgroups:
    cgroups = Cgroups(version, bases)
    probe = cgroups.make(Limits(memory_bytes=64 * 1024**2, processes=8))
    if not probe.rmdir():
        raise SandboxError(f"cannot remove {probe.paths}")
    return cgroups


def _v2(base: Path) -> Path:
    """``base``, made to hand memory and pids to its children.

    Raises:
        SandboxError, OSError: it cannot.
    """
    offered = (base / "cgroup.controllers").read_text().split()
    if missing := [name for name in _NEEDED if name not in offered]:
        raise SandboxError(f"{base} does not offer {', '.join(missing)}")
    if all(name in (base / "cgroup.subtree_control").read_text().split() for name in _NEEDED):
        return base
    enable = " ".join(f"+{name}" for name in _NEEDED)
    try:
        (base / "cgroup.subtree_control").write_text(enable)
    except OSError as e:
        if e.errno != errno.EBUSY:
            raise
        leaf = base / LEAF  # v2: no controllers for the children of a cgroup with processes
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        (base / "cgroup.subtree_control").write_text(enable)
    return base


def _limit(cgroup: Cgroup, limits: Limits) -> None:
    memory = str(limits.memory_bytes)
    pids = str(limits.processes)  # bwrap's monitor and the sandbox's init included
    if cgroup.version == 2:
        (path,) = cgroup.paths
        (path / "memory.max").write_text(memory)
        _write_if_there(path / "memory.swap.max", "0")
        (path / "pids.max").write_text(pids)
        return
    mem, pid = cgroup.paths
    (mem / "memory.limit_in_bytes").write_text(memory)
    _write_if_there(mem / "memory.memsw.limit_in_bytes", memory)
    with contextlib.suppress(OSError):  # refused where the parent uses a hierarchy
        (mem / "memory.swappiness").write_text("0")
    (pid / "pids.max").write_text(pids)


def _write_if_there(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except FileNotFoundError:  # no swap accounting
        pass


def _own_cgroups() -> dict[str, str]:
    """The executor's cgroup path per v1 controller, and ``""`` for v2."""
    own = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                own[name] = path
    return own


def _mounts() -> dict[str, Path]:
    """Where each v1 controller's hierarchy is mounted (with its root, as this process sees
    it), and ``"cgroup2"`` for the v2 one."""
    found: dict[str, Path] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, (fstype, _, options) = left.split(), right.split()[:3]
            if fields[3] != "/":  # a hierarchy mounted from within: paths would not match
                continue
            point = Path(fields[4].replace("\\040", " "))
            if fstype == "cgroup2":
                found.setdefault("cgroup2", point)
            elif fstype == "cgroup":
                for name in options.split(","):
                    if name in _NEEDED:
                        found.setdefault(name, point)
    return found


def owner(pid: int) -> str:
    """How a cgroup's name says which process made it: its pid and start time."""
    return f"{pid}.{_start_time(pid)}"


def _alive(owner: str) -> bool:
    pid, _, start = owner.partition(".")
    return pid.isdigit() and _start_time(int(pid)) == start


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""
