"""A command's changes kept apart in an overlay, merged into its checkout at the cost of what it
changed.

Under bwrap, with ``Provider.overlays``, a command sees its checkout's ``tree/`` through an
overlay (``infra.exec.sandbox.overlay``): ``tree/`` is the lower layer, which the command
cannot change, and everything it writes lands in a fresh *upper* directory, its layer's.
When it has ended, ``merge`` moves what the upper directory holds into ``tree/`` and says
which paths it touched; capture (``infra.exec.capture``) then looks at those paths only. So
neither the merge nor the capture walks the tree: a command that changed one file of 100,000
costs what one file costs.

What the upper directory holds, as the kernel's overlayfs writes it (``Documentation/
filesystems/overlayfs.rst``; mounted by root, so its attributes are ``trusted.overlay.*``,
which the command, without CAP_SYS_ADMIN in the host's user namespace, cannot set):

* a file, link, FIFO or socket: new, or replacing the tree's entry (a file the command only
  opened for writing, or chmod'ed, is *copied up* whole: it is here too). Moved into ``tree/``
  with ``renameat`` (same filesystem: no copy).
* a *whiteout* (a character device 0/0): the tree's entry of that name was removed.
* a directory marked *opaque* (``trusted.overlay.opaque`` = ``y``): made where the tree had
  something the command removed; nothing of the tree's entry below it shows.
* a directory with ``trusted.overlay.redirect``: a directory of the tree the command renamed
  (the kernel moves a lower directory only so, ``redirect_dir=on``); the value is its path in
  the tree (``/a/b``) or its name in its parent's (``b``). Its contents are the tree's there,
  with what the upper directory holds on top.
* any other directory: the tree's, with changes inside (copied up as the path to them), or a
  new one.

The merge: first every renamed directory of the tree is set aside (renamed to a temporary name
at the root, deepest first, so that a move out of a moved directory finds its source), then
the upper directory is walked, parents first: a whiteout removes the tree's entry; a renamed
directory is put back at its new path; an opaque directory, or one where the tree has none,
replaces the tree's entry (moved whole when nothing in it is a whiteout or a rename, else made
and filled); a merged directory takes the mode the command gave it; anything else replaces the
tree's entry. Every name goes through ``infra.safefs`` on both sides (no link followed), and
the whole is bounded in descriptors like any ``safefs.walk``.

What a merge costs: two walks of the upper directory (what the command wrote), a ``renameat``
per entry, and, for what it removed, a walk of what it removed (to count the bytes it frees:
``Merged.grown``, what the checkout's quota is kept with).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from infra.safefs import Dir, open_path, temp_name, walk

log = logging.getLogger("quill.executor")

UPPER = "upper"
WORK = "work"
MERGED = "merged"
"""A layer's directories: the command's changes, the overlay's own work area, the mount point."""
PRIVATE = "trusted.overlay."
OPAQUE = PRIVATE + "opaque"
REDIRECT = PRIVATE + "redirect"

How = Literal["dir", "all", "gone"]
"""What a merge did at a path: ``dir``, a directory of the tree kept (changes below it are
listed apart); ``all``, the path and everything below it are new or replaced; ``gone``, what
the tree had there was removed."""


@dataclass
class Merged:
    """What ``merge`` changed in the tree."""

    touched: list[tuple[str, How]] = field(default_factory=list)
    """Parents first."""
    grown: int = 0
    """Bytes the tree holds more (fewer, negative) after the merge, as the quota counts."""
    entries: int = 0
    """Entries (inodes) more."""
    failed: int = 0
    """Entries that could not be merged (logged; left out of the tree)."""


def file_bytes(st: os.stat_result) -> int:
    """What one entry counts for the quota: its blocks, a regular file at least its size."""
    blocks = st.st_blocks * 512
    return max(blocks, st.st_size) if stat.S_ISREG(st.st_mode) else blocks


def whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def merge(tree: Dir, layer: Path) -> Merged:
    """Move what ``layer``'s upper directory holds into ``tree`` (see the module docstring);
    blocking: run it in a thread. What is left in the layer (whiteouts, its work area) is the
    caller's to remove."""
    with Dir.open(layer / UPPER) as upper:
        run = _Merge(tree, upper)
        run.run()
    return run.out


class _Merge:
    def __init__(self, tree: Dir, upper: Dir) -> None:
        self.tree, self.upper = tree, upper
        self.out = Merged()
        self.flags: dict[str, tuple[bool, str | None]] = {}
        """Per directory of the upper one: (opaque, the tree path it was renamed from)."""
        self.moving: dict[str, str] = {}
        """Per renamed directory's new path: the temporary name its tree directory waits at."""
        self.links: set[tuple[int, int]] = set()
        self.kept: list[tuple[str, int]] = []
        """Merged directories and their bytes before (they grow with what is moved in)."""
        self._at: tuple[str, Dir] | None = None

    def run(self) -> None:
        try:
            self._mode(os.fstat(self.upper.fd), self.tree)
            self._read_flags()
            self._set_aside()
            for rel, parent, name, st in walk(self.upper, lambda _: False):
                try:
                    self._entry(rel, parent, name, st)
                except OSError as exc:
                    self.out.failed += 1
                    log.warning("merge: %r not merged: %s", rel, exc)
            for rel, before in self.kept:
                with contextlib.suppress(OSError):
                    here = open_path(self.tree, rel)
                    if here is not None:
                        with here:
                            self.out.grown += file_bytes(os.fstat(here.fd)) - before
            for rel, temp in self.moving.items():  # never reached (a parent failed)
                log.warning("merge: renamed directory %r not merged", rel)
                with contextlib.suppress(OSError):
                    self._remove(self.tree, temp)
        finally:
            if self._at is not None:
                self._at[1].close()

    # ------------------------------------------------------------------ renames
    def _read_flags(self) -> None:
        """Each upper directory's opacity and rename source (a path of the tree)."""
        lower: dict[str, str | None] = {"": ""}
        for rel, parent, name, st in walk(self.upper, lambda _: False):
            if not stat.S_ISDIR(st.st_mode):
                continue
            try:
                with parent.open_dir(name, expect=st) as here:
                    opaque = _xattr(here, OPAQUE) == b"y"
                    redirect = _xattr(here, REDIRECT)
            except OSError:
                continue
            base = lower.get(rel.rpartition("/")[0])
            source: str | None = None
            if opaque:
                mine = None
            elif redirect is not None:
                target = os.fsdecode(redirect)
                if target.startswith("/"):
                    mine = _clean(target[1:])
                elif base is not None:
                    mine = _clean(f"{base}/{target}" if base else target)
                else:
                    mine = None
                source = mine if mine != rel else None
            else:
                mine = f"{base}/{name}" if base else (name if base is not None else None)
            lower[rel] = mine
            self.flags[rel] = (opaque, source)

    def _set_aside(self) -> None:
        """Rename every renamed directory's source to a temporary name at the tree's root,
        the deepest first (a source inside another source is out before that one moves)."""
        moves = [(rel, source) for rel, (_, source) in self.flags.items() if source is not None]
        moves.sort(key=lambda m: m[1].count("/"), reverse=True)
        for rel, source in moves:
            parent_path, _, name = source.rpartition("/")
            try:
                holder = open_path(self.tree, parent_path)
                if holder is None:
                    continue
                with holder:
                    st = holder.lstat(name)
                    if st is None or not stat.S_ISDIR(st.st_mode):
                        continue
                    temp = temp_name()
                    holder.rename(name, temp, into=self.tree)
            except OSError as exc:
                log.warning("merge: cannot move %r: %s", source, exc)
                continue
            self.moving[rel] = temp
            self.out.touched.append((source, "gone"))

    # ------------------------------------------------------------------ entries
    def _tree_dir(self, rel: str) -> Dir:
        """The tree's directory ``rel`` (the one the walk is in: kept open while it is)."""
        if self._at is not None and self._at[0] == rel:
            return self._at[1]
        if self._at is not None:
            self._at[1].close()
            self._at = None
        found = open_path(self.tree, rel)
        if found is None:
            raise FileNotFoundError(f"{rel or '.'}: not a directory of the tree")
        self._at = (rel, found)
        return found

    def _entry(self, rel: str, parent: Dir, name: str, st: os.stat_result) -> None:
        there = self._tree_dir(rel.rpartition("/")[0])
        if whiteout(st):
            self._remove(there, name)
            self.out.touched.append((rel, "gone"))
            return
        if not stat.S_ISDIR(st.st_mode):
            self._remove(there, name)
            parent.rename(name, name, into=there)
            self._count(st)
            self.out.touched.append((rel, "all"))
            return
        opaque, _ = self.flags.get(rel, (False, None))
        temp = self.moving.pop(rel, None)
        if temp is not None:  # a renamed directory: the tree's, back at its new path
            self._remove(there, name)
            self.tree.rename(temp, name, into=there)
            with there.open_dir(name) as moved:
                self._mode(st, moved)
            self.out.touched.append((rel, "all"))
            return
        found = there.lstat(name)
        if not opaque and found is not None and stat.S_ISDIR(found.st_mode):
            with there.open_dir(name) as kept:  # the tree's, with changes below
                self._mode(st, kept)
                self.kept.append((rel, file_bytes(os.fstat(kept.fd))))
            self.out.touched.append((rel, "dir"))
            return
        self._remove(there, name)
        with parent.open_dir(name, expect=st) as here:
            whole = _plain(here)
            if whole is not None:
                for attr in _private(here):
                    os.removexattr(here.fd, attr)
        if whole is not None:  # nothing in it refers to the tree: moved as it is
            parent.rename(name, name, into=there)
            self.out.grown += whole[0] + file_bytes(st)
            self.out.entries += whole[1] + 1
        else:
            with there.ensure_dir(name) as made:
                self._mode(st, made)
                self._count(os.fstat(made.fd))
        self.out.touched.append((rel, "all"))

    def _count(self, st: os.stat_result) -> None:
        if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            if (st.st_dev, st.st_ino) in self.links:
                self.out.entries += 1
                return
            self.links.add((st.st_dev, st.st_ino))
        self.out.grown += file_bytes(st)
        self.out.entries += 1

    def _remove(self, there: Dir, name: str) -> None:
        """Remove the tree's ``name``, if any, counting what it frees."""
        st = there.lstat(name)
        if st is None:
            return
        if stat.S_ISDIR(st.st_mode):
            with there.open_dir(name, expect=st) as gone:
                freed, entries = _held(gone)
            self.out.grown -= freed + file_bytes(st)
            self.out.entries -= entries + 1
        else:
            self.out.grown -= file_bytes(st) if st.st_nlink == 1 else 0
            self.out.entries -= 1
        there.remove(name)

    def _mode(self, st: os.stat_result, directory: Dir) -> None:
        mode = stat.S_IMODE(st.st_mode) & 0o1777
        if stat.S_IMODE(os.fstat(directory.fd).st_mode) != mode:
            os.fchmod(directory.fd, mode)


def _xattr(directory: Dir, name: str) -> bytes | None:
    try:
        return os.getxattr(directory.fd, name)
    except OSError:
        return None


def _private(directory: Dir) -> list[str]:
    try:
        return [a for a in os.listxattr(directory.fd) if a.startswith(PRIVATE)]
    except OSError:
        return []


def _clean(path: str) -> str | None:
    """A redirect's path, if it is a plain relative one (no empty, ``.`` or ``..`` part)."""
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return path


def _plain(directory: Dir) -> tuple[int, int] | None:
    """(bytes, entries) below ``directory`` if nothing there is a whiteout or a renamed
    directory (it can be moved as it is); None if something is."""
    total = entries = 0
    seen: set[tuple[int, int]] = set()
    for _, parent, name, st in walk(directory, lambda _: False):
        if whiteout(st):
            return None
        if stat.S_ISDIR(st.st_mode):
            try:
                with parent.open_dir(name, expect=st) as here:
                    if _xattr(here, REDIRECT) is not None:
                        return None
            except OSError:
                return None
        elif st.st_nlink > 1:
            if (st.st_dev, st.st_ino) in seen:
                entries += 1
                continue
            seen.add((st.st_dev, st.st_ino))
        total += file_bytes(st)
        entries += 1
    return total, entries


def _held(directory: Dir) -> tuple[int, int]:
    """(bytes, entries) below ``directory``, hard links once (what removing it frees)."""
    total = entries = 0
    seen: set[tuple[int, int]] = set()
    for _, _, _, st in walk(directory, lambda _: False):
        entries += 1
        if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
        total += file_bytes(st)
    return total, entries
