"""The overlay a bwrap command sees its checkout through (``Spawn.overlay``): its writes kept
apart in a layer of its own, merged afterwards at the cost of what it changed
(``infra.exec.layers``).

A layer is ``<data>/checkouts/.layers/<tenant>/<workspace>/<random>/`` (``layer_dir``; on
the checkout's filesystem, so that a merge is a ``renameat``): ``upper`` (what the command
writes; the checkout's owner's, with the tree's mode), ``work`` (the overlay's own) and
``merged`` (the mount point). Outside the checkout's home, so that what the home holds is what
the checkout's quota was kept with; while a command runs, its quota counts its layers as well.

Who mounts it, and why not bwrap's ``--overlay``. bwrap mounts in the sandbox's user
namespace, where overlayfs takes ``userxattr``, which forces ``redirect_dir=nofollow``: renaming
a directory of the lower layer (``git mv src lib``, Python's ``os.rename``) then fails with
``EXDEV``. So the executor (root) mounts it itself, with ``redirect_dir=on``, in a mount
namespace of its own made for this sandbox only (``unshare --mount``: the mount is never
in the host's namespace, and goes when the sandbox's last process does), and bwrap binds the
mount point at ``/workspace``. Its attributes are ``trusted.overlay.*``, which no process
without CAP_SYS_ADMIN in the host's user namespace (the command) can set or forge. ``index``
and ``metacopy`` are off: a file with several hard links in the tree is copied up under the
one name written (its other names keep the old content), as in any container's overlay.
An executor that is not root, or whose data directory's filesystem cannot be an overlay's upper
layer (``probe`` says why), runs commands on the checkout itself and walks it afterwards.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from pathlib import Path

from infra.exec.layers import MERGED, UPPER, WORK
from infra.safefs import Dir, Owner, remove_tree

LAYERS = ".layers"
"""Under ``<data>/checkouts``: the layers, by checkout (see the module docstring)."""
OPTIONS = "redirect_dir=on,index=off,metacopy=off"
_SCRIPT = 'mount -t overlay quill -o "$1" "$2" || exit 125; shift 2; exec -a bwrap "$@"'
"""Run by bash in the sandbox's new mount namespace: mount the layer, then become bwrap."""


def layer_dir(checkouts: Path, home: Path) -> Path:
    """Where the layers of the checkout at ``home`` (under ``checkouts``) are."""
    return checkouts / LAYERS / home.relative_to(checkouts)


def make(checkouts: Path, tree: Path, owner: Owner | None) -> Path:
    """A new layer for a command on ``tree`` (a checkout's ``tree/`` under ``checkouts``)."""
    layers = layer_dir(checkouts, tree.parent)
    layers.mkdir(mode=0o700, parents=True, exist_ok=True)
    layer = layers / secrets.token_hex(8)
    layer.mkdir(mode=0o700)
    (layer / WORK).mkdir(mode=0o700)
    (layer / MERGED).mkdir(mode=0o755)
    upper = layer / UPPER
    upper.mkdir(mode=0o700)
    if owner is not None:
        os.chown(upper, *owner)
    os.chmod(upper, tree.stat().st_mode & 0o7777)
    return layer


def remove(layer: Path) -> None:
    """Remove a layer (what is left of it after a merge, or all of it), and its checkout's
    directory of layers if that is empty then."""
    if os.path.lexists(layer):
        with Dir.open(layer.parent) as parent:
            remove_tree(parent, layer.name)
    with contextlib.suppress(OSError):
        layer.parent.rmdir()


def wrap(bash: str, tree: Path, layer: Path, argv: list[str]) -> list[str]:
    """``argv`` (bwrap's) run in a new mount namespace where ``layer`` is mounted over
    ``tree`` at ``layer/merged``. The paths are relative to ``tree`` (bwrap starts there), so
    no option holds a name the mount would parse (``,`` or ``:``)."""
    unshare = shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin") or "unshare"
    there = os.path.relpath(layer, tree)
    options = f"lowerdir=.,upperdir={there}/{UPPER},workdir={there}/{WORK},{OPTIONS}"
    return [
        unshare,
        "--mount",
        "--propagation",
        "private",
        "--",
        bash,
        "-c",
        _SCRIPT,
        "bwrap",
        options,
        f"{there}/{MERGED}",
        *argv,
    ]


def probe(directory: Path) -> str | None:
    """Why an overlay cannot be used for checkouts under ``directory`` (None: it can): not
    root, no ``unshare``, or the kernel refuses the mount or a directory rename in it."""
    if os.geteuid() != 0:
        return "the executor is not root"
    if shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin") is None:
        return "no unshare (util-linux)"
    directory.mkdir(parents=True, exist_ok=True)
    home = directory / f".probe-{secrets.token_hex(6)}"
    tree = home / "tree"
    try:
        (tree / "a").mkdir(parents=True)
        layer = make(home, tree, None)
        script = 'mount -t overlay quill -o "$1" "$2" && mv "$2/a" "$2/b" && test -d "$2/b"'
        argv = wrap("bash", tree, layer, ["true"])
        argv[argv.index(_SCRIPT)] = script
        done = subprocess.run(
            argv[: argv.index("bwrap") + 3],
            cwd=tree,
            capture_output=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
            return f"cannot mount an overlay under {directory}: {why}"
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot mount an overlay under {directory}: {exc}"
    finally:
        if os.path.lexists(home):
            with Dir.open(directory) as parent:
                remove_tree(parent, home.name)
