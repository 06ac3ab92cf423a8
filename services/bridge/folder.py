"""The user's folder seen as a workspace: confined paths, its entries as ``Node``s, contents,
and the file versions a folder without a log gets.

Confinement. Every path has passed ``contracts.paths.normalize`` (``../x`` and ``/etc/passwd``
are refused there, with the server's message). ``locate`` then resolves it under the folder
with symbolic links followed: a path whose real path leaves the folder is ``ACCESS_DENIED``
with the same message, so a link inside the folder pointing out reads nothing. Walks
(listings, glob, grep, explore, counts) never follow a link: links are not shown at all, nor
are sockets, devices and names that are not valid workspace names (``contracts.paths``:
control or invisible characters, invalid UTF-8, not NFC). Mutations go through no link at
all (``locate_for_change``).
What is located is then opened from the folder's root one name at a time without following
any link (``infra.safefs``): a part swapped for a link after ``locate`` is not
found, never followed; walks open each directory from its parent's descriptor.

File versions (etags). A folder has no log, so the bridge counts: a file gets version 1 when
the bridge first sees it, and one more each time the bridge finds it changed (its stat
signature differs) or changes it itself. Etags are therefore ``v1``, ``v2``... as on a server,
exact while one bridge runs, and counted afresh by the next one.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from contracts.errors import ErrorCode, QuillError
from contracts.limits import DEFAULT_LIMITS, Limits
from contracts.paths import (
    ACCESS_DENIED_MESSAGE,
    MAX_NAME_BYTES,
    ancestors,
    check_name,
    display,
)
from core.content import as_text
from core.plan import LIVE
from core.rows import Node
from infra.safefs import Dir, open_path, parent_of
from infra.safefs import walk as walk_beneath

Sig = tuple[int, int, int, int]
"""(size, mtime_ns, ctime_ns, inode): a file whose signature differs has changed."""
SNIFF_BYTES = 64 * 1024
"""Of a file too large to read whole, the bytes that decide whether it is binary."""


def sig_of(st: os.stat_result) -> Sig:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _time(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, UTC)


def valid_name(entry_name: str) -> bool:
    """Whether a name on disk is a name a workspace path can have (``contracts.paths``: no
    byte that is not UTF-8, no control or invisible character, NFC, at most 255 bytes)."""
    return (
        bool(entry_name)
        and check_name(entry_name) is None
        and (len(entry_name.encode()) <= MAX_NAME_BYTES)
    )


@dataclass(slots=True)
class _Seen:
    file_version: int
    sig: Sig | None
    """None once the bridge saw it gone."""
    changed: int
    """The workspace version at which the bridge last saw it change."""


class FileVersions:
    """Per path, the file version the bridge has counted (thread-safe: walks run in threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, _Seen] = {}
        self._dirs: dict[str, int] = {}

    def observe(self, path: str, sig: Sig, version: int) -> tuple[int, int]:
        """``(file version, changed version)`` of the file at ``path`` as it is now."""
        with self._lock:
            seen = self._files.get(path)
            if seen is None:
                seen = self._files[path] = _Seen(1, sig, version)
            elif seen.sig != sig:
                seen.file_version, seen.sig, seen.changed = seen.file_version + 1, sig, version
            return seen.file_version, seen.changed

    def last(self, path: str) -> int:
        """The last file version counted for ``path`` (0: none), a deleted file's included."""
        with self._lock:
            seen = self._files.get(path)
            return seen.file_version if seen is not None else 0

    def wrote(self, path: str, file_version: int, sig: Sig, version: int) -> None:
        with self._lock:
            self._files[path] = _Seen(file_version, sig, version)

    def made(self, path: str, version: int) -> None:
        with self._lock:
            self._dirs[path] = version

    def dir_changed(self, path: str) -> int:
        with self._lock:
            return self._dirs.get(path, 1)

    def removed(self, path: str, version: int) -> None:
        prefix = path + "/"
        with self._lock:
            for key, seen in self._files.items():
                if key == path or key.startswith(prefix):
                    seen.sig, seen.changed = None, version
            for key in [k for k in self._dirs if k == path or k.startswith(prefix)]:
                del self._dirs[key]


class Folder:
    """A directory on this machine, answering as the workspace it is attached as."""

    def __init__(self, directory: Path, limits: Limits = DEFAULT_LIMITS) -> None:
        self.root = Path(os.path.realpath(directory))
        self.limits = limits
        self.versions = FileVersions()
        self.version = 1
        """The workspace version: 1 when attached, one more per committed mutation."""
        self.attached = self.updated = datetime.now(UTC)

    # ------------------------------------------------------------------ confinement
    def _inside(self, real: str) -> bool:
        root = str(self.root)
        return real == root or real.startswith(root.rstrip("/") + "/")

    def locate(self, path: str) -> Path:
        """The real location of the normalised ``path``, links followed.

        Raises:
            QuillError: ``ACCESS_DENIED`` when it leaves the folder.
        """
        real = os.path.realpath(self.root / path if path else self.root)
        if not self._inside(real):
            raise QuillError(ErrorCode.ACCESS_DENIED, ACCESS_DENIED_MESSAGE, {"path": path})
        return Path(real)

    def locate_for_change(self, path: str) -> Path:
        """Where to change the normalised ``path``: no part of it may be a link.

        Raises:
            QuillError: ``ACCESS_DENIED`` for a link (one leading out with the server's
                message).
        """
        for part in [*ancestors(path), path] if path else []:
            try:
                st = os.lstat(self.root / part)
            except FileNotFoundError:
                break
            except NotADirectoryError:
                break  # a file on the way: decide reports it
            if stat.S_ISLNK(st.st_mode):
                self.locate(part)  # a link leading out: the server's message
                raise QuillError(
                    ErrorCode.ACCESS_DENIED,
                    f"Access denied. {display(part)} is a symbolic link: a local workspace "
                    "is changed only through real paths",
                    {"path": path, "link": part},
                )
        return self.root / path if path else self.root

    # ------------------------------------------------------------------ entries
    def node_of(self, path: str, st: os.stat_result) -> Node:
        """The entry at ``path`` with stat ``st`` (contents not read: sha256 None, not
        binary)."""
        created = _time(min(st.st_ctime_ns, st.st_mtime_ns))
        modified = _time(st.st_mtime_ns)
        if stat.S_ISDIR(st.st_mode):
            changed = self.versions.dir_changed(path)
            return Node(
                path, "d", None, 0, None, False, False, created, modified, changed, LIVE, None
            )
        file_version, changed = self.versions.observe(path, sig_of(st), self.version)
        executable = bool(st.st_mode & 0o100)
        return Node(
            path, "f", None, st.st_size, file_version, executable, False, created, modified,
            changed, LIVE, None,
        )  # fmt: skip

    def node(self, path: str, real: Path) -> Node | None:
        """The entry at ``path`` (located at ``real``), None if there is none to show."""
        rel = self._relative(real)
        try:
            with Dir.open(self.root) as root:
                if not rel:
                    st: os.stat_result | None = os.fstat(root.fd)
                else:
                    with parent_of(root, rel) as found:
                        st = None if found is None else found[0].lstat(found[1])
        except OSError:
            return None
        if st is None or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            return None
        return self.node_of(path, st)

    def walk(
        self,
        path: str,
        real: Path,
        *,
        recursive: bool = True,
        prune: Callable[[str], bool] | None = None,
        max_depth: int | None = None,
    ) -> list[Node]:
        """The entries below directory ``path`` (located at ``real``), in path order: its
        children, or everything beneath it; ``prune(relative path)`` leaves a directory out
        with what it holds; no link is followed (blocking: call it in a thread)."""
        out: list[Node] = []

        def skip(rel: str) -> bool:
            return not valid_name(rel.rsplit("/", 1)[-1]) or (prune is not None and prune(rel))

        def enter(rel: str) -> bool:
            return recursive and (max_depth is None or rel.count("/") + 1 < max_depth)

        with Dir.open(self.root) as root:
            start = open_path(root, self._relative(real))
            if start is None:
                return out
            with start:
                for rel, _, name, st in walk_beneath(start, skip, enter=enter):
                    if not valid_name(name):
                        continue
                    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                        out.append(self.node_of(f"{path}/{rel}" if path else rel, st))
        out.sort(key=lambda n: n.path)
        return out

    def _relative(self, real: Path) -> str:
        rel = os.path.relpath(real, self.root)
        return "" if rel == "." else rel

    def open_file(self, real: Path) -> BinaryIO:
        """The file at ``real`` (a path ``locate`` gave), opened from the folder's root one
        name at a time, no link followed: a part swapped for a link since is not found.

        Raises:
            FileNotFoundError: it is not there (or not any more through real names).
        """
        rel = self._relative(real)
        try:
            with Dir.open(self.root) as root, parent_of(root, rel) as found:
                if found is None or not rel:
                    raise FileNotFoundError(errno.ENOENT, f"not found: {rel}")
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                fd = os.open(found[1], flags, dir_fd=found[0].fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EINVAL):
                raise FileNotFoundError(errno.ENOENT, f"not found: {rel}") from None
            raise
        return os.fdopen(fd, "rb")

    # ------------------------------------------------------------------ contents
    def read(self, path: str, real: Path) -> bytes:
        """The whole content of a file (at most ``max_file_bytes``).

        Raises:
            QuillError: ``SIZE_LIMIT_EXCEEDED`` for a larger file, ``FILE_NOT_FOUND``.
        """
        try:
            with self.open_file(real) as f:
                size = os.fstat(f.fileno()).st_size
                self.check_size(path, size)
                return f.read(self.limits.max_file_bytes + 1)
        except (FileNotFoundError, NotADirectoryError):
            raise QuillError(
                ErrorCode.FILE_NOT_FOUND, f"File not found: {path}", {"path": path}
            ) from None

    def read_range(self, real: Path, offset: int, length: int) -> bytes:
        with self.open_file(real) as f:
            f.seek(offset)
            return f.read(length)

    def check_size(self, path: str, size: int) -> None:
        """Raises:
        QuillError: ``SIZE_LIMIT_EXCEEDED`` for a file over ``max_file_bytes`` (the largest a
            workspace file may be: larger ones are read with ``read_bytes``)."""
        limit = self.limits.max_file_bytes
        if size > limit:
            raise QuillError(
                ErrorCode.SIZE_LIMIT_EXCEEDED,
                f"File too large: {size} bytes (limit {limit}); read it with read_bytes",
                {"path": path, "size": size, "max_file_bytes": limit},
            )

    def digest(self, real: Path, size: int) -> tuple[str, bool]:
        """``(sha256, binary)`` of a file, streamed; a file over ``max_file_bytes`` is judged
        binary or not by its first ``SNIFF_BYTES``."""
        h = hashlib.sha256()
        with self.open_file(real) as f:
            if size <= self.limits.max_file_bytes:
                data = f.read()
                h.update(data)
                return h.hexdigest(), as_text(data) is None
            head = f.read(SNIFF_BYTES)
            h.update(head)
            while chunk := f.read(1024 * 1024):
                h.update(chunk)
        text = head.decode("utf-8", "ignore")  # a character cut at the end is not binary
        binary = b"\0" in head or len(text.encode()) < len(head) - 3
        return h.hexdigest(), binary
