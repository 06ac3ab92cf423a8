"""Who runs in a bwrap sandbox: its user namespace, the uids of the shim and the command.

Only ``bwrap`` uses this module (``view`` for the options, ``shim`` for the command's argv).

RLIMIT_NPROC is the only per-tree process limit without cgroups, and the kernel never applies
it to host uid 0 (``copy_process`` exempts ``INIT_USER``), so bwrap's usual map (sandbox uid
1000 = the caller, root) would let a fork bomb fill the host's pid table (measured: ``ulimit -u
20`` then 40 forks all succeed). So when the executor is root the command never runs as host
root, and holds no privilege over any file but its own:

* The sandbox's user namespace (``MAP``, written by us: bwrap's ``--userns-block-fd``) maps
  uid 1000 to ``HOST_UID`` (the command), uid 0 to ``ROOT_HOST_UID`` (the sandbox's root: the
  shim) and the host's root to 65534 (``nobody``). Both host uids are unused by any account.
  The host's root must be mapped: bwrap's own process stays host root (it is not setuid and
  does not change uid) and the kernel lets no one make files on the sandbox's new root unless
  their uid is mapped there (``EOVERFLOW``); it is mapped as nobody and no process the command
  can reach or become is it (bwrap's init, which reaps, and bwrap itself).
* ``setpriv`` makes bwrap's process the sandbox's root with ``SHIM_CAPS`` only (switching
  uids, searching the command's directories); that is ``shim.SHIM``, which runs the command
  through another ``setpriv`` as uid 1000 with no capability at all: none permitted,
  effective, inheritable, ambient or in its bounding set. Capabilities in a user namespace
  reach only files whose owner is mapped there, and the command has none: it cannot chmod a
  device node or a /proc entry (``/dev/null``, ``/proc/execdomains``: owned by the host's root,
  which it is not), read root-only /proc files (``/proc/slabinfo``), ptrace or signal the shim
  or open its descriptors (another uid; the shim's report of what the command left running
  cannot be forged). RLIMIT_NPROC counts its processes per sandbox (ucounts are per user
  namespace).
* Why not keep CAP_DAC_OVERRIDE and CAP_FOWNER for a root-owned checkout, as before: they held
  over every root-owned file the sandbox shows, so the checkout belongs to the command instead
  (``BwrapProvider.owner``: the executor gives it what it writes there, ``infra.safefs``), and
  so does every file the command makes. Other host files show as nobody inside (/etc/gitconfig
  marks every directory safe for git).
* A seccomp filter (``seccomp``) refuses setuid and setgid bits in chmod (a setuid program of
  ``HOST_UID`` on the host) and every kernel-key call (``add_key``, ``request_key``,
  ``keyctl``): keyrings are per host uid, which all sandboxes share, and ``/proc/keys`` listed
  one tenant's keys to another.
* The kernel-global parts of /proc a mode alone would let a process write
  (``view.PROC_READ_ONLY``) are read-only binds (bwrap does so for four of them only when its
  uid inside is 0).
* No nested user namespace: bwrap's ``--disable-userns``, or as root (where bwrap refuses it
  with ``--userns-block-fd``) ``NO_USERNS`` 0 in the sandbox's user namespace, which the
  command, without CAP_SYS_RESOURCE there, cannot raise.

An executor that is not root gets bwrap's usual map (sandbox uid 1000 = its own uid, no
capabilities): one uid for the shim and the command, which may then trace the shim and forge
its report of what it left running (docs/executor.md).
"""

from __future__ import annotations

import os

SANDBOX_UID = 1000
HOST_UID = 2_000_000_000
"""Host uid (and gid) of the command's processes when the executor is root: no account uses it,
and it is below 2**31 and outside the ranges systemd allocates. The checkout belongs to it
(``BwrapProvider.owner``)."""
ROOT_HOST_UID = HOST_UID + 1
"""Host uid (and gid) of the sandbox's root (uid 0 inside) when the executor is root: the
shim's, another uid than the command's, and no account's either."""
_NOBODY = 65534

MAP = f"0 {ROOT_HOST_UID} 1\n{SANDBOX_UID} {HOST_UID} 1\n{_NOBODY} 0 1\n"
"""The sandbox's user namespace (uid and gid) when the executor is root: its root is
``ROOT_HOST_UID``, the command ``HOST_UID``; the host's root shows as ``nobody``, which only
bwrap's own processes are (module docstring)."""
NO_USERNS = "/proc/sys/user/max_user_namespaces"
"""Set to 0 in the sandbox's user namespace when the executor is root: no nested one (the
command lacks the CAP_SYS_RESOURCE that would set it back)."""
SHIM_CAPS = ("setuid", "setgid", "setpcap", "dac_read_search")
"""What the shim (the sandbox's root) keeps, in the sandbox's user namespace only: switching the
command to ``SANDBOX_UID`` with no capability at all, and entering a workdir the command made
that the sandbox's root could not search otherwise."""


def map_users(pid: int) -> None:
    """Write ``MAP`` as the uid and gid map of the user namespace of bwrap's child ``pid``.

    Raises:
        OSError: it could not be written (the child died already: bwrap says why).
    """
    for kind in ("uid", "gid"):
        _write(f"/proc/{pid}/{kind}_map", MAP)


def shim_user(setpriv: str) -> list[str]:
    """``setpriv`` making bwrap's process (still host root: nobody inside) the sandbox's root,
    ``ROOT_HOST_UID``, with ``SHIM_CAPS`` only (as root)."""
    caps = ",".join(f"+{c}" for c in SHIM_CAPS)
    return [
        setpriv,
        "--reuid=0",
        "--regid=0",
        "--clear-groups",
        f"--inh-caps=-all,{caps}",
        f"--ambient-caps=-all,{caps}",
        f"--bounding-set=-all,{caps}",
        "--",
    ]


def command_user(setpriv: str) -> list[str]:
    """``setpriv`` the shim runs the command through, as ``SANDBOX_UID`` with no capability
    (none permitted, inheritable, ambient or in its bounding set; as root)."""
    return [
        setpriv,
        f"--reuid={SANDBOX_UID}",
        f"--regid={SANDBOX_UID}",
        "--clear-groups",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--bounding-set=-all",
        "--",
    ]


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
