"""An in-memory workspace tree and what a change does to it.

``Tree`` holds the latest state of one workspace's files: files, directories, per-path file
versions (kept after a delete, so a recreated file continues its count), the version at which
each path last changed, the tree hash and counters. ``apply_change`` is the one definition of
what a change does: ``core.evolve`` folds an event's changes with it, and the writer's
decisions simulate theirs with it as they go. Mutations can be rolled back to a ``savepoint``.

A tree folded from the log knows every path's history. One the writer loads from its
projection (``partial``) holds the live paths' only, and those changed since: loading the
history of every path that ever was (a workspace's deleted files, build outputs, renamed
paths) cost the writer's first command after a restart O(history) (1.2 s at 100,000 events,
issue 29). A decision that reads another path's history (the file version a put continues,
whether something changed after an ``apply``'s base) names it in ``needs``; the writer looks
it up in its projection (two seeks a path) and ``learn`` s it first. A path the tree does
not know refuses to be guessed (``next_file_version``, ``last_change``): a need left out is
an error, never a reused etag.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import msgspec

from contracts import hashing
from contracts.events import AnyChange, MakeDir, PutFile, Remove
from contracts.paths import name, parent
from core.rows import Node


class FileNode(msgspec.Struct, frozen=True):
    """A file of the tree (a msgspec struct: made once per write by the writer, the reader and
    replay, it costs 0.07 µs to make where a frozen dataclass cost 1 µs)."""

    sha256: str
    size: int
    file_version: int
    executable: bool
    binary: bool
    created: datetime
    modified: datetime
    version: int

    @property
    def etag(self) -> str:
        return etag_of(self.file_version)


class DirNode(msgspec.Struct, frozen=True):
    created: datetime
    version: int


def etag_of(file_version: int) -> str:
    """A file's etag: ``v<file_version>`` (file versions never repeat for a path)."""
    return f"v{file_version}"


class Tree:
    """The latest state of one workspace's files and directories."""

    def __init__(self) -> None:
        self.files: dict[str, FileNode] = {}
        self.dirs: dict[str, DirNode] = {}
        self.children: dict[str, set[str]] = {"": set()}
        self.last_fv: dict[str, int] = {}
        self.changed: dict[str, int] = {}
        self._digests: dict[str, int] = {}
        """Each file's digest as the tree hash holds it: an overwrite or a removal takes it
        out without hashing the old entry again."""
        self.hash = 0
        self.total_bytes = 0
        self._journal: list[tuple[str, str, Any]] | None = None
        self.partial = False
        """Loaded from a projection: ``last_fv`` and ``changed`` hold the paths live at
        ``loaded_at``, those changed since and those ``learn`` t; another path's history is
        not here (its last change is at most ``loaded_at``)."""
        self.loaded_at = 0
        self.looked: set[str] = set()
        """Paths whose history was looked up (found or not)."""

    # ------------------------------------------------------------------ history
    def knows(self, path: str) -> bool:
        """Whether this tree holds ``path``'s whole history (its last file version)."""
        return not self.partial or path in self.last_fv or path in self.looked

    def knows_change(self, path: str, base: int) -> bool:
        """Whether this tree can tell if ``path`` changed after version ``base``."""
        return base >= self.loaded_at or path in self.changed or self.knows(path)

    def learn(self, path: str, last_fv: int | None, changed: int | None) -> None:
        """What the projection says of ``path``'s history (looked up for a decision):
        kept where this tree has nothing newer (a change since it was loaded)."""
        if last_fv and path not in self.last_fv:
            self.last_fv[path] = last_fv
        if changed and path not in self.changed:
            self.changed[path] = changed
        self.looked.add(path)

    def next_file_version(self, path: str) -> int:
        """The file version a put at ``path`` makes: one past the last it ever had.

        Raises:
            LookupError: the tree does not hold the path's history (a decision that did
                not name it in ``needs``: a bug, said loudly rather than an etag reused).
        """
        if not self.knows(path):
            raise LookupError(f"The history of {path} was not looked up")
        return self.last_fv.get(path, 0) + 1

    def last_change(self, path: str, base: int) -> int:
        """The version at which ``path`` last changed (0: never), as far as it matters
        whether that is after ``base``.

        Raises:
            LookupError: the tree cannot tell (not looked up; see ``next_file_version``).
        """
        if not self.knows_change(path, base):
            raise LookupError(f"The history of {path} was not looked up")
        return self.changed.get(path, 0)

    # ------------------------------------------------------------------ lookups
    def kind(self, path: str) -> str | None:
        """``"f"``, ``"d"`` or None; the root ``""`` is a directory."""
        if path in self.files:
            return "f"
        if path == "" or path in self.dirs:
            return "d"
        return None

    def names(self, directory: str) -> list[str]:
        return sorted(self.children.get(directory, ()))

    def walk(self, directory: str) -> Iterator[str]:
        """Every path below ``directory``, each parent before its children."""
        for child in self.names(directory):
            path = f"{directory}/{child}" if directory else child
            yield path
            if path in self.dirs:
                yield from self.walk(path)

    # ------------------------------------------------------------------ mutations
    def _record(self, what: str, key: str, old: Any) -> None:
        if self._journal is not None:
            self._journal.append((what, key, old))

    def set_file(self, path: str, node: FileNode) -> None:
        old = self.files.get(path)
        self._record("file", path, old)
        if old is not None:
            self._unhash_file(path, old)
        else:
            self.children.setdefault(parent(path), set()).add(name(path))
        self.files[path] = node
        digest = self._digests[path] = hashing.file_digest(path, node.sha256, node.executable)
        self.hash = hashing.tree_add(self.hash, digest)
        self.total_bytes += node.size

    def set_dir(self, path: str, node: DirNode) -> None:
        old = self.dirs.get(path)
        self._record("dir", path, old)
        if old is None:
            self.children.setdefault(parent(path), set()).add(name(path))
            self.children.setdefault(path, set())
            self.hash = hashing.tree_add(self.hash, hashing.dir_digest(path))
        self.dirs[path] = node

    def remove(self, path: str, version: int) -> int:
        """Remove ``path`` and everything below it; return the number of entries removed."""
        removed = 0
        if path in self.dirs:
            for child in list(self.names(path)):
                removed += self.remove(f"{path}/{child}" if path else child, version)
            self._record("dir", path, self.dirs[path])
            del self.dirs[path]
            self.children.pop(path, None)
            self.hash = hashing.tree_remove(self.hash, hashing.dir_digest(path))
        elif path in self.files:
            node = self.files.pop(path)
            self._record("file", path, node)
            self._unhash_file(path, node)
        else:
            return 0
        self.children.get(parent(path), set()).discard(name(path))
        self.mark_changed(path, version)
        return removed + 1

    def mark_changed(self, path: str, version: int) -> None:
        self._record("changed", path, self.changed.get(path))
        self.changed[path] = version

    def bump_file_version(self, path: str, file_version: int) -> None:
        if file_version > self.last_fv.get(path, 0):
            self._record("fv", path, self.last_fv.get(path))
            self.last_fv[path] = file_version

    def _unhash_file(self, path: str, node: FileNode) -> None:
        self.hash = hashing.tree_remove(self.hash, self._digests.pop(path))
        self.total_bytes -= node.size

    # ------------------------------------------------------------------ rollback
    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """Undo every mutation made inside the block if it raises (savepoints nest)."""
        outer = self._journal
        journal: list[tuple[str, str, Any]] = []
        self._journal = journal
        scalars = (self.hash, self.total_bytes)
        try:
            yield
        except BaseException:
            self._journal = None
            self._rollback(journal)
            self.hash, self.total_bytes = scalars
            self._journal = outer
            raise
        self._journal = outer
        if outer is not None:
            outer.extend(journal)

    def _rollback(self, journal: list[tuple[str, str, Any]]) -> None:
        for what, key, old in reversed(journal):
            if what == "file":
                self.files.pop(key, None)
                self._digests.pop(key, None)
                if old is None:
                    self.children.get(parent(key), set()).discard(name(key))
                else:
                    self.files[key] = old
                    self._digests[key] = hashing.file_digest(key, old.sha256, old.executable)
                    self.children.setdefault(parent(key), set()).add(name(key))
            elif what == "dir":
                if old is None:
                    self.dirs.pop(key, None)
                    self.children.get(parent(key), set()).discard(name(key))
                    self.children.pop(key, None)
                else:
                    self.dirs[key] = old
                    self.children.setdefault(parent(key), set()).add(name(key))
                    self.children.setdefault(key, set())
            elif what in ("changed", "fv"):
                table = self.changed if what == "changed" else self.last_fv
                if old is None:
                    table.pop(key, None)
                else:
                    table[key] = old


def place(tree: Tree, node: Node) -> None:
    """Put a projection's row (a file or directory as of some version) into ``tree``."""
    if node.kind == "d":
        tree.set_dir(node.path, DirNode(created=node.created, version=node.version))
        return
    assert node.sha256 is not None and node.file_version is not None
    tree.set_file(
        node.path,
        FileNode(
            node.sha256,
            node.size,
            node.file_version,
            node.executable,
            node.binary,
            node.created,
            node.modified,
            node.version,
        ),
    )


def plant(tree: Tree, revisions: list[tuple[Any, ...]], at: int) -> None:
    """Put into ``tree`` the paths live at version ``at`` among a compaction's revision rows
    (``CompactionManifest.revisions``: ``(path, version, until, parent, kind, sha256, size,
    file_version, executable, binary, created, modified, moved_from)``). The history of
    other paths is not in them: the tree is ``partial``, as one loaded from a projection."""
    tree.partial, tree.loaded_at = True, at
    for r in revisions:
        path, since, until = str(r[0]), int(r[1]), int(r[2])
        if not path or not since <= at < until:
            continue
        if r[4] == "d":
            tree.set_dir(path, DirNode(created=_time(r[10]), version=since))
        else:
            file_version = int(r[7])
            node = FileNode(
                str(r[5]), int(r[6]), file_version, bool(r[8]), bool(r[9]), _time(r[10]),
                _time(r[11]), since,
            )  # fmt: skip
            tree.set_file(path, node)
            tree.last_fv[path] = file_version
        tree.changed[path] = since


def _time(value: object) -> datetime:
    return datetime.fromisoformat(str(value))


def apply_change(tree: Tree, change: AnyChange, version: int, at: datetime) -> None:
    """Apply one change of a committed (or being decided) event to ``tree``."""
    if isinstance(change, PutFile):
        tree.set_file(
            change.path,
            FileNode(
                sha256=change.sha256,
                size=change.size,
                file_version=change.file_version,
                executable=change.executable,
                binary=change.binary,
                created=change.created,
                modified=at,
                version=version,
            ),
        )
        tree.bump_file_version(change.path, change.file_version)
        tree.mark_changed(change.path, version)
    elif isinstance(change, MakeDir):
        tree.set_dir(change.path, DirNode(created=at, version=version))
        tree.mark_changed(change.path, version)
    elif isinstance(change, Remove):
        tree.remove(change.path, version)
