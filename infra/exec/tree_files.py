"""A checkout's ``tree/`` under its manifest: the log's changes applied to the files.

The manifest says what ``tree/`` holds from the log (per path its sha256, mode and the stat
signature it had when last seen), and capture trusts it to hash only what changed: every way
the executor changes ``tree/`` from the log (``Checkout.sync``, the first build and a rebuild
from a compaction's manifest, ``infra.exec.builds``) goes through ``_apply`` here, which
writes, makes and removes, and keeps the manifest saying so. A put whose content the event
does not carry is fetched first (``_contents``): a blob, a file the checkout already holds
with that content, or the file as a reader has it, each checked against its sha256.

``tree/`` is the sandboxed command's to change: every name in it may be a link, a hard link or
swapped for one between two looks. Nothing here resolves a name in it on the host: each file
operation goes through ``infra.safefs`` (relative to directory descriptors opened one name at
a time without following links, new files at unpredictable names, checked after the open).

A base of ``Checkout`` (``infra.exec.checkout``), which sets what is declared here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import stat
from pathlib import Path

from contracts.events import (
    AnyChange,
    ChangesCommitted,
    MakeDir,
    PutFile,
    Remove,
)
from contracts.paths import ancestors
from infra.blobs import WorkspaceBlobs
from infra.exec import seed
from infra.exec.capture import file_sig
from infra.exec.manifest import Manifest, Tracked
from infra.exec.trash import Trash
from infra.safefs import Dir, Owner, parent_of, remove_tree

_generations = itertools.count(1)
"""Every change of any checkout's tree takes the next number (``TreeFiles.generation``)."""


def _under(path: str, top: str, prefix: str) -> bool:
    return path == top or path.startswith(prefix)


class TreeFiles:
    """``tree/`` and what the manifest says of it (set by ``Checkout.__init__``)."""

    tree: Path
    owner: Owner | None
    """Who ``tree/`` and everything written into it belongs to (None: the executor)."""
    trash: Trash | None
    manifest: Manifest
    generation: int
    """Changes with every change the executor makes to ``tree/`` (a sync that wrote, a
    merge, a rebuild): a sandbox whose overlay was mounted over another generation is
    not used (``Spawn.overlay``)."""
    _blobs: WorkspaceBlobs
    _fetch: seed.Fetch

    def _root(self) -> Dir:
        """``tree/``, opened so that what is made in it belongs to ``owner``."""
        return Dir.open(self.tree, self.owner)

    def _discard(self, path: Path) -> None:
        if self.trash is not None:
            self.trash.discard(path)
        elif os.path.lexists(path):
            with Dir.open(path.parent) as parent:
                remove_tree(parent, path.name)

    def _new_tree(self) -> None:
        """An empty ``tree/`` of ``owner``'s."""
        self.tree.mkdir(parents=True)
        if self.owner is not None:
            os.chown(self.tree, *self.owner)

    def changed(self) -> None:
        """``tree/`` was changed: a new ``generation``."""
        self.generation = next(_generations)

    async def _contents(self, event: ChangesCommitted) -> dict[str, bytes]:
        """The contents ``event``'s puts do not carry inline, by sha256: a blob from WS_BLOBS;
        for a move or a restore (a put naming content the log carried before), a file the
        checkout already holds with that content, else the file as a reader has it."""
        wanted = await asyncio.to_thread(self._wanted, event)
        if not wanted:
            return {}
        held = {t.sha256: p for p, t in self.manifest.paths.items() if t.sha256 in wanted}
        gate = asyncio.Semaphore(seed.AT_ONCE)  # many at once, never one after the other

        async def get(sha: str, change: PutFile) -> tuple[str, bytes]:
            path = held.get(sha)
            data = None if path is None else await asyncio.to_thread(self._held, path, sha)
            if data is None:
                async with gate:
                    if change.blob:
                        data = await self._blobs.get(sha)
                    else:
                        data = await self._fetch(change.path, event.version)
            if hashlib.sha256(data).hexdigest() != sha:
                raise RuntimeError(f"content of {change.path} at v{event.version} is not {sha}")
            return sha, data

        return dict(await asyncio.gather(*(get(sha, c) for sha, c in wanted.items())))

    def _held(self, path: str, sha256: str) -> bytes | None:
        """The content of ``tree/path`` if it is still this content the checkout wrote (read
        without following any link), else None."""
        tracked = self.manifest.paths.get(path)
        if tracked is None or tracked.sha256 != sha256 or tracked.sig is None:
            return None
        try:
            with self._root() as root, parent_of(root, path) as found:
                if found is None:
                    return None
                data, st = found[0].read_file(found[1], tracked.sig[0])
        except OSError:
            return None
        if file_sig(st) != tracked.sig or hashlib.sha256(data).hexdigest() != sha256:
            return None
        return data

    def _wanted(self, event: ChangesCommitted) -> dict[str, PutFile]:
        """Per sha256, a put of ``event`` whose content is neither inline nor already at its
        path in the checkout (a path the event also removes, or below one, counts as not)."""
        removed = {c.path for c in event.changes if isinstance(c, Remove)}
        wanted: dict[str, PutFile] = {}
        with self._root() as root:
            for change in event.changes:
                if not isinstance(change, PutFile) or change.text is not None or change.data:
                    continue
                if not change.size:
                    continue
                gone = change.path in removed or any(a in removed for a in ancestors(change.path))
                if gone or not self._holds_path(root, change):
                    wanted.setdefault(change.sha256, change)
        return wanted

    def _holds_path(self, root: Dir, change: PutFile) -> bool:
        try:
            with parent_of(root, change.path) as found:
                return found is not None and self._holds(*found, change.path, change.sha256)
        except OSError:
            return False

    def _holds(self, parent: Dir, name: str, path: str, sha256: str) -> bool:
        """True if ``name`` in ``parent`` (``tree/path``) is already this content (our own
        capture coming back)."""
        tracked = self.manifest.paths.get(path)
        if tracked is None or tracked.sha256 != sha256 or tracked.sig is None:
            return False
        try:
            st = parent.lstat(name)
        except OSError:
            return False
        return st is not None and stat.S_ISREG(st.st_mode) and file_sig(st) == tracked.sig

    def _apply_all(self, changes: list[AnyChange], contents: dict[str, bytes]) -> None:
        with self._root() as root:
            for change in changes:
                self._apply(root, change, contents)

    def _apply(
        self, root: Dir, change: PutFile | MakeDir | Remove, contents: dict[str, bytes]
    ) -> None:
        paths = self.manifest.paths
        if isinstance(change, Remove):
            with parent_of(root, change.path) as found:
                if found is not None and found[0].lstat(found[1]) is not None:
                    found[0].remove(found[1])  # else a link or a file stands on the way
                    self.changed()
            self._forget(change.path)
            return
        for above in ancestors(change.path):  # outermost first
            if paths.get(above) is None:
                paths[above] = Tracked(None)
                self.changed()  # it may be made below
        # Every directory on the way made, or made again where a link or a file stands.
        with parent_of(root, change.path, create=True) as found:
            assert found is not None
            directory, name = found
            if isinstance(change, MakeDir):
                st = directory.lstat(name)
                if st is None or not stat.S_ISDIR(st.st_mode):
                    self.changed()
                directory.ensure_dir(name).close()
                paths[change.path] = Tracked(None)
                return
            self._put(directory, name, change, contents)

    def _forget(self, path: str) -> None:
        """Drop ``path`` and what is below it from the manifest (the log removed it): a scan
        of every path only for a directory."""
        manifest = self.manifest
        held = manifest.paths.pop(path, None)
        prefix = path + "/"
        if held is not None and held.sha256 is None:
            for below in [p for p in manifest.paths if p.startswith(prefix)]:
                del manifest.paths[below]
        for kept in (manifest.local, manifest.present):
            if not kept:
                continue
            for key in [k for k in kept if _under(k.removeprefix("\0"), path, prefix)]:
                del kept[key]  # what was left uncommitted there went with it

    def _put(self, parent: Dir, name: str, change: PutFile, contents: dict[str, bytes]) -> None:
        paths = self.manifest.paths
        mode = 0o755 if change.executable else 0o644
        tracked = paths.get(change.path)
        st: os.stat_result | None = None
        if self._holds(parent, name, change.path, change.sha256):
            if tracked is not None and tracked.executable == change.executable:
                self.manifest.local.pop(change.path, None)
                self.manifest.present.pop(change.path, None)
                return  # our own capture, coming back: the file is already this
            with contextlib.suppress(OSError):  # else rewritten whole below
                st = parent.set_mode(name, mode)
                self.changed()
        if st is None:
            if change.text is not None:
                data = change.text.encode("utf-8", "surrogatepass")
            elif change.data:
                data = change.data
            else:
                data = contents.get(change.sha256, b"")  # by reference (or empty)
                if change.size and change.sha256 not in contents:  # held, then changed
                    raise RuntimeError(f"content of {change.path} is not at hand")
            st = parent.write_file(name, data, mode)
            self.changed()
        paths[change.path] = Tracked(change.sha256, change.executable, file_sig(st))
        self.manifest.local.pop(change.path, None)
        self.manifest.present.pop(change.path, None)

    def is_directory(self, path: str) -> bool | None:
        """Whether ``tree/path`` (normalised, ``""`` the root) is a directory reached through
        no link: None if nothing is there (or a link stands on the way), False if something
        else is (a link included)."""
        if not path:
            return True
        try:
            with self._root() as root, parent_of(root, path) as found:
                st = None if found is None else found[0].lstat(found[1])
        except OSError:
            return None
        return None if st is None else stat.S_ISDIR(st.st_mode)
