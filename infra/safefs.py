"""File operations on a directory tree that someone else can change meanwhile (a sandboxed
command's checkout, a user's folder), made so that no name in it is ever resolved through a
link: nothing here opens, writes, chmods, renames, removes, makes or walks anything outside
the tree, whatever links, hard links or swaps its other users plant.

How. Every operation is relative to a directory file descriptor (``Dir``), itself opened one
name at a time from the tree's root with ``O_DIRECTORY | O_NOFOLLOW`` (a link there is
``ELOOP``, a file ``ENOTDIR``), then ``fstat``-checked: a directory, on the root's device.
Names passed to ``Dir`` are single names (never ``a/b``). Files are opened ``O_NOFOLLOW |
O_NONBLOCK`` (a FIFO cannot block the reader) and checked after the open with ``fstat``: a
regular file, the inode the listing showed, the size it claims. Writes never modify a file in
place: the content goes to a new file at an unpredictable name (``secrets.token_hex``),
created ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a name someone planted makes it fail, never
followed), its mode set with ``fchmod`` on that descriptor, then ``renameat`` over the target
(which replaces a link or a hard link, never writes through it). A mode change on a file with
other hard links rewrites it instead (its other names keep their mode). Removal is
``unlinkat``, or ``remove_tree`` for a directory.

Depth. A tree may be as deep as its owner likes (a command makes 100,000 nested directories in a
second): nothing here recurses, and nothing holds more than ``MAX_OPEN`` directory descriptors
however deep it goes. ``walk`` closes the descriptors of directories it has finished listing
and reopens one through ``..`` (the kernel's parent, never a link) when it gets back to it,
checked to be the same inode; ``remove_tree`` moves a directory deeper than ``MAX_OPEN`` up to
the top of the tree it removes (``renameat``) and removes it from there. (``shutil.rmtree``
recurses once per level: Python's recursion limit stops it at ~1,000 levels, and each level
holds a descriptor.)

Ownership. A ``Dir`` opened with an ``owner`` (uid, gid) gives what it makes (a file, a
directory) to that owner: the sandboxed command changes a checkout as that uid, with no
privilege over any other file (``infra.exec.sandbox.users``).

Errors are ``OSError``: ``ELOOP`` or ``ENOTDIR`` where a link or a file stands in a path,
``Changed`` when what was opened is not what was listed.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

COUNTS: collections.Counter[str] = collections.Counter()
"""What this process did through ``Dir``: entries stat'ed (``stat``: listed or looked up),
files read (``read``), written (``write``) and hard-linked (``link``). The executor's ping
shows them: tests hold what an operation costs to what it needs with them (no clock)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1024 * 1024
MAX_OPEN = 32
"""Directory descriptors a ``walk`` or a ``remove_tree`` holds at most, however deep the tree."""
_BATCH = 1024
"""Subdirectories ``remove_tree`` takes from one listing (then lists again): bounded memory for
a directory of a million."""

Entry = tuple[str, "Dir", str, os.stat_result]
"""A walk's item: (relative path, its directory, its name, its lstat)."""


class Changed(OSError):
    """What was opened is not what was listed (a swap, a file growing): try again later."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(errno.ESTALE, f"{name}: {why}")


def temp_name() -> str:
    """A name no one can guess in advance."""
    return f".quill-{secrets.token_hex(12)}.tmp"


def _check_name(name: str) -> None:
    if not name or "/" in name or name in (".", ".."):
        raise OSError(errno.EINVAL, f"not a single name: {name!r}")


Owner = tuple[int, int]
"""(uid, gid) given to what a ``Dir`` makes."""


class Dir:
    """An open directory of the tree; every method takes a single name in it."""

    def __init__(self, fd: int, dev: int, owner: Owner | None = None) -> None:
        self.fd, self.dev, self.owner = fd, dev, owner

    @classmethod
    def open(cls, path: Path, owner: Owner | None = None) -> Dir:
        """The tree's root (a path the caller trusts; its last name must not be a link);
        ``owner``: who what is made in the tree belongs to (None: whoever makes it).

        Raises:
            OSError: not a directory, or a link.
        """
        fd = os.open(path, _DIR_FLAGS)
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):  # pragma: no cover - O_DIRECTORY says so
            os.close(fd)
            raise OSError(errno.ENOTDIR, f"not a directory: {path}")
        return cls(fd, st.st_dev, owner)

    def dup(self) -> Dir:
        """Another descriptor of this directory (closed on its own)."""
        return Dir(os.dup(self.fd), self.dev, self.owner)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Dir:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ directories
    def open_dir(self, name: str, expect: os.stat_result | None = None) -> Dir:
        """The directory ``name`` (never through a link), checked after the open.

        Raises:
            OSError: missing, a link (``ELOOP``), not a directory, on another device, or
                (``Changed``) not the inode ``expect`` shows.
        """
        fd, _ = self._open_checked(name, expect, directory=True)
        return Dir(fd, self.dev, self.owner)

    def parent(self, expect: tuple[int, int]) -> Dir:
        """This directory's parent (``..``: the kernel's, never a link), which must be the
        inode ``expect`` (inode, device).

        Raises:
            OSError: ``Changed`` when it is not (this directory was moved meanwhile).
        """
        fd = os.open("..", _DIR_FLAGS, dir_fd=self.fd)
        st = os.fstat(fd)
        if (st.st_ino, st.st_dev) != expect:
            os.close(fd)
            raise Changed("..", "not the directory it was")
        return Dir(fd, self.dev, self.owner)

    def ensure_dir(self, name: str, mode: int = 0o755) -> Dir:
        """The directory ``name``, made if missing; a link, a file or anything else there is
        removed first (never followed).

        Raises:
            OSError: it could not be made (or kept being replaced).
        """
        made = False
        for _ in range(8):
            try:
                found = self.open_dir(name)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, mode, dir_fd=self.fd)
                    made = True
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=self.fd)
            else:
                if made and self.owner is not None:
                    try:
                        os.fchown(found.fd, *self.owner)
                    except BaseException:
                        found.close()
                        raise
                return found
        raise OSError(errno.EAGAIN, f"{name}: kept changing while being made a directory")

    def entries(self) -> list[tuple[str, os.stat_result]]:
        """Every name in the directory with its lstat, in name order (names that vanish
        meanwhile are left out)."""
        out = []
        with contextlib.suppress(OSError), os.scandir(self.fd) as it:
            for entry in it:
                try:
                    out.append((entry.name, entry.stat(follow_symlinks=False)))
                except OSError:
                    continue
        out.sort(key=lambda item: item[0])
        COUNTS["stat"] += len(out)
        return out

    # ------------------------------------------------------------------ names
    def lstat(self, name: str) -> os.stat_result | None:
        """The entry ``name`` itself (a link is a link); None if there is none."""
        _check_name(name)
        COUNTS["stat"] += 1
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def remove(self, name: str) -> None:
        """Remove ``name`` (a directory with what it holds, however deep; a link itself);
        none is fine."""
        remove_tree(self, name)

    def rename(self, src: str, dst: str, into: Dir | None = None) -> None:
        """``renameat``: ``src`` (itself, a link included) becomes ``dst`` in ``into``."""
        _check_name(src)
        _check_name(dst)
        target = into if into is not None else self
        os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=target.fd)

    def link(self, name: str, into: Dir, new: str) -> os.stat_result | None:
        """``linkat``: a hard link to ``name`` itself (a link is linked as a link, never
        followed) made as ``new`` in ``into``; the new name's lstat (None: ``name`` was
        gone). The caller checks what it linked (a regular file, the inode it expected).

        Raises:
            OSError: it could not be made (``EXDEV``: another filesystem; ``EEXIST``).
        """
        _check_name(name)
        _check_name(new)
        COUNTS["link"] += 1
        try:
            os.link(name, new, src_dir_fd=self.fd, dst_dir_fd=into.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return into.lstat(new)

    # ------------------------------------------------------------------ files
    def write_file(self, name: str, data: bytes, mode: int) -> os.stat_result:
        """Replace ``name`` with a new file of ``data`` and ``mode`` (a directory there is
        removed first); the new file's stat, taken after the rename.

        Raises:
            OSError: the write failed (nothing is left at a temporary name).
        """
        _check_name(name)
        COUNTS["write"] += 1
        tmp = temp_name()
        fd = os.open(tmp, _NEW_FLAGS, 0o600, dir_fd=self.fd)
        try:
            if self.owner is not None:
                os.fchown(fd, *self.owner)
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[:_CHUNK]) :]
            st = self.lstat(name)
            if st is not None and stat.S_ISDIR(st.st_mode):
                self.remove(name)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            return os.fstat(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise
        finally:
            os.close(fd)

    def _open_checked(
        self, name: str, expect: os.stat_result | None, *, directory: bool = False
    ) -> tuple[int, os.stat_result]:
        """``name`` opened (never through a link) and checked after the open: a regular file,
        or a directory on this device; given ``expect``, the inode it shows."""
        _check_name(name)
        fd = os.open(name, _DIR_FLAGS if directory else _READ_FLAGS, dir_fd=self.fd)
        st = os.fstat(fd)
        why = None
        if not (stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)):
            why = "not a directory" if directory else "not a regular file"
        elif directory and st.st_dev != self.dev:
            why = "on another device"
        elif expect is not None and (st.st_ino, st.st_dev) != (expect.st_ino, expect.st_dev):
            why = f"not the {'directory' if directory else 'file'} listed"
        if why is not None:
            os.close(fd)
            raise Changed(name, why)
        return fd, st

    def read_file(
        self, name: str, limit: int, expect: os.stat_result | None = None
    ) -> tuple[bytes, os.stat_result]:
        """The whole content of the regular file ``name`` (never through a link) and its
        stat after the open.

        Raises:
            OSError: missing, a link (``ELOOP``); ``Changed`` for anything but a regular file,
                another inode than ``expect``'s, over ``limit`` bytes, or a size that is not
                what was read.
        """
        fd, st = self._open_checked(name, expect)
        COUNTS["read"] += 1
        try:
            if st.st_size > limit:
                raise Changed(name, f"{st.st_size} bytes, over {limit}")
            parts, got = [], 0
            while got <= st.st_size:
                chunk = os.read(fd, min(_CHUNK, st.st_size + 1 - got))
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
            if got != st.st_size:
                raise Changed(name, "changed size while read")
            return b"".join(parts), st
        finally:
            os.close(fd)

    def set_mode(
        self, name: str, mode: int, expect: os.stat_result | None = None
    ) -> os.stat_result:
        """Give the regular file ``name`` the permission bits ``mode`` (``fchmod`` on the
        opened file); a file with other hard links is rewritten instead, so that its other
        names keep theirs. Its stat afterwards.

        Raises:
            OSError: as ``read_file``.
        """
        fd, st = self._open_checked(name, expect)
        try:
            if st.st_nlink == 1:
                os.fchmod(fd, mode)
                return os.fstat(fd)
        finally:
            os.close(fd)
        data, _ = self.read_file(name, st.st_size, st)
        return self.write_file(name, data, mode)


def open_path(root: Dir, path: str) -> Dir | None:
    """The directory ``path`` under ``root`` (``""``: a new descriptor of ``root``), opened one
    name at a time without following links; None if a part is missing, a link or not a
    directory. The caller closes it."""
    if not path:
        return root.dup()
    found = open_parent(root, path)
    if found is None:
        return None
    parent, name = found
    try:
        return parent.open_dir(name)
    except OSError:
        return None
    finally:
        parent.close()


def open_parent(root: Dir, path: str, *, create: bool = False) -> tuple[Dir, str] | None:
    """The directory holding ``path`` (a relative ``a/b/c`` name, no ``.`` or ``..``) and
    its last name, opened one name at a time from ``root``. With ``create``, missing
    directories are made and anything else in their place removed; without, None when a part
    is missing, a link or not a directory. The caller closes the ``Dir``.

    Raises:
        OSError: with ``create``, a directory could not be made.
    """
    parts = path.split("/")
    current = root.dup()
    try:
        for part in parts[:-1]:
            try:
                child = current.ensure_dir(part) if create else current.open_dir(part)
            except OSError:
                if create:
                    raise
                current.close()
                return None
            current.close()
            current = child
    except BaseException:
        current.close()
        raise
    _check_name(parts[-1])
    return current, parts[-1]


@contextlib.contextmanager
def parent_of(root: Dir, path: str, *, create: bool = False) -> Iterator[tuple[Dir, str] | None]:
    """``open_parent`` as a context (the directory closed after)."""
    found = open_parent(root, path, create=create)
    try:
        yield found
    finally:
        if found is not None:
            found[0].close()


def walk(
    root: Dir,
    prune: Callable[[str], bool],
    max_path_bytes: int = 1 << 20,
    enter: Callable[[str], bool] | None = None,
) -> Iterator[Entry]:
    """Every entry under ``root``, parents first: a directory's entries (in name order), then
    each of its subdirectories in turn. A subdirectory for which ``prune(relative path)`` is
    True is neither yielded nor entered; one for which ``enter`` is False is yielded, not
    entered; none deeper than ``max_path_bytes`` is entered. Each
    subdirectory is opened from its parent's descriptor (never through a link) and must be the
    inode its listing showed. The ``Dir`` of an item is open until the walk moves past it.

    Iterative, holding at most ``MAX_OPEN`` descriptors and, per directory above the current
    one, its inode and the subdirectories left to enter (not its path: a chain of n levels
    costs O(n), not O(n²)): a directory whose listing is done is closed once that many below
    it are open, and reopened through ``..`` when the walk gets back to it; if it is not the
    directory it was (moved meanwhile), what the walk had left of it and above is skipped."""
    frames: list[_Frame] = []

    def visit(rel_dir: str, directory: Dir, key: tuple[int, int]) -> Iterator[Entry]:
        frame = _Frame(rel_dir, directory, key)
        frames.append(frame)  # closed by the walk, whatever happens
        for name, st in directory.entries():
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if stat.S_ISDIR(st.st_mode):
                if prune(rel):
                    continue
                deep = len(rel.encode("utf-8", "surrogateescape")) > max_path_bytes
                if not deep and (enter is None or enter(rel)):
                    frame.pending.append((name, st))
            yield rel, directory, name, st
        frame.pending.reverse()  # taken from the end: in name order
        if len(frames) > MAX_OPEN:
            frames[-MAX_OPEN - 1].close()  # its listing is done: reopened when needed

    try:
        st = os.fstat(root.fd)
        yield from visit("", root.dup(), (st.st_ino, st.st_dev))
        while frames:
            top = frames[-1]
            assert top.dir is not None and top.rel is not None
            if not top.pending:
                frames.pop()
                if frames and frames[-1].dir is None:
                    above = frames[-1]
                    try:
                        above.dir = top.dir.parent(above.key)
                        above.rel = top.rel.rpartition("/")[0]
                    except OSError:  # moved meanwhile: nothing above it is reached safely
                        for frame in frames:
                            frame.close()
                        frames.clear()
                top.close()
                continue
            name, st = top.pending.pop()
            try:
                child = top.dir.open_dir(name, expect=st)
            except OSError:
                continue
            rel = f"{top.rel}/{name}" if top.rel else name
            yield from visit(rel, child, (st.st_ino, st.st_dev))
    finally:
        for frame in frames:
            frame.close()


class _Frame:
    """A directory ``walk`` is in: its path and descriptor (None while closed), its inode
    (what ``..`` must be to reopen it) and the subdirectories left to enter."""

    __slots__ = ("dir", "key", "pending", "rel")

    def __init__(self, rel: str, directory: Dir, key: tuple[int, int]) -> None:
        self.rel: str | None = rel
        self.dir: Dir | None = directory
        self.key = key
        self.pending: list[tuple[str, os.stat_result]] = []

    def close(self) -> None:
        if self.dir is not None:
            self.dir.close()
            self.dir, self.rel = None, None


def remove_tree(parent: Dir, name: str, budget: int | None = None) -> bool:
    """Remove ``name`` from ``parent``: a directory with everything below it, however deep or
    wide, anything else itself (a link is never followed). Iterative, holding at most
    ``MAX_OPEN`` descriptors and ``_BATCH`` names per directory: a directory deeper than
    ``MAX_OPEN`` is moved up to the top of the tree being removed (``renameat``, to a fresh
    name) and removed from there in its turn. Removes at most ``budget`` entries (None: no
    limit). Returns True when ``name`` is gone, False when the budget ran out first (what is
    left is still under ``name``; call again to go on).

    Raises:
        OSError: an entry could not be removed, or one kept coming back (what is left is still
            under ``name``).
    """
    st = parent.lstat(name)
    if st is None:
        return True
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent.fd)
        return True
    left = [-1 if budget is None else budget]
    stack: list[tuple[str, Dir, list[str]]] = []  # (its name in the one before, it, to enter)
    try:
        stack.append((name, _open_for_removal(parent, name), []))
        while stack:
            here_name, here, pending = stack[-1]
            if not pending:
                pending += _clear(here, left)
                if left[0] == 0:
                    return False
            if not pending:  # nothing left in it: it goes
                stack.pop()
                here.close()
                holder = stack[-1][1] if stack else parent
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(here_name, dir_fd=holder.fd)
                left[0] -= 1
                if left[0] == 0 and stack:
                    return False
                continue
            sub = pending.pop()
            try:
                if len(stack) >= MAX_OPEN:  # deep enough: on with it from the top
                    os.rename(sub, temp_name(), src_dir_fd=here.fd, dst_dir_fd=stack[0][1].fd)
                    continue
                stack.append((sub, _open_for_removal(here, sub), []))
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                with contextlib.suppress(FileNotFoundError):  # no longer a directory
                    os.unlink(sub, dir_fd=here.fd)
    finally:
        for _, directory, _ in stack:
            directory.close()
    return True


def _open_for_removal(parent: Dir, name: str) -> Dir:
    """The directory ``name`` to empty; one its owner made unreadable (mode 0) is given
    ``0o700`` first (its owner may chmod it back; only the executor that is not root needs it)."""
    try:
        return parent.open_dir(name)
    except PermissionError:
        fd = os.open(
            name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent.fd
        )
        try:
            os.chmod(f"/proc/self/fd/{fd}", 0o700)
        finally:
            os.close(fd)
        return parent.open_dir(name)


def _clear(directory: Dir, left: list[int]) -> list[str]:
    """Unlink what ``directory`` holds but directories (until ``left[0]`` reaches 0); up to
    ``_BATCH`` of its subdirectories' names. Names removed during the listing may be missed
    by it: the caller lists again until a listing finds nothing."""
    subdirs: list[str] = []
    with os.scandir(directory.fd) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                subdirs.append(entry.name)
                if len(subdirs) >= _BATCH:
                    break
                continue
            if left[0] == 0:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.name, dir_fd=directory.fd)
            left[0] -= 1
    return subdirs
