"""What changed in a checkout's ``tree/`` that a sandbox writes into in place (a shell's), found
with inotify instead of a walk: so that a command in a shell, and its quota, cost what changed.

A one-shot command runs over an overlay, whose upper layer lists what it changed
(``infra.exec.layers``). A shell's sandbox has no overlay: its bash and its background
processes write straight into its checkout for the shell's whole life. Without a list of what
changed, every command walked the whole tree twice (before it: what background processes
changed; after it: what it changed) and the quota guard walked it every quarter second or so,
forever. ``TreeWatch`` keeps that list.

How. One inotify instance per tree, a watch on every directory of it (added through
``/proc/self/fd/N`` of a directory opened with ``infra.safefs``, one name at a time, never
through a link); the watches see what the sandbox writes through its bind mount of the tree
(same inodes: the events are the inode's, whatever mount or uid wrote).
Each event names a path (its directory's, plus the name), and that path is *dirty*:

* a file created, written, closed after writing, chmod'ed/touched, moved in or out, removed:
  the path (and its parent's size, for the quota);
* a directory created or moved in: the path and everything below it (``all``), and a watch is
  added on it and on each directory below it *before* it is listed: a file made in it before
  its watch existed is found by that listing, one made after raises an event;
* a directory removed or moved out: the path (``gone``: what the log holds below it is
  looked at), and the watches below it dropped;
* ``IN_Q_OVERFLOW`` (the kernel's queue of events was full: events were lost), a watch that
  cannot be added (``ENOSPC``: ``max_user_watches``; or past ``max_watches``, the executor's
  own cap), the tree itself removed or moved, or any error reading events: what changed is
  *unknown*. The next ``take`` answers None (the caller walks the whole tree, as before) and
  the next ``take`` or ``held`` starts over: a new inotify instance, every directory watched
  again, every entry measured again (one walk), and from then on what changed is known again.

``take`` hands the caller what changed since the last ``take`` (after reading every event the
kernel queued: a process's write queues its event before the write returns, so when a command
has returned, its events are there), as ``infra.exec.capture.touched`` takes a merge's list; a
change made while the caller looks is in the next list.

The quota. ``arm`` walks the tree once and keeps each entry's inode and bytes (as
``services.executor.quota`` counts them: blocks, a regular file at least its size, a hard-linked
inode once); each dirty path's new state (a stat) then replaces its old one in the running
total. ``held`` is that total: no walk, no stat while nothing changes.

What inotify does not see, and what is done about it. A write through a shared ``mmap`` raises
no event until the file is closed (``IN_CLOSE_WRITE``, when the last mapping and descriptor of
it go); a write through another name of a hard-linked file raises its event on that name only.
Capture treats a dirty regular file with more than one link as doubt (the whole tree is walked:
``touched(strict=True)``), so a change through one name is found at every name, as a walk finds
it. A file written only through a mapping kept open is found when it is closed, or at the next
walk (an overflow's): a walk finds it only if its mtime moved, which a mapping updates lazily.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from inotify_simple import INotify, flags

from infra.safefs import Dir, open_path, walk

log = logging.getLogger("quill.executor.watch")

How = Literal["dir", "all", "gone"]
"""As ``infra.exec.layers.How``: a directory kept, a path new or changed (and all below it), a
path removed."""

MAX_WATCHES = 100_000
"""Watches one tree may hold (one per directory); past it, what changed is unknown (walked)."""
MASK = (
    flags.CREATE
    | flags.DELETE
    | flags.MODIFY
    | flags.CLOSE_WRITE
    | flags.MOVED_FROM
    | flags.MOVED_TO
    | flags.ATTRIB
    | flags.DELETE_SELF
    | flags.MOVE_SELF
    | flags.ONLYDIR
    | flags.EXCL_UNLINK
)
COUNTS: dict[str, int] = {"overflows": 0, "rearmed": 0, "events": 0, "no_instance": 0}
"""Queue overflows, walks that armed a tree again, events read (the executor's ping shows them)."""


def io() -> dict[str, int]:
    """``COUNTS`` as the executor's ping shows them (``watch_`` before each)."""
    return {f"watch_{key}": value for key, value in COUNTS.items()}


def entry_bytes(st: os.stat_result) -> int:
    """What one entry counts for the quota (``services.executor.quota.file_bytes``)."""
    blocks = st.st_blocks * 512
    return max(blocks, st.st_size) if stat.S_ISREG(st.st_mode) else blocks


@dataclass(slots=True)
class _Node:
    ino: int
    bytes: int
    wd: int = -1
    kids: dict[str, _Node] | None = None
    """A directory's entries (None: not a directory)."""


@dataclass
class _State:
    nodes: _Node | None = None
    path_of: dict[int, str] = field(default_factory=dict)
    links: dict[int, list[int]] = field(default_factory=dict)
    """Per inode of what is not a directory: [names of it counted, its bytes]."""
    bytes: int = 0
    entries: int = 0


class TreeWatch:
    """The dirty paths and the size of one ``tree/`` (see the module docstring). Thread-safe:
    capture and the quota guard call it from worker threads."""

    def __init__(self, tree: Path, max_watches: int = MAX_WATCHES) -> None:
        self.tree, self.max_watches = tree, max_watches
        self._lock = threading.Lock()
        self._inotify: INotify | None = None
        self._s = _State()
        self._dirty: dict[str, How] = {}
        self.unknown = True
        """What changed is not known: the next ``take`` answers None (walk it all)."""
        self._armed = False
        """The watches and sizes stand (else ``take``/``held`` arm first)."""
        self.why = "not armed"
        self.capped = False
        """The last ``arm`` could not add a watch on every directory (``take`` tries again;
        ``held`` does not: the caller walks)."""
        self.walks = 0
        """Whole walks made (``arm``): what the tests count."""

    # ------------------------------------------------------------------ public
    def arm(self, clean: bool = False) -> tuple[int, int] | None:
        """Watch every directory and measure every entry (a walk); (bytes, entries) of the
        tree (None: not armed, ``held``). What changed is unknown until the next ``take``
        (which answers None), unless ``clean``: the caller knows the tree is as its manifest
        says (just built, nothing else writing in it)."""
        with self._lock:
            self._arm()
            if clean and self._armed:
                self.unknown = False
            return (self._s.bytes, self._s.entries) if self._armed else None

    def walk_next(self) -> None:
        """The next ``take`` answers None (the caller walks the whole tree): for a capture
        that must miss nothing inotify cannot see (a write through a shared mapping raises no
        event until its file is closed): a shell's checkpoint and its close."""
        with self._lock:
            self.unknown = True

    def take(self) -> list[tuple[str, How]] | None:
        """What changed since the last ``take`` (parents first), or None when that is not
        known (the caller walks the whole tree); the list starts empty again."""
        with self._lock:
            self._drain()
            unknown = self.unknown or not self._armed
            if not self._armed:
                self._arm()
            dirty, self._dirty = self._dirty, {}
            if unknown:
                self.unknown = not self._armed
                return None
            return sorted(dirty.items())

    def held(self) -> tuple[int, int] | None:
        """(bytes, entries) the tree holds now: the running total; when that is not known,
        armed again (a walk), or None if it cannot be (past the watches it may hold: the
        caller walks, as it did without a watch)."""
        with self._lock:
            self._drain()
            if not self._armed and not self.capped:
                self._arm()
            if not self._armed:
                return None
            return self._s.bytes, self._s.entries

    def doubt(self, why: str) -> None:
        """What changed is unknown from now (the next ``take``/``held`` walks)."""
        with self._lock:
            self._lose(why)

    def close(self) -> None:
        with self._lock:
            self._close()
            self._armed = False

    # ------------------------------------------------------------------ arming
    def _close(self) -> None:
        if self._inotify is not None:
            try:
                self._inotify.close()
            except OSError:
                pass
            self._inotify = None

    def _lose(self, why: str) -> None:
        if self._armed:
            log.info("watch of %s: %s: walked at the next capture", self.tree, why)
        self.unknown, self._armed, self.why = True, False, why
        self._close()

    def _arm(self) -> None:
        self.capped = False
        self._close()
        self._s = _State()
        self._dirty = {}
        self.walks += 1
        COUNTS["rearmed"] += 1
        try:
            self._inotify = INotify(nonblocking=True)
        except OSError as exc:  # max_user_instances: walked every time, as before
            self.why = f"no inotify instance ({exc})"
            _no_instance(exc)
            return
        self._armed = True
        try:
            root = Dir.open(self.tree)
        except OSError as exc:
            self._lose(f"tree not opened ({exc})")
            return
        with root:
            st = os.fstat(root.fd)
            self._s.nodes = self._node(st, root)
            if self._s.nodes is None:
                return
            self._s.path_of[self._s.nodes.wd] = ""
            self._fill("", self._s.nodes, root)

    def _watch(self, directory: Dir) -> int | None:
        """A watch on ``directory`` (its descriptor: no name resolved again); None (and what
        changed unknown) when it cannot be added."""
        assert self._inotify is not None
        if len(self._s.path_of) >= self.max_watches:
            self._lose(f"over {self.max_watches} watches")
            self.capped = True
            return None
        try:
            return int(self._inotify.add_watch(f"/proc/self/fd/{directory.fd}", MASK))
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EMFILE):
                self._lose(f"watch not added ({exc})")
                self.capped = True
            return None  # else gone or swapped meanwhile: its own event says so

    def _node(self, st: os.stat_result, directory: Dir | None) -> _Node | None:
        node = _Node(st.st_ino, entry_bytes(st))
        if directory is not None:
            wd = self._watch(directory)
            if wd is None:
                return None if not self._armed else node
            node.wd, node.kids = wd, {}
        self._count(node, 1)
        return node

    def _count(self, node: _Node, sign: int) -> None:
        """Count ``node`` in (1) or out (-1): a directory as itself, anything else per inode
        (its names counted, its bytes once: a hard link is not counted twice)."""
        s = self._s
        if node.kids is not None:
            s.bytes += sign * node.bytes
            s.entries += sign
            return
        held = s.links.get(node.ino)
        if sign > 0:
            if held is None:
                s.links[node.ino] = [1, node.bytes]
                s.bytes += node.bytes
                s.entries += 1
            else:
                held[0] += 1
                s.bytes += node.bytes - held[1]  # the inode as it is now
                held[1] = node.bytes
            return
        if held is None:
            return
        held[0] -= 1
        if held[0] <= 0:
            del s.links[node.ino]
            s.bytes -= held[1]
            s.entries -= 1

    def _fill(self, rel: str, node: _Node, directory: Dir) -> None:
        """Watch and measure everything below ``directory`` (its watch already added)."""
        prefix = rel + "/" if rel else ""
        nodes: dict[str, _Node] = {"": node}
        for sub, holder, name, st in walk(directory, prune=lambda _: False):
            if not self._armed:
                return
            parent = nodes.get(sub.rpartition("/")[0])
            if parent is None or parent.kids is None:
                continue
            child: _Node | None
            if stat.S_ISDIR(st.st_mode):
                try:
                    with holder.open_dir(name, expect=st) as here:
                        child = self._node(st, here)
                except OSError:
                    continue
                if child is None:
                    return
                if child.kids is not None:
                    self._s.path_of[child.wd] = prefix + sub
                    nodes[sub] = child
            else:
                child = self._node(st, None)
                assert child is not None
            old = parent.kids.get(name)
            if old is not None:
                self._drop(old)
            parent.kids[name] = child

    # ------------------------------------------------------------------ events
    def _drain(self) -> None:
        if not self._armed or self._inotify is None:
            return
        while self._armed and self._inotify is not None:
            try:
                events = self._inotify.read(timeout=0)
            except OSError as exc:
                self._lose(f"events not read ({exc})")
                return
            if not events:
                return
            COUNTS["events"] += len(events)
            touched: set[str] = set()
            for event in events:
                self._event(event.wd, event.mask, event.name, touched)
                if not self._armed:
                    return
            self._measure(touched)

    def _event(self, wd: int, mask: int, name: str, touched: set[str]) -> None:
        if mask & flags.Q_OVERFLOW:
            COUNTS["overflows"] += 1
            self._lose("event queue overflowed")
            return
        base = self._s.path_of.get(wd)
        if mask & flags.IGNORED:
            if base is not None:
                del self._s.path_of[wd]
                if base == "":
                    self._lose("tree removed")
            return
        if base is None:
            return  # a watch dropped (its directory moved out or removed): stale
        if mask & (flags.DELETE_SELF | flags.MOVE_SELF) and not name:
            if base == "":
                self._lose("tree removed or moved")
            return  # its parent's event says where it went
        rel = f"{base}/{name}" if base and name else (name or base)
        is_dir = bool(mask & flags.ISDIR)
        if not name:  # the watched directory itself (its mode, its times): its size only
            touched.add(rel)
            return
        touched.add(base)  # the directory's own size changes with its entries
        if mask & (flags.DELETE | flags.MOVED_FROM):
            self._mark(rel, "gone")
            self._forget(rel)
        elif mask & (flags.CREATE | flags.MOVED_TO):
            self._mark(rel, "all")
            if is_dir:
                self._scan(rel)
            else:
                touched.add(rel)
        else:  # written, closed, chmod'ed, touched (a directory's mode: nothing to commit)
            if not is_dir:
                self._mark(rel, "all")
            touched.add(rel)

    def _mark(self, rel: str, how: How) -> None:
        old = self._dirty.get(rel)
        self._dirty[rel] = how if old is None or old == how else "all"

    def _find(self, rel: str) -> tuple[_Node | None, _Node | None, str]:
        """(parent node, node, name) of ``rel`` in the size tree."""
        node = self._s.nodes
        parts = rel.split("/") if rel else []
        parent = None
        for part in parts:
            if node is None or node.kids is None:
                return None, None, parts[-1]
            parent, node = node, node.kids.get(part)
        return parent, node, parts[-1] if parts else ""

    def _drop(self, node: _Node) -> None:
        """Uncount ``node`` and everything below it; drop their watches."""
        stack = [node]
        inotify = self._inotify
        while stack:
            n = stack.pop()
            self._count(n, -1)
            if n.kids is not None:
                stack.extend(n.kids.values())
                if n.wd >= 0 and self._s.path_of.pop(n.wd, None) is not None:
                    if inotify is not None:
                        try:
                            inotify.rm_watch(n.wd)
                        except OSError:
                            pass

    def _forget(self, rel: str) -> None:
        parent, node, name = self._find(rel)
        if parent is not None and parent.kids is not None and node is not None:
            del parent.kids[name]
            self._drop(node)

    def _scan(self, rel: str) -> None:
        """A directory made or moved in: watched, then listed (what was made in it before its
        watch is found so), and so below it."""
        parent, _, name = self._find(rel)
        if parent is None or parent.kids is None:
            return  # its parent is not known (gone meanwhile): its own events say
        self._forget(rel)
        try:
            with Dir.open(self.tree) as root:
                holder = open_path(root, rel.rpartition("/")[0])
                if holder is None:
                    return
                with holder:
                    st = holder.lstat(name)
                    if st is None or not stat.S_ISDIR(st.st_mode):
                        if st is not None:
                            node = self._node(st, None)
                            if node is not None:
                                parent.kids[name] = node
                        return
                    with holder.open_dir(name, expect=st) as here:
                        node = self._node(st, here)
                        if node is None or node.kids is None:
                            return
                        self._s.path_of[node.wd] = rel
                        parent.kids[name] = node
                        self._fill(rel, node, here)
        except OSError:
            return  # swapped or gone meanwhile: its own events say

    def _measure(self, paths: set[str]) -> None:
        """The running total: each of ``paths`` (not a directory made or moved in: those are
        measured by ``_scan``) as it is now."""
        if not paths:
            return
        try:
            root = Dir.open(self.tree)
        except OSError:
            self._lose("tree not opened")
            return
        with root:
            for rel in sorted(paths):
                parent, node, name = self._find(rel)
                if rel == "":
                    node = self._s.nodes
                    if node is not None:
                        self._resize(node, os.fstat(root.fd))
                    continue
                if parent is None or parent.kids is None:
                    continue
                holder = open_path(root, rel.rpartition("/")[0])
                if holder is None:
                    continue
                with holder:
                    st = holder.lstat(name)
                if st is None:
                    if node is not None:
                        del parent.kids[name]
                        self._drop(node)
                    continue
                if node is not None and node.kids is not None and stat.S_ISDIR(st.st_mode):
                    self._resize(node, st)
                    continue
                if stat.S_ISDIR(st.st_mode):  # a directory where we knew none: scanned
                    self._scan(rel)
                    continue
                if node is not None:
                    del parent.kids[name]
                    self._drop(node)
                fresh = self._node(st, None)
                assert fresh is not None
                parent.kids[name] = fresh

    def _resize(self, node: _Node, st: os.stat_result) -> None:
        """A directory's own size, as it is now."""
        self._s.bytes += entry_bytes(st) - node.bytes
        node.bytes = entry_bytes(st)


def _no_instance(exc: OSError) -> None:
    """Say once per process (a warning) that a shell could get no inotify instance: every
    shell past the user's ``fs.inotify.max_user_instances`` walks its whole tree at each
    command, and nothing else would tell the operator why shells got slow."""
    COUNTS["no_instance"] += 1
    if COUNTS["no_instance"] == 1:
        limit = _sysctl("fs/inotify/max_user_instances")
        log.warning(
            "a shell got no inotify instance (%s; fs.inotify.max_user_instances=%s): shells"
            " past it walk their whole tree at each command; raise the limit"
            " (docs/operations.md#sizing)",
            exc.strerror or exc,
            limit,
        )


def _sysctl(name: str) -> str:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return "unknown"
