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
``safefs.remove_tree`` (iterative, a bounded number of descriptors open), at most ``budget``
entries now, ``STEP`` at a time. Anything left stays in the trash: ``empty`` goes on with it
later (the executor runs it in the background, and at start for what an earlier executor
left). An entry whose removal fails is logged once and not tried again by this process: it is
quarantined in the trash until the next start (or an operator) removes it. The trash is a
dot-directory of the checkouts' directory: nothing that lists checkouts sees it. ``close``
stops every removal at its next step and waits for them (the executor is stopping).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from infra.safefs import Dir, remove_tree, temp_name

log = logging.getLogger("quill.executor")

STEP = 1_000
"""Entries removed between two looks at ``close``."""
ENTRIES = 10_000
"""Entries ``empty`` removes of each tree per call (the caller calls again: a thread is never
held long)."""
INLINE = 200_000
"""Entries ``discard`` removes before it returns by default (a checkout within its quota is
removed whole; more waits in the trash for ``empty``)."""


class Trash:
    """A trash directory (see the module docstring); made when first needed. Its methods may
    run in several threads at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failed: set[str] = set()
        """Names in the trash whose removal failed in this process (quarantined)."""
        self._busy: set[str] = set()
        """Names being removed (by a ``discard``, or ``empty``): no one else touches them."""
        self._changed = threading.Condition()
        self._closed = False

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
        with self._removing(name):
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

    def empty(self, budget: int = ENTRIES) -> bool:
        """Remove what the trash holds (but what failed before, or another thread removes),
        at most ``budget`` entries of each tree in it; whether nothing is left to do.
        Blocking: run it in a thread."""
        if self._closed:
            return True
        try:
            names = sorted(os.listdir(self.path))
        except FileNotFoundError:
            return True
        for name in names:
            with self._changed:
                if name in self.failed or name in self._busy:
                    continue
                self._busy.add(name)
            try:
                if not self._remove(name, budget):
                    return self._closed
            finally:
                self._done(name)
        return True

    def pending(self) -> bool:
        """Whether the trash holds something ``empty`` would remove."""
        with contextlib.suppress(FileNotFoundError), os.scandir(self.path) as entries:
            with self._changed:
                skip = self.failed | self._busy
            return any(entry.name not in skip for entry in entries)
        return False

    def idle(self) -> bool:
        """Whether no removal is under way."""
        with self._changed:
            return not self._busy

    def close(self) -> None:
        """Stop every removal at its next step and wait until none runs (blocking). What is
        left stays in the trash for the next start."""
        with self._changed:
            self._closed = True
            self._changed.wait_for(lambda: not self._busy)

    @contextlib.contextmanager
    def _removing(self, name: str) -> Iterator[None]:
        with self._changed:
            self._busy.add(name)
        try:
            yield
        finally:
            self._done(name)

    def _done(self, name: str) -> None:
        with self._changed:
            self._busy.discard(name)
            self._changed.notify_all()

    def _remove(self, name: str, budget: int | None) -> bool:
        """Remove the trash's entry ``name``, at most ``budget`` entries (None: all) and
        ``STEP`` at a time until ``close``; whether it is gone. A failure is logged and
        quarantines it (counted as gone)."""
        left = budget
        try:
            with Dir.open(self.path) as trash:
                while not self._closed:
                    step = STEP if left is None else min(STEP, left)
                    if remove_tree(trash, name, step):
                        return True
                    if left is not None:
                        left -= step
                        if left <= 0:
                            return False
        except Exception as exc:  # whatever it is, the executor goes on without this tree
            with self._changed:
                self.failed.add(name)
            log.warning(
                "cannot remove %s (%s): left there; remove it by hand", self.path / name, exc
            )
            return True
        return False
