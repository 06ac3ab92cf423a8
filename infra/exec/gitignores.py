"""A checkout's ``.gitignore`` files, read from its ``tree/`` as capture needs them.

Capture (``infra.exec.capture``) asks ``core.gitignore.Gitignores`` whether a path it found is
ignored; that reads the ``.gitignore`` of each directory above the path, and only those: a
command that changed three files costs the ``.gitignore`` files on their three paths (an
``lstat`` each), never a walk of the tree. Each file compiled is kept per checkout with the
stat signature it had (``Cache``): read and compiled again only when it changed (its size,
times or inode), by a command or by a sync from the log.

A ``.gitignore`` is the command's: it is read without following any link (one that is a link
is not honoured, whatever it points at), up to ``core.gitignore.MAX_FILE_BYTES`` (a larger one
is not honoured); what is not honoured is said (``Lookup.warnings``) once per change of it.

**A budget.** Matching is linear in a path (``core.gitignore``), but hostile patterns make its
constant large (RE2's automaton for thousands of nested ``**`` patterns: ~10 ms a path), and a
command can make many paths and many ``.gitignore`` files. So the time one capture spends on
``.gitignore`` files (reading, compiling, matching: the thread's CPU time) is bounded by
``BUDGET_S``: past it, the rest of the capture's paths are not checked against them (they are
committed, as with the option off) and the reply says so. Never reached by an ordinary tree:
a 400-line ``.gitignore`` costs ~1 ms to compile and microseconds a path.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable

from core.gitignore import MAX_FILE_BYTES, NAME, Gitignores, IgnoreFile, Unusable
from core.lru import LRU
from infra.exec.manifest import Sig
from infra.safefs import Dir, parent_of

CACHED = 256
"""Compiled ``.gitignore`` files a checkout keeps (the least recently used dropped past it)."""
BUDGET_S = 10.0
"""CPU seconds one capture may spend on ``.gitignore`` files (then it stops honouring them)."""

Entry = tuple[Sig, IgnoreFile | None]


def _sig(st: os.stat_result) -> Sig:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class Cache:
    """One checkout's compiled ``.gitignore`` files, by directory (``""``: the root)."""

    def __init__(self, size: int = CACHED) -> None:
        self._files: LRU[str, Entry] = LRU(size)
        self.reads = 0
        """Files read and compiled (what the cache did not spare)."""

    def lookup(
        self, root: Dir, budget_s: float = BUDGET_S, clock: Callable[[], float] = time.thread_time
    ) -> Lookup:
        """The ``.gitignore`` files of ``root`` (a checkout's ``tree/``), for one capture."""
        return Lookup(self, root, budget_s, clock)

    def get(self, directory: str, sig: Sig) -> Entry | None:
        found = self._files.get(directory)
        return found if found is not None and found[0] == sig else None

    def put(self, directory: str, entry: Entry) -> None:
        self._files.put(directory, entry)


class Lookup(Gitignores):
    """``Gitignores`` over a checkout's tree, for one capture (each file read once in it)."""

    def __init__(
        self, cache: Cache, root: Dir, budget_s: float, clock: Callable[[], float]
    ) -> None:
        super().__init__(self._read)
        self._cache, self._root = cache, root
        self._budget, self._left, self._clock = budget_s, budget_s, clock
        self.warnings: list[str] = []
        """The ``.gitignore`` files not honoured, and why (each once per change of it)."""

    def ignored(self, path: str, is_dir: bool) -> bool:
        """``Gitignores.ignored`` within the budget; past it, False (committed)."""
        if self._left <= 0:
            return False
        began = self._clock()
        try:
            return super().ignored(path, is_dir)
        finally:
            self._left -= self._clock() - began
            if self._left <= 0:
                self.warnings.append(
                    f".gitignore files: over {self._budget:g} s of matching in one command's "
                    "changes: the rest of its paths were not checked against them"
                )

    def _read(self, directory: str) -> IgnoreFile | None:
        path = f"{directory}/{NAME}" if directory else NAME
        with parent_of(self._root, path) as found:
            if found is None:
                return None
            parent, name = found
            st = parent.lstat(name)
            if st is None or not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                return None  # none, or a directory or a FIFO of that name: as git, nothing
            sig = _sig(st)
            cached = self._cache.get(directory, sig)
            if cached is not None:
                return cached[1]
            compiled: IgnoreFile | None = None
            if stat.S_ISLNK(st.st_mode):
                self.warnings.append(f"{path}: a symlink: not honoured")
            elif st.st_size > MAX_FILE_BYTES:
                self.warnings.append(
                    f"{path}: over {MAX_FILE_BYTES // 1024} KiB ({st.st_size} bytes): not honoured"
                )
            else:
                try:  # the file listed, never what a link or a swap put there since
                    data, st = parent.read_file(name, MAX_FILE_BYTES, st)
                except OSError:
                    return None  # changed meanwhile: not kept, read again next time
                self._cache.reads += 1
                try:
                    compiled = IgnoreFile(data)
                except Unusable as exc:
                    self.warnings.append(f"{path}: {exc}: not honoured")
            self._cache.put(directory, (_sig(st), compiled))
            return compiled
