"""A checkout's ``tree/`` built whole: from a reader's tree at a version (the first build,
checked against the log: ``infra.exec.seed``), from a compaction's manifest (the log
before it is purged: ``Checkout.sync`` meets its event), or, a fork's first build, from its
source's checkout on the same executor (hard links: ``infra.exec.links``; what changed since
the fork point in the source, from its reader). All write through
``TreeFiles._apply`` (``infra.exec.tree_files``) or record what they linked, so the manifest
says what ``tree/`` holds.

A base of ``Checkout`` (``infra.exec.checkout``), which decides when to build.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Protocol

from nats.js import JetStreamContext

from contracts import hashing
from contracts import replies as rp
from contracts.events import (
    CompactionManifest,
    MakeDir,
    PutFile,
    WorkspaceForked,
)
from contracts.uncommitted import Recorded
from core.plan import Committed
from infra import blobs
from infra import log as eventlog
from infra.exec import links, seed
from infra.exec.manifest import Changes, Manifest, PathMap, Store, Tracked
from infra.exec.tree_files import TreeFiles
from infra.safefs import Dir

log = logging.getLogger("quill.executor")


class Held(Protocol):
    """What a fork's first build needs of its source's checkout (held, unchanged meanwhile)."""

    home: Path
    tree: Path
    manifest: Manifest
    changed_tree: seed.Changed | None


Source = Callable[[str, int], contextlib.AbstractAsyncContextManager[Held | None]]
"""The source's checkout on this executor, held while its files are linked:
``source(workspace, version)``; None when it has none at hand (or one in use)."""


class Builds(TreeFiles):
    """The whole builds of ``tree/`` (set up by ``Checkout.__init__``)."""

    store: Store
    tenant: str
    home: Path
    _js: JetStreamContext
    _subject: str
    _source: Source | None

    async def _build(self, tree: seed.Tree, upto: int | None) -> None:
        page = await tree(None, upto)
        head = page.head
        if head is None or (upto is not None and head.version != upto):
            raise seed.Mismatch(f"the reader answered no head as of version {upto}")
        total, version = 0, head.version
        if head.forked_from:  # a fork: what it inherited is in its layers' namespaces
            self._blobs.behind = [blobs.prefix(self.tenant, name) for name in head.forked_from]
        coming: asyncio.Future[rp.TreePage] | None = None
        try:
            while True:
                if page.next is not None:  # the next page comes while this one is written
                    coming = asyncio.ensure_future(tree(page.next, version))
                for item in page.entries:
                    total = hashing.tree_add(total, seed.digest(item))
                await self._write_page(page, version)
                if coming is None:
                    break
                page, coming = await coming, None
        finally:
            if coming is not None:
                coming.cancel()
        if hashing.tree_hex(total) != head.tree_hash:
            raise seed.Mismatch(f"the tree at v{version} does not sum to {head.tree_hash}")
        found = await eventlog.read(self._js, self._subject, head.seq - 1, head.seq)
        event = found[0].event if len(found) == 1 else None
        if event is None or (event.version, event.tree_hash) != (version, head.tree_hash):
            raise seed.Mismatch(f"the log's event at {head.seq} is not v{version}'s")
        m = self.manifest
        m.version, m.seq, m.floor = version, head.seq, head.floor
        m.limits, m.trust, m.commands = head.limits, head.trust, head.commands
        m.lock = None if head.lock is None else (head.lock.holder, head.lock.expires)
        a = head.archived
        m.archived = None if a is None else (a.since, a.by, a.reason)
        m.uncommitted = {
            u.path: Recorded(u.reason, u.by_command, u.version) for u in head.uncommitted
        }

    async def _write_page(self, page: rp.TreePage, version: int) -> None:
        """Write a page's entries as of ``version`` (contents fetched a group at a time)."""
        for group in seed.groups(page.entries, page.contents):
            contents = await seed.contents_of(
                group, page.contents, self._blobs, self._fetch, version
            )
            await asyncio.to_thread(self._write_items, group, contents)

    def _write_items(self, items: list[rp.TreeItem], contents: dict[str, bytes]) -> None:
        with self._root() as root:
            for change in seed.changes(items):
                self._apply(root, change, contents)

    async def _rebuild(self, kept: CompactionManifest, at: int) -> None:
        """Materialise the tree as of ``at`` from a compaction's manifest (every content it
        names is in WS_BLOBS), in place of what the checkout held: a group of rows at a time
        (at most 512 of them or ~32 MiB of contents, fetched 16 at once), so a compaction of
        100,000 files is never all in memory."""
        # revision rows: (path, version, until, parent, kind, sha256, size, file_version...)
        live = sorted(
            (r for r in kept.revisions if int(r[1]) <= at < int(r[2])), key=lambda r: str(r[0])
        )  # parents before children
        gate = asyncio.Semaphore(16)

        async def fetch(sha: str) -> tuple[str, bytes]:
            async with gate:
                return sha, await self._blobs.get(sha)

        start = 0
        while True:
            end, size = start, 0
            while end < len(live) and end - start < 512 and size < 32 * 1024 * 1024:
                size += int(str(live[end][6])) if live[end][4] == "f" else 0
                end += 1
            group = live[start:end]
            shas = {str(r[5]) for r in group if r[4] == "f"}
            contents = dict(await asyncio.gather(*(fetch(sha) for sha in shas)))
            await asyncio.to_thread(self._materialise, group, contents, start == 0)
            if end >= len(live):
                break
            start = end

    def _materialise(
        self, live: list[tuple[object, ...]], contents: dict[str, bytes], fresh: bool = True
    ) -> None:
        """Write ``live`` (revision rows, parents first); ``fresh``: in an empty tree."""
        if fresh:
            self._discard(self.tree)
            self._new_tree()
            manifest = self.manifest
            manifest.paths, manifest.local, manifest.present = PathMap(), Changes(), Changes()
            manifest.ignored, manifest.present_known = [], True
            self.store.rewrite = True
            self.changed()
        with self._root() as root:
            for row in sorted(live, key=lambda r: str(r[0])):  # parents before children
                self._materialise_row(root, row, contents)

    def _materialise_row(
        self, root: Dir, row: tuple[object, ...], contents: dict[str, bytes]
    ) -> None:
        path, kind, sha = str(row[0]), row[4], row[5]
        if path:
            if kind == "d":
                self._apply(root, MakeDir(path=path), contents)
                return
            assert isinstance(sha, str)
            put = PutFile(
                path=path,
                sha256=sha,
                size=int(str(row[6])),
                file_version=int(str(row[7])),
                created=datetime.fromisoformat(str(row[10])),
                executable=bool(row[8]),
            )
            self._apply(root, put, contents)

    async def _from_source(self, last: int, upto: int | None) -> Committed | None:
        """A fork's first build from its source's checkout (``infra.exec.links``): when the
        workspace's first event is ``workspace_forked`` (at or before ``upto``) and the
        executor holds the source's checkout, ``tree/`` is made of links to its files (the
        few that fail the check fetched from a reader as of the fork point). A source's
        checkout at another version than the fork point's: what changed between the two is
        not linked, but taken as of the fork point from a reader (``_changes``). The result
        must sum to the event's tree hash; the event is returned, for the caller to fold and
        follow the log from. None: not a fork, or no such checkout (``tree/`` untouched).

        Raises:
            OSError, links.TooMany, seed.Mismatch: half built (the caller starts over empty).
        """
        assert self._source is not None
        item = await eventlog.first(self._js, self._subject, last)
        event = item.event if item is not None else None
        if not isinstance(event, WorkspaceForked) or (upto is not None and upto < event.version):
            return None
        taken: rp.TreePage | None = None
        async with self._source(event.source, event.version) as source:
            if source is None:
                return None
            held = source.manifest
            paths: Mapping[str, Tracked] = held.paths
            if held.version == event.version:
                if await asyncio.to_thread(links.tree_hash, paths) != event.tree_hash:
                    return None  # not at the fork point's tree
            else:  # moved on (or behind): all but what changed between the two versions
                taken = await self._changes(source, held.version, event.version, event.tree_hash)
                if taken is None or taken.changed is None:
                    return None
                paths = await asyncio.to_thread(links.outside, paths, set(taken.changed))
            skip = {k.removeprefix("\0") for k in (*held.local, *held.present)}
            linked = await asyncio.to_thread(self._link_from, source.tree, paths, skip)
            await asyncio.to_thread((source.home / links.LINKED).touch)
            changed = source.changed_tree
        assert item is not None
        self._blobs.behind = [blobs.prefix(self.tenant, b.workspace) for b in event.lineage]
        manifest = self.manifest.paths
        for path, tracked in linked.paths.items():
            manifest[path] = tracked
        if linked.missing:
            contents = await self._fetch_missing(linked.missing, event.version)
            await asyncio.to_thread(self._write_missing, linked.missing, contents)
        while taken is not None:  # what changed, as of the fork point
            await self._write_page(taken, event.version)
            after, taken = taken.next, None
            if after is not None and changed is not None:
                taken = await changed(after, event.version, held.version)
        if await asyncio.to_thread(links.tree_hash, manifest) != event.tree_hash:
            raise seed.Mismatch(f"the linked tree does not sum to {event.tree_hash}")
        return item

    @staticmethod
    async def _changes(source: Held, at: int, version: int, tree_hash: str) -> rp.TreePage | None:
        """The first page of what changed in the source between ``at`` (its checkout's) and
        ``version`` (the fork point), as of the fork point; None where a reader cannot tell
        (it answers no ``changed``), or no reader answers."""
        if source.changed_tree is None or at == 0:
            return None
        try:
            page = await source.changed_tree(None, version, at)
        except Exception as exc:  # no reader, or one behind: built from a reader's tree
            log.info("a fork's first checkout: what changed is not known: %s", exc)
            return None
        head = page.head
        if head is None or (head.version, head.tree_hash) != (version, tree_hash):
            return None
        return page

    def _link_from(
        self, source: Path, paths: Mapping[str, Tracked], skip: set[str]
    ) -> links.Linked:
        (self.home / links.LINKED).touch()  # before the first link: a crash leaves it marked
        with Dir.open(source) as src, self._root() as root:
            return links.link_tree(src, root, paths, skip)

    async def _fetch_missing(self, missing: dict[str, Tracked], version: int) -> dict[str, bytes]:
        gate = asyncio.Semaphore(seed.AT_ONCE)

        async def get(path: str, sha: str) -> tuple[str, bytes]:
            async with gate:
                data = await self._fetch(path, version)
            if hashlib.sha256(data).hexdigest() != sha:
                raise seed.Mismatch(f"the content of {path} at v{version} is not {sha}")
            return sha, data

        wanted = {t.sha256: p for p, t in missing.items() if t.sha256 is not None}
        return dict(await asyncio.gather(*(get(p, sha) for sha, p in wanted.items())))

    def _write_missing(self, missing: dict[str, Tracked], contents: dict[str, bytes]) -> None:
        with self._root() as root:
            for path, tracked in sorted(missing.items()):
                sha = tracked.sha256 or ""
                put = PutFile(
                    path=path,
                    sha256=sha,
                    size=len(contents.get(sha, b"")),
                    file_version=0,
                    created=seed.CREATED,
                    executable=tracked.executable,
                )
                self._apply(root, put, contents)
