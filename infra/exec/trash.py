"""Where the executor's removed directories go: renamed into a trash directory at once, removed
from there a bounded amount at a time, and left there (quarantined) if they cannot be.

A checkout (``infra.exec.checkout``) is removed when it is evicted, purged, rebuilt, or was
built for one command at an older version; its tree is a sandboxed command's, which may have
made it as deep, wide or odd as it liked. Removing it must never break the executor: a
``shutil.rmtree`` raised ``RecursionError`` on a tree 1,000 levels deep (Python's recursion
limit), after which every command of that workspace failed, and a tree left over from before
a restart stopped the executor at every start.

So ``discard`` first renames the directory into the trash (one ``renameat``, whatever the tree
holds: its place is free at once for a new checkout), then removes it with
``safefs.remove_tree`` (iterative, a bounded number of descriptors), at most ``budget`` entries
now. Anything left, and anything that failed, stays in the trash: ``empty`` goes on with it
later, ``ENTRIES`` at a time (the executor runs it in the background, and at start for what an
earlier executor left). An entry that fails is logged once and not tried again by this
process: it is quarantined in the trash until the next start (or an operator) removes it.
The trash is a dot-directory of the checkouts' directory: nothing that lists checkouts sees it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from infra.safefs import Dir, remove_tree, temp_name

log = logging.getLogger("quill.executor")

ENTRIES = 10_000
"""Entries ``empty`` removes per call (the caller calls again: a thread is never held long)."""
INLINE = 200_000
"""Entries ``discard`` removes before it returns by default (a checkout within its quota is
removed whole; more waits in the trash for ``empty``)."""


class Trash:
    """A trash directory (see the module docstring); made when first needed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failed: set[str] = set()
        """Names in the trash whose removal failed in this process (quarantined)."""
        self._busy: set[str] = set()
        """Names a ``discard`` is removing (in another thread): ``empty`` leaves them alone."""

    def discard(self, path: Path, budget: int | None = INLINE) -> bool:
        """Move ``path`` (a directory, a file, a link, or nothing) into the trash and remove
        at most ``budget`` entries of it now (None: all). Returns whether nothing of it is
        left; what is left is for ``empty``. Blocking: run it in a thread.

        Raises:
            OSError: ``path`` could neither be moved nor removed where it is (it may be
                partly removed).
        """
        if not os.path.lexists(path):
            return True
        name = temp_name()
        self._busy.add(name)
        try:
            try:
                self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.rename(path, self.path / name)
            except FileNotFoundError:
                return True
            except OSError as exc:  # not on the trash's filesystem: removed where it is
                log.warning("cannot move %s to %s (%s): removing it there", path, self.path, exc)
                with Dir.open(path.parent) as parent:
                    remove_tree(parent, path.name)
                return True
            return self._remove(name, budget)
        finally:
            self._busy.discard(name)

    def empty(self, budget: int = ENTRIES) -> bool:
        """Remove at most ``budget`` entries of what the trash holds (but what failed before);
        whether nothing is left to do. Blocking: run it in a thread."""
        try:
            names = sorted(set(os.listdir(self.path)) - self.failed - self._busy)
        except FileNotFoundError:
            return True
        for name in names:
            if not self._remove(name, budget):
                return False
        return True

    def _remove(self, name: str, budget: int | None) -> bool:
        """Remove the trash's entry ``name`` (at most ``budget`` entries); a failure is logged
        and quarantines it (counted as done)."""
        try:
            with Dir.open(self.path) as trash:
                return remove_tree(trash, name, budget)
        except Exception as exc:  # whatever it is, the executor goes on without this tree
            self.failed.add(name)
            log.warning(
                "cannot remove %s (%s): left there; remove it by hand", self.path / name, exc
            )
            return True

    def pending(self) -> bool:
        """Whether the trash holds something ``empty`` would remove."""
        with contextlib.suppress(FileNotFoundError), os.scandir(self.path) as entries:
            return any(e.name not in self.failed and e.name not in self._busy for e in entries)
        return False
