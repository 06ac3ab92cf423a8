"""What a bwrap sandbox shows: bwrap's options (namespaces, capabilities, mounts, /etc).

Only ``bwrap`` uses this module. The checkout is read-write at ``WORKSPACE``; /tmp is a tmpfs
of at most ``Limits.memory_bytes``, /dev/shm of 64 MiB (without a cgroup, each on top of what
the processes hold); the rest is read-only: the host's /usr and its links (``system_view``), a
curated /etc (``etc``), the kernel-global parts of /proc (``PROC_READ_ONLY``).

What it sees of the host. bwrap's options come from a memfd (``--args``) and its argv[0] is
``bwrap``: /proc/1/cmdline inside shows ``bwrap --args N -- setpriv ... bash -c SHIM ...``;
the host's root and every other host uid show as nobody (65534, ``users``); bwrap is started in
the checkout (``cwd``), which is how ``sweep`` still knows an orphan. What cannot be hidden:
/proc/self/mountinfo gives each bind mount's source as its path within its filesystem (the
kernel prints the directory's path from that filesystem's root), so the checkout shows as
``<data>/checkouts/<tenant>/<workspace>/tree`` relative to the filesystem holding the data
directory: nothing above it when that is a filesystem of its own.
"""

from __future__ import annotations

import os
from pathlib import Path

from infra.exec.sandbox import common
from infra.exec.sandbox.interface import Limits, Spawn
from infra.exec.sandbox.users import NO_USERNS, SANDBOX_UID, SHIM_CAPS

WORKSPACE = "/workspace"

PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "pressure")
"""Kernel-global parts of /proc the command could write by their mode alone (``pressure``: a
PSI trigger per open file, 0666), shown read-only. bwrap covers the first four itself only
when its own uid inside is 0, which it is not here (``users``)."""
_SHM_BYTES = 64 * 1024**2
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


def etc(network: bool) -> dict[str, tuple[str, str]]:
    """The files written into the sandbox's /etc: its path: (the memfd's name, the text).
    /etc/hosts only without a network (with one, the host's)."""
    files = {
        "/etc/passwd": ("passwd", _PASSWD),
        "/etc/group": ("group", _GROUP),
        "/etc/nsswitch.conf": ("nsswitch", _NSSWITCH),
        "/etc/gitconfig": ("gitconfig", _GITCONFIG),
    }
    if not network:
        files["/etc/hosts"] = ("hosts", _HOSTS)
    return files


def options(
    checkout: Path,
    spawn: Spawn,
    limits: Limits,
    cwd: str,
    data: dict[str, int],
    *,
    root: bool,
    system: list[str],
    shims: dict[str, str],
) -> list[str]:
    """bwrap's options for a sandbox over ``checkout`` (at ``WORKSPACE``, the command in
    ``cwd``): ``data`` maps a path inside (or ``"seccomp"``: the filter) to a descriptor of its
    content; ``root``: the executor is root (``users``); ``system``: ``system_view()``;
    ``shims``: the shim links (``common.shim_links``)."""
    opts = ["--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
    if not root:  # as root, bwrap cannot with --userns-block-fd: NO_USERNS
        opts += ["--disable-userns"]
    opts += ["--hostname", "sandbox"]
    if spawn.network:
        opts += ["--share-net"]
    if root:
        opts += ["--cap-drop", "ALL"]
        for cap in SHIM_CAPS:
            opts += ["--cap-add", f"CAP_{cap.upper()}"]
    else:
        opts += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    opts += system  # /etc made 0755 first: a bind's missing parents would be 0700
    if spawn.network:
        opts += ["--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
        opts += ["--ro-bind-try", "/etc/hosts", "/etc/hosts"]
    if shims:
        opts += ["--perms", "0755", "--dir", common.SHIMS]
        for name, target in shims.items():
            opts += ["--symlink", target, f"{common.SHIMS}/{name}"]
    for dest, data_fd in data.items():
        if dest == NO_USERNS:
            continue
        if dest == "seccomp":
            opts += ["--seccomp", str(data_fd)]
        else:
            opts += ["--perms", "0644", "--ro-bind-data", str(data_fd), dest]
    opts += ["--proc", "/proc", "--dev", "/dev"]
    if NO_USERNS in data:
        opts += ["--file", str(data[NO_USERNS]), NO_USERNS]
    for name in PROC_READ_ONLY:  # after the --file above: it writes into /proc/sys
        opts += ["--ro-bind-try", f"/proc/{name}", f"/proc/{name}"]
    opts += ["--perms", "1777", "--size", str(limits.memory_bytes), "--tmpfs", "/tmp"]
    opts += ["--perms", "1777", "--size", str(_SHM_BYTES), "--tmpfs", "/dev/shm"]
    opts += ["--bind", str(checkout), WORKSPACE]
    for host, inside in spawn.ro_binds:
        opts += ["--ro-bind", str(host), inside]
    opts += ["--remount-ro", "/", "--chdir", cwd]
    return opts


def system_view() -> list[str]:
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
