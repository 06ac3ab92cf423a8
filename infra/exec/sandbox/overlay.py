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
``EXDEV``. So the executor (root) has it mounted with ``redirect_dir=on`` by its mounter, in a
mount namespace of the mounter's own, never the host's (``sandbox.mounter``), and bwrap, started
in that namespace, binds the mount point at ``/workspace``. Its attributes are
``trusted.overlay.*``, which no process without CAP_SYS_ADMIN in the host's user namespace (the
command) can set or forge. ``index`` and ``metacopy`` are off: a file with several hard links
in the tree is copied up under the one name written (its other names keep the old content), as
in any container's overlay. The options name the layers relative to the tree (the mounter
works from there): ``/proc/self/mountinfo`` in the sandbox shows no host path of them.
An executor that is not root, or whose data directory's filesystem cannot be an overlay's upper
layer (``probe`` says why), runs commands on the checkout itself and walks it afterwards.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from infra.exec.layers import MERGED, UPPER, WORK
from infra.exec.sandbox.mounter import UTIL_PATH, Mounter
from infra.safefs import Dir, Owner, remove_tree

LAYERS = ".layers"
"""Under ``<data>/checkouts``: the layers, by checkout (see the module docstring)."""
OPTIONS = "redirect_dir=on,index=off,metacopy=off,volatile"
"""``volatile``: no sync of the upper filesystem, not even when the overlay is unmounted (the
sandbox's end waited for a sync of the whole data disk: +50 ms a command, measured). A layer
is worth nothing after a crash anyway: the executor removes what it finds at its start, and
the checkout is rebuilt from the log (its ``dirty`` mark)."""


def layer_dir(checkouts: Path, home: Path) -> Path:
    """Where the layers of the checkout at ``home`` (under ``checkouts``) are."""
    return checkouts / LAYERS / home.relative_to(checkouts)


MAKE_ATTEMPTS = 8
"""How often ``make`` tries again when its directory of layers went away meanwhile (a
checkout evicted: ``remove`` itself never takes it; it did, and under load one ``exec`` in a
thousand met ``INTERNAL: FileNotFoundError``, then ``FileExistsError`` from ``Path.mkdir``'s
own check racing the removal)."""


def make(checkouts: Path, tree: Path, owner: Owner | None) -> Path:
    """A new layer for a command on ``tree`` (a checkout's ``tree/`` under ``checkouts``)."""
    layers = layer_dir(checkouts, tree.parent)
    for attempt in range(MAKE_ATTEMPTS):
        layer = layers / secrets.token_hex(8)
        try:
            layers.mkdir(mode=0o700, parents=True, exist_ok=True)
            layer.mkdir(mode=0o700)
            break
        except (FileNotFoundError, FileExistsError):
            if attempt == MAKE_ATTEMPTS - 1:
                raise
    (layer / WORK).mkdir(mode=0o700)
    (layer / MERGED).mkdir(mode=0o755)
    upper = layer / UPPER
    upper.mkdir(mode=0o700)
    if owner is not None:
        os.chown(upper, *owner)
    os.chmod(upper, tree.stat().st_mode & 0o7777)
    return layer


def remove(layer: Path) -> None:
    """Remove a layer (what is left of it after a merge, or all of it). Its checkout's
    directory of layers stays (another command of the checkout may be making its layer there
    now): it goes with the checkout (``Checkouts``' eviction and purge)."""
    if os.path.lexists(layer):
        with Dir.open(layer.parent) as parent:
            remove_tree(parent, layer.name)


def options(tree: Path, layer: Path) -> str:
    """The overlay's mount options, its paths relative to ``tree`` (no ``,`` or ``:`` in a
    name the kernel would parse)."""
    there = os.path.relpath(layer, tree)
    return f"lowerdir=.,upperdir={there}/{UPPER},workdir={there}/{WORK},{OPTIONS}"


def probe(directory: Path, mounter: Mounter) -> str | None:
    """Why an overlay cannot be used for checkouts under ``directory`` (None: it can): not
    root, no util-linux, or the kernel refuses the mount (``redirect_dir=on``, ``volatile``)
    on that filesystem."""
    if os.geteuid() != 0:
        return "the executor is not root"
    if shutil.which("nsenter", path=UTIL_PATH) is None:
        return "no nsenter (util-linux)"
    directory.mkdir(parents=True, exist_ok=True)
    home = directory / f".probe-{secrets.token_hex(6)}"
    tree = home / "tree"
    try:
        tree.mkdir(parents=True)
        layer = make(home, tree, None)
        mounter.mount(tree, str(layer / MERGED), options(tree, layer))
        mounter.unmount(layer / MERGED)
        return None
    except OSError as exc:
        return f"cannot mount an overlay under {directory}: {exc}"
    finally:
        if os.path.lexists(home):
            with Dir.open(directory) as parent:
                remove_tree(parent, home.name)
