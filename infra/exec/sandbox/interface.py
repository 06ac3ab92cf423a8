"""What a sandbox provider is: the ``Provider`` protocol, what it takes and what it returns."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

StreamName = Literal["stdout", "stderr"]
OnOutput = Callable[[StreamName, bytes], Awaitable[None]]
"""Called with each chunk of output as it is read (never concurrently for one command)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of one command's process tree."""

    cpu_s: int = 600
    """CPU seconds (RLIMIT_CPU)."""
    memory_bytes: int = 4 * 1024**3
    """Data segment and heap of each process (RLIMIT_DATA), the size of /tmp (bwrap), and with
    a cgroup (``Provider.cgroups``) all the sandbox's memory, /tmp included."""
    processes: int = 512
    """Processes and threads (RLIMIT_NPROC, in the sandbox's user namespace; with a cgroup
    also its ``pids.max``, bwrap's own two processes included)."""
    file_bytes: int = 1024**3
    """Largest file it may write (RLIMIT_FSIZE)."""
    open_files: int = 1024
    """RLIMIT_NOFILE."""


@dataclass(frozen=True, slots=True)
class EgressPort:
    """Where one sandbox reaches its egress proxy (``infra.exec.egress``)."""

    socket: Path
    """The proxy's unix socket (bwrap binds its directory; ``forwarder``)."""
    url: str | None = None
    """A loopback TCP proxy URL with its credential (the local provider)."""


class Egress(Protocol):
    """A command's right to the egress proxy (``infra.exec.egress.Grant``)."""

    def open(self, *, tcp: bool) -> AbstractAsyncContextManager[EgressPort]:
        """A proxy for one sandbox, listening until the context ends; ``tcp``: also on a
        loopback port (``EgressPort.url``)."""
        ...


class Ports(Protocol):
    """A long-lived sandbox's loopback ports, reached by the executor (``sandbox.ports``)."""

    def opened(self, *, agent: bool) -> AbstractAsyncContextManager[None]:
        """Reachable while the context lasts: through an agent in the sandbox's own network
        (``agent``: bwrap) or directly on the host's loopback (local)."""
        ...

    def wrap(self, spawn: Spawn) -> Spawn:
        """``spawn`` started through the agent."""
        ...


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
    watch_stdin: bool = False
    """With no ``stdin``: tell whether the command waited to read its (closed) stdin
    (``Outcome.stdin_read``; see ``sandbox.stdin``)."""
    live_stdin: bool = False
    """Without ``stdin``: stdin is a pipe the caller writes to as it goes (``Live.write``) and
    closes (``Live.close_stdin``); it is closed when the command ends. ``watch_stdin`` is
    ignored (a read of it waits for what the caller sends)."""
    count_left: bool = False
    """Count what the command left running when it ended (``Outcome.left_running``)."""
    overlay: int | None = None
    """Run over an overlay of the checkout where the provider can (``Provider.overlays``):
    the command's writes go to a layer of its own (``Outcome.layer``), the checkout is left
    as it was. The value is the checkout's generation (``Checkout.generation``): a spare
    sandbox started over another one is not used (the tree changed under its mount)."""
    egress: Egress | None = None
    """Reach the network through this proxy only (``forwarder``): its variables in the
    environment (``HTTPS_PROXY``...), and under bwrap its socket bound and a forwarder on
    127.0.0.1:3128 in the sandbox's own network; None: no network at all."""
    ports: Ports | None = None
    """Let the executor reach the sandbox's loopback ports (``ports``: a shell's, for the
    gateway's ``/shells/{id}/ports/{port}``) for as long as it lives."""


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
    oom_killed: bool = False
    """The sandbox's memory cgroup ran out and the kernel killed a process of it (its stderr
    ends with a note saying so)."""
    stdin_read: bool = False
    """``Spawn.watch_stdin``: a process of the command waited to read stdin, and got end of
    file."""
    left_running: int = 0
    """``Spawn.count_left``: processes still running when the command ended (``cmd &``), all
    killed then; 0 when it timed out."""
    layer: Path | None = None
    """``Spawn.overlay``: the layer holding what the command wrote (``infra.exec.layers``), the
    caller's to merge and remove; None: it wrote into the checkout itself."""


class Live(Protocol):
    """A command started (``Provider.start``) and not yet waited for: its stdin written to as
    it goes, its processes signalled, its ``Outcome`` awaited once (``wait``)."""

    async def write(self, data: bytes, timeout_s: float) -> int:
        """Write ``data`` to its stdin (``Spawn.live_stdin``), waiting at most ``timeout_s``
        for the command to read what does not fit in the pipe; the bytes written (fewer on
        the timeout, or once its stdin is closed or no process reads it any more)."""
        ...

    def close_stdin(self) -> None:
        """Close its stdin: a read of it gets end of file once the pipe is drained."""
        ...

    def signal(self, signum: int) -> int:
        """Send ``signum`` to every process of the command (its process group, and what left
        it: the same processes a timeout ends); how many got it."""
        ...

    async def wait(self) -> Outcome:
        """Its end (timeout included), once: the same as ``Provider.run``'s.

        Raises:
            SandboxError: the sandbox could not run it.
        """
        ...


class SandboxError(Exception):
    """The sandbox itself could not start the command (not the command failing)."""


class Provider(Protocol):
    name: str
    cgroups: bool
    """Whether each sandbox gets its own cgroup: one memory and one process limit for all its
    processes (and /tmp); without, the memory and process limits are per process."""
    no_cgroups: str
    """Why not, when ``cgroups`` is false."""
    owner: tuple[int, int] | None
    """The host (uid, gid) a checkout's files must belong to for the command to change them:
    it has no privilege over any other file. None: the executor's own (it runs the command as
    itself, or as its own uid inside)."""

    overlays: bool
    """Whether ``Spawn.overlay`` is honoured (bwrap as root, an overlay mountable under the
    checkouts: ``sandbox.overlay.probe``)."""
    no_overlays: str
    """Why not, when ``overlays`` is false."""

    def layers(self, checkouts: Path) -> None:
        """Honour ``Spawn.overlay`` for the checkouts under ``checkouts`` if it can (sets
        ``overlays``, or ``no_overlays`` to why not). Blocking."""
        ...

    async def sweep(self, checkouts: Path) -> int:
        """Kill what commands over the checkouts under ``checkouts`` an earlier executor left
        running; the number of processes killed."""
        ...

    async def run(
        self, checkout: Path, spawn: Spawn, limits: Limits, on_output: OnOutput | None = None
    ) -> Outcome:
        """Run ``spawn`` against ``checkout``.

        Raises:
            SandboxError: the sandbox could not start it.
        """
        ...

    async def start(
        self, checkout: Path, spawn: Spawn, limits: Limits, on_output: OnOutput | None = None
    ) -> Live:
        """Start ``spawn`` against ``checkout`` and hand it back running (``run`` is ``start``
        then ``Live.wait``). The caller must ``wait`` for it (that frees what it holds).

        Raises:
            SandboxError: the sandbox could not start it.
        """
        ...

    def wrappers(self, spawn: Spawn) -> int:
        """How many processes of its own the sandbox runs around ``spawn``'s command (bwrap:
        the egress forwarder, the ports agent), to tell them from the command's."""
        ...

    def warm(self, checkout: Path, limits: Limits, overlay: int | None = None) -> None:
        """Get ready for another command on ``checkout`` with ``limits`` (bwrap: start a spare
        sandbox for it, over an overlay of generation ``overlay`` if not None; never one
        reused: ``sandbox.spares``)."""
        ...

    def discard(self, checkout: Path) -> None:
        """Drop what ``warm`` got ready for ``checkout`` (it is going away)."""
        ...

    async def close(self) -> None:
        """Drop all of it (the executor is stopping)."""
        ...
