"""Commands on a local folder: the writer's own decisions, over a state read from the disk,
then applied to it.

``LocalChanges.decide`` builds a ``WorkspaceState`` holding only what the command touches (its
paths, their parents, everything below a directory it moves or deletes) and runs
``core.decide`` on it: a command is refused or accepted exactly as the writer would
(modes, ``if_match`` etags, parents, ``NOT_A_DIRECTORY``, ``oldString not found in content``...,
same codes, same messages). ``commit`` decides again and applies the decision's changes to the
folder: files are written whole to a temporary name and renamed over the old one (an existing
file keeps its permission bits but for the executable bit), a move is one ``rename``. Every
one of these goes through ``infra.safefs``: relative to directories opened from the
folder's root without following any link, at an unpredictable temporary name, so a link that
appears after ``locate_for_change`` looked is never followed (the change is refused).

What a folder cannot give: ``max_files`` is not enforced (only the loaded paths are counted),
and ``apply`` finds no conflicts (no path has changed "after" a ``base_version`` the bridge
knows of: ``base_version`` only has to exist).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import MakeDir, PutFile, Remove
from contracts.paths import ACCESS_DENIED_MESSAGE, ancestors, is_within, normalize
from core.decide import decide
from core.decision import Context, Decision
from core.evolve import WorkspaceState
from core.tree import DirNode, FileNode, Tree
from infra.safefs import Dir, open_path, parent_of, walk
from services.bridge.folder import Folder, sig_of

DISK = "disk:"
"""The "sha256" of a file loaded from the disk: its path follows (read when decide asks)."""


def _targets(cmd: rq.Request) -> list[tuple[str, bool]]:
    """The paths ``cmd`` touches, each with whether everything below it matters too."""
    named: list[tuple[str, bool]] = []
    if isinstance(cmd, rq.WriteFile | rq.EditFile | rq.ModifyFile | rq.MakeDirectory):
        named = [(cmd.path, False)]
    elif isinstance(cmd, rq.DeletePath):
        named = [(cmd.path, True)]
    elif isinstance(cmd, rq.MovePath):
        named = [(cmd.path, True), (cmd.to, False)]
    elif isinstance(cmd, rq.ApplyChanges):
        named = [(c.path, isinstance(c, rq.DeleteChange)) for c in cmd.changes]
    out = []
    for path, deep in named:
        try:
            normal = normalize(path)
        except QuillError:
            continue  # decide reports it, in its own order
        if normal:  # the root: decide refuses to change it
            out.append((normal, deep))
    return out


class LocalChanges:
    """The commands of one attached folder (blocking: the handlers call them in a thread, one
    at a time)."""

    def __init__(self, folder: Folder, tenant: str, workspace: str, trust: str) -> None:
        self.folder, self.tenant, self.workspace, self.trust = folder, tenant, workspace, trust

    def decide(self, cmd: rq.Request, blobs: Mapping[str, bytes]) -> Decision:
        """What the writer would decide for ``cmd`` against the folder as it is now.

        Raises:
            QuillError: the command is refused (``ACCESS_DENIED`` also for a path through a
                link).
        """
        state = self._load(cmd)
        ctx = Context(
            version=self.folder.version + 1,
            at=datetime.now(UTC),
            content=lambda key: self._content(key, blobs),
        )
        return decide(state, cmd, ctx)

    def commit(self, cmd: rq.Request, blobs: Mapping[str, bytes]) -> Decision:
        """Decide ``cmd`` and apply what it changes; the folder's version goes up by one when
        anything changed.

        Raises:
            QuillError: the command is refused; nothing was changed.
        """
        decision = self.decide(cmd, blobs)
        if not decision.changes:
            return decision
        version = self.folder.version + 1
        if isinstance(cmd, rq.MovePath):
            self._move(normalize(cmd.path), normalize(cmd.to), decision)
        else:
            for change in decision.changes:
                self._apply(change)
        self._record(decision, version)
        self.folder.version, self.folder.updated = version, datetime.now(UTC)
        return decision

    # ------------------------------------------------------------------ the state
    def _load(self, cmd: rq.Request) -> WorkspaceState:
        folder = self.folder
        state = WorkspaceState(
            self.tenant,
            self.workspace,
            exists=True,
            version=folder.version,
            trust=self.trust,  # reported by create; approvals are the handlers' business
            limits=folder.limits,
        )
        for path, deep in _targets(cmd):
            folder.locate_for_change(path)
            self._load_path(state.tree, path, deep)
        return state

    def _load_path(self, tree: Tree, path: str, deep: bool) -> None:
        for part in [*ancestors(path), path] if path else []:
            kind = tree.kind(part)
            if kind == "d":
                continue
            if kind == "f":
                return
            st = self._lstat(part)
            if st is None:
                break
            self._add(tree, part, st)
            if not stat.S_ISDIR(st.st_mode):
                return
        if path not in tree.last_fv:
            tree.last_fv[path] = self.folder.versions.last(path)
        if deep and tree.kind(path) == "d":
            with Dir.open(self.folder.root) as root:
                below = open_path(root, path)
                if below is None:
                    raise self._link(path)
                with below:
                    for rel, _, _, st in walk(below, lambda _: False):
                        self._add(tree, f"{path}/{rel}", st)

    def _lstat(self, path: str) -> os.stat_result | None:
        """The entry at ``path`` itself, reached through no link; None if there is none."""
        with Dir.open(self.folder.root) as root, parent_of(root, path) as found:
            return None if found is None else found[0].lstat(found[1])

    def _link(self, path: str) -> QuillError:
        return QuillError(ErrorCode.ACCESS_DENIED, ACCESS_DENIED_MESSAGE, {"path": path})

    @contextmanager
    def _parent(self, path: str) -> Iterator[tuple[Dir, str]]:
        """The directory holding ``path``, reached through no link.

        Raises:
            QuillError: ``ACCESS_DENIED``: a link (or a file) stands on the way now.
        """
        with Dir.open(self.folder.root) as root, parent_of(root, path) as found:
            if found is None:
                raise self._link(path)
            yield found

    def _add(self, tree: Tree, path: str, st: os.stat_result) -> None:
        node = self.folder.node_of(path, st) if not stat.S_ISLNK(st.st_mode) else None
        created = datetime.fromtimestamp(min(st.st_ctime_ns, st.st_mtime_ns) / 1e9, UTC)
        if stat.S_ISDIR(st.st_mode):
            tree.set_dir(path, DirNode(created=created, version=node.version if node else 1))
            return
        file_version = node.file_version or 1 if node is not None else 1
        tree.set_file(
            path,
            FileNode(
                sha256=DISK + path,
                size=st.st_size,
                file_version=file_version,
                executable=bool(st.st_mode & 0o100),
                binary=False,  # decided when its content is read
                created=created,
                modified=datetime.fromtimestamp(st.st_mtime_ns / 1e9, UTC),
                version=node.version if node is not None else 1,
            ),
        )
        tree.last_fv[path] = file_version

    def _content(self, key: str, blobs: Mapping[str, bytes]) -> bytes | None:
        if not key.startswith(DISK):
            return blobs.get(key)
        path = key[len(DISK) :]
        limit = self.folder.limits.max_file_bytes
        with self._parent(path) as (parent, name):
            st = parent.lstat(name)
            if st is not None and st.st_size > limit:
                raise QuillError(
                    ErrorCode.SIZE_LIMIT_EXCEEDED,
                    f"File too large: {st.st_size} bytes (limit {limit})",
                    {"path": path, "size": st.st_size, "max_file_bytes": limit},
                )
            try:
                return parent.read_file(name, limit, st)[0]
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise self._link(path) from None
                raise

    # ------------------------------------------------------------------ the disk
    def _apply(self, change: PutFile | MakeDir | Remove) -> None:
        with self._parent(change.path) as (parent, name):
            if isinstance(change, MakeDir):
                _make_dir(parent, name)
            elif isinstance(change, Remove):
                parent.remove(name)
            else:
                if change.text is not None:
                    data = change.text.encode("utf-8", "surrogatepass")
                else:
                    data = change.data or b""
                _write(parent, name, data, change.executable)

    def _move(self, src: str, dst: str, decision: Decision) -> None:
        for change in decision.changes:  # the missing parents of the destination
            if isinstance(change, MakeDir) and not is_within(change.path, dst):
                with self._parent(change.path) as (parent, name):
                    _make_dir(parent, name)
        with self._parent(src) as (old, old_name), self._parent(dst) as (new, new_name):
            old.rename(old_name, new_name, into=new)

    def _record(self, decision: Decision, version: int) -> None:
        versions = self.folder.versions
        for change in decision.changes:
            if isinstance(change, PutFile):
                st = self._lstat(change.path)
                assert st is not None
                versions.wrote(change.path, change.file_version, sig_of(st), version)
            elif isinstance(change, MakeDir):
                versions.made(change.path, version)
            else:
                versions.removed(change.path, version)


def _make_dir(parent: Dir, name: str) -> None:
    try:
        os.mkdir(name, 0o777, dir_fd=parent.fd)
    except FileExistsError:
        st = parent.lstat(name)
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise


def _write(parent: Dir, name: str, data: bytes, executable: bool) -> None:
    """Write ``name`` whole: a new file renamed over it (no reader sees half a file)."""
    st = parent.lstat(name)
    mode = stat.S_IMODE(st.st_mode) if st is not None and stat.S_ISREG(st.st_mode) else 0o644
    mode = mode | (mode & 0o444) >> 2 if executable else mode & ~0o111
    parent.write_file(name, data, mode)
