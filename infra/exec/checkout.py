"""A workspace's checkout on the executor's disk: built and kept up to date from the log, and
what a command changed in it captured.

Layout, under ``<data>/checkouts/<tenant>/<workspace>/``::

    tree/          the files as of ``version`` (plus what the ignore patterns keep local)
    manifest.bin   what ``tree/`` holds from the log: per path its sha256, mode and the stat
    manifest.log   signature it had when last seen, so that capture hashes only what changed
                   (``infra.exec.manifest``: the whole, and what changed since)
    dirty          exists while ``tree/`` is being changed; found on open, the checkout is
                   rebuilt from the log (a crash mid-command leaves no half state behind)

``sync`` applies the workspace's events after ``version`` (never copies the workspace); a new
checkout is first built from a reader's tree at a version, checked against the log
(``infra.exec.seed``), so that it costs the files at that version, not every revision ever
made; a fork's first, where commands run over overlays, from its source's checkout here
(hard links: ``infra.exec.links``), then its own events. ``merge`` moves what a command wrote over
its overlay into ``tree/`` (``infra.exec.layers``); ``capture`` lists the changes to commit, at the
paths the merge touched, or walking ``tree/`` when the command changed it in place
(``infra.exec.capture``);
``committed`` folds the outcome back into the manifest. The commit's own event is not read
back once the writer answered it (``answered``): the next ``sync`` folds it from the log's
last message, which it reads anyway, when it is the only event since (its predecessor is the
checkout's last; else the log is read as usual).

``tree/`` is the sandboxed command's to change: every name in it may be a link, a hard link or
swapped for one between two looks. Nothing here resolves a name in it on the host: each file
operation goes through ``infra.safefs`` (relative to directory descriptors opened
one name at a time without following links, new files at unpredictable names, checked after
the open), so the executor never reads, writes, chmods or walks outside ``tree/``.

In rooms, all under the manifest's invariant (it says what ``tree/`` holds from the log, and
capture trusts it to hash only what changed): the files written, made and removed from the
log's changes, through the same ``safefs`` handles (``infra.exec.tree_files``: ``TreeFiles``),
the whole builds from a reader's tree or a compaction's manifest (``infra.exec.builds``:
``Builds``), and here the ``Checkout`` on them: its lifetime, ``sync`` over the log (folded by
``core.evolve``), its own commit, and capture; what stands alone (the manifest's storage,
capture, the merge, the first build's checks) is apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import NamedTuple

import msgspec
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg

from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import (
    SCRUB_OP,
    ChangesCommitted,
    HistoryCompacted,
    WorkspaceForked,
    WorkspacePurged,
)
from contracts.limits import DEFAULT_EXCLUSIONS, Limits
from contracts.paths import ancestors
from contracts.subjects import HEADER_EVENT_HASH, Subjects
from core.evolve import ArchiveState, LockState, WorkspaceState, evolve, rebuilds, restore
from core.globs import Globs
from core.plan import Committed
from infra import log as eventlog
from infra.blobs import Blobs
from infra.compaction import decode_manifest
from infra.exec import capture as capturing
from infra.exec import layers, seed
from infra.exec.builds import Builds, Source
from infra.exec.capture import IGNORE_FILE, Captured
from infra.exec.gitignores import Cache
from infra.exec.links import LINKED
from infra.exec.manifest import LOG, WHOLE, Changes, Manifest, Store, Tracked, watched
from infra.exec.sandbox import overlay
from infra.exec.trash import Trash
from infra.exec.watch import TreeWatch
from infra.safefs import Dir, Owner

log = logging.getLogger("quill.executor")

DEFAULT_IGNORE: tuple[str, ...] = tuple(p for p in DEFAULT_EXCLUSIONS if p != "**/.git/**")
"""WAP's default exclusions, except ``.git``: git state is versioned like any file."""
IGNORE_FILE_BYTES = 1024 * 1024
"""The most of ``.quillignore`` read."""

Fetch = seed.Fetch

COUNTS: Counter[str] = Counter()
"""Events applied from the log (``events``), checkouts built from a reader's tree
(``seeded``) and replayed from the log instead (``replayed``), forks' first checkouts built
from their source's (``linked``) or not after all (``unlinked``: then from a reader's tree),
commits of a checkout's own folded from the last message, not read back (``own``), by this
process (the executor's ping shows them)."""


def _scrub(event: object) -> bool:
    """``quill scrub``'s closing event: the log before it was rewritten."""
    return isinstance(event, HistoryCompacted) and event.op == SCRUB_OP


class Own(NamedTuple):
    """The checkout's own commit, answered by the writer and not folded yet (``answered``)."""

    version: int
    request_id: str
    """The ``apply``'s: its event carries it."""
    after: tuple[int, str]
    """The log sequence and hash of the event the checkout was at: the commit's predecessor."""


async def _once(events: list[Committed]) -> AsyncIterator[list[Committed]]:
    yield events


class Checkout(Builds):
    """One workspace's checkout (one command at a time: the executor holds its lock)."""

    def __init__(
        self,
        home: Path,
        tenant: str,
        workspace: str,
        js: JetStreamContext,
        subjects: Subjects,
        blobs: Blobs,
        fetch: Fetch,
        *,
        owner: Owner | None = None,
        trash: Trash | None = None,
        tree: seed.Tree | None = None,
        changed: seed.Changed | None = None,
        source: Source | None = None,
        links: bool = False,
    ) -> None:
        """``owner``: who ``tree/`` and everything the checkout writes into it belongs to (the
        sandboxed command's host uid, ``Provider.owner``; None: the executor's own);
        ``trash``: where a wiped checkout goes (None: removed in place); ``tree``: a reader's
        ``qry.tree``, to build a new checkout from (``infra.exec.seed``; None: from the log);
        ``changed``: its ``qry.tree`` of what changed since a version (what a fork whose first
        checkout links this one's files takes from a reader instead);
        ``source``: a fork's source's checkout, to build a fork's first from (hard links:
        ``infra.exec.links``); ``links``: whether a checkout whose files share inodes with
        another's may be kept (commands never write its ``tree/`` in place: else it is
        wiped when opened)."""
        self.home = home
        self.owner, self.trash = owner, trash
        self._fetch = fetch
        self._tree = tree
        self.changed_tree = changed
        self._source = source
        self._links = links
        self.tree = home / "tree"
        self.tenant, self.workspace = tenant, workspace
        self._js, self._subject = js, subjects.evt(tenant, workspace)
        self._blobs = blobs.of(tenant, workspace)
        self._manifest_blobs = Blobs(js).of(tenant, workspace)
        self.manifest = watched(Manifest())
        self.store = Store(home)
        self.gitignores = Cache()
        """Its ``.gitignore`` files as compiled when capture last read them."""
        self.changed()  # its first generation
        self._last: RawStreamMsg | None = None
        """The log's last message of the workspace, as the last ``sync`` read it."""
        self._head: tuple[int, str] | None = None
        """The log sequence and hash of the event the checkout is at, when a ``sync`` saw it
        last in the log (else unknown: None)."""
        self._own: Own | None = None
        self.persist = True
        """Whether ``begin`` and ``save`` keep the manifest on disk (so that the checkout can be
        opened again, and a crash mid-command is found). A shell's checkout is never opened
        again (discarded when the shell closes, and at the executor's start): it keeps its
        manifest in memory only, and a command in it writes no file of the executor's."""
        self.watch: TreeWatch | None = None
        """A shell's: what changed in ``tree/``, which its sandbox writes in place
        (``infra.exec.watch``): capture looks at that, not the whole tree."""
        self._ignore: tuple[bytes | None, Globs] | None = None
        """``.quillignore``'s bytes as last read (None: none) and the patterns compiled from
        them: compiled again only when they change."""

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def limits(self) -> Limits:
        return self.manifest.limits

    @property
    def known(self) -> int:
        """The version the checkout holds the files of: ``version``, or its own commit's,
        answered and not folded yet (``answered``)."""
        return self._own.version if self._own is not None else self.manifest.version

    # ------------------------------------------------------------------ lifetime
    def open(self) -> None:
        """Load the manifest; a checkout left dirty (or without one) starts over empty."""
        path = self.home / WHOLE
        if (self.home / "dirty").exists() or not path.exists():
            self._wipe()
            return
        if not self._links and (self.home / LINKED).exists():
            # its files share inodes with another checkout's: a command writing one in place
            # (no overlay here) would change both
            log.info("checkout %s/%s: hard-linked, commands run in place: rebuilt", *self._name)
            self._wipe()
            return
        if self.owner is not None and self._owned_by() != self.owner[0]:
            log.info("checkout %s/%s: not its sandbox's to change: rebuilding", *self._name)
            self._wipe()
            return
        try:
            self.manifest = self.store.load()
        except (msgspec.DecodeError, OSError) as exc:
            log.warning("checkout %s/%s: unreadable manifest (%s): rebuilding", *self._name, exc)
            self._wipe()

    @property
    def _name(self) -> tuple[str, str]:
        return self.tenant, self.workspace

    def _owned_by(self) -> int | None:
        try:
            return self.tree.lstat().st_uid
        except OSError:
            return None

    def _wipe(self) -> None:
        """Start over empty: the old home goes to the trash (or is removed), however deep
        the command made it."""
        self._discard(self.home)
        self._new_tree()
        self.manifest = watched(Manifest(present_known=True))
        self.store.rewrite = True
        self.changed()
        self.save()

    def begin(self) -> None:
        """Mark ``tree/`` as being changed (cleared by ``save``)."""
        if self.persist:
            (self.home / "dirty").touch()

    def save(self) -> None:
        """Write what changed in the manifest (``infra.exec.manifest``), then clear the dirty
        mark (not ``persist``: only forget what changed)."""
        if not self.persist:
            for changes in (self.manifest.paths, self.manifest.local, self.manifest.present):
                if isinstance(changes, Changes):
                    changes.changed.clear()
            return
        self.store.save(self.manifest)
        (self.home / "dirty").unlink(missing_ok=True)

    def own_files(self) -> tuple[int, int]:
        """(bytes, entries) of the checkout's own files beside ``tree/`` (the manifest's),
        as the quota counts them."""
        total = entries = 0
        for name in (WHOLE, LOG, "dirty", "manifest.tmp"):
            with contextlib.suppress(OSError):
                total += layers.file_bytes((self.home / name).lstat())
                entries += 1
        return total, entries

    def reset(self) -> None:
        """Forget everything: the next ``sync`` materialises the workspace afresh."""
        self._wipe()

    # ------------------------------------------------------------------ sync
    async def latest_seq(self) -> int:
        # From the stream leader: on a cluster a direct get may come from a replica behind
        # it, and a command asking for the version its client just wrote would be refused.
        self._last = await eventlog.last_message(self._js, self._subject, fresh=True)
        return int(self._last.seq or 0) if self._last is not None else 0

    def answered(self, version: int, request_id: str) -> bool:
        """The writer answered the checkout's own commit (``committed``, the ``apply`` of
        ``request_id``) with ``version``: True when that is the version after the checkout's,
        the commit's event the only one since. It is not read back now: the next ``sync``
        folds it from the log's last message, which it reads anyway, if that is still it (its
        version and request id, the checkout's last event its predecessor), else reads the
        log as usual. False: others wrote between; ``sync`` now."""
        head = self._head
        if version != self.manifest.version + 1 or head is None or head[0] != self.manifest.seq:
            return False
        self._own = Own(version, request_id, head)
        return True

    def _only_own(self, own: Own | None, upto: int | None) -> list[Committed] | None:
        """The checkout's own commit (``own``) as the log's last message holds it, when it is
        the only event after the checkout's; else None (the log is read)."""
        raw = self._last
        if own is None or raw is None or own.after[0] != self.manifest.seq:
            return None
        if upto is not None and upto < own.version:
            return None
        try:
            item = eventlog.stored(raw)
        except (eventlog.CorruptEvent, msgspec.DecodeError):
            return None  # read as usual, and refused there
        event = item.event
        if (event.version, event.request_id, event.prev_hash) != (
            own.version,
            own.request_id,
            own.after[1],
        ):
            return None
        COUNTS["own"] += 1
        return [item]

    def _at_head(self, last: int) -> None:
        """Remember the log sequence and hash of the event the checkout is at, when it is the
        log's last (``last``, its message read by ``latest_seq``)."""
        raw, self._head = self._last, None
        if raw is not None and self.manifest.seq == last == raw.seq:
            digest = (raw.headers or {}).get(HEADER_EVENT_HASH)
            if digest is not None:
                self._head = (last, digest)

    async def behind(self) -> bool:
        """Whether the log holds events the checkout has not applied (one read of the log's
        last message, as ``sync`` starts with): False, and ``sync`` would do nothing."""
        last = await self.latest_seq()
        if last > self.manifest.seq:
            return True
        if self._own is None:
            self._at_head(last)
        return False

    async def sync(self, upto_version: int | None = None) -> None:
        """Apply the workspace's events after ``version`` (up to ``upto_version``, default
        the latest), writing files, making directories and removing paths. The checkout's
        own commit alone since (``answered``) is folded from the last message, not read
        again."""
        last = await self.latest_seq()
        own, self._own = self._own, None
        if last <= self.manifest.seq:
            self._at_head(last)
            return
        self.begin()
        forked = None
        if self.manifest.seq == 0 and self._source is not None:
            forked = await self._linked(last, upto_version)  # a fork: its source's files
        if forked is not None:
            state = self._state()
            evolve(state, forked.event, forked.hash, forked.seq, tree=False)
            self._keep(state)  # at the fork point: the log is followed from its event
        elif self.manifest.seq == 0 and self._tree is not None:
            await self._seed(upto_version)  # the files at a version, not every revision
        # A chunk of the log at a time: an uncompacted log of a million events materialises
        # in bounded memory.
        mine = self._only_own(own, upto_version)
        chunks = (
            _once(mine)
            if mine is not None
            else eventlog.chunks(self._js, self._subject, self.manifest.seq, last)
        )
        state = self._state()
        async for events in chunks:
            COUNTS["events"] += len(events)
            scrubs = [i for i, e in enumerate(events) if _scrub(e.event)]
            if scrubs:  # quill scrub rewrote the log: its (last) scrub event rebuilds the tree
                events = events[scrubs[-1] :]
            for item in events:
                event = item.event
                if rebuilds(state, event):
                    # the log before it is purged: start from its manifest (as of an older
                    # version it keeps whole, for a past checkout)
                    assert isinstance(event, HistoryCompacted)
                    at = min(event.version, upto_version or event.version)
                    kept = decode_manifest(await self._manifest_blobs.get(event.manifest))
                    seq = item.seq if at == event.version else None
                    restore(state, event, kept, at, item.hash, seq, tree=False)
                    await self._rebuild(kept, at)
                    self._keep(state)
                    if at < event.version:
                        break
                    continue
                # a purge's version is the old workspace's: the versions start again after it
                if (
                    upto_version is not None
                    and event.version > upto_version
                    and not isinstance(event, WorkspacePurged)
                ):
                    break
                if isinstance(event, WorkspaceForked):
                    # a fork's tree is its source's at the fork point: built from a reader
                    # (``_seed``), never from its own log alone; started over, built next time
                    await asyncio.to_thread(self._wipe)
                    raise QuillError(
                        ErrorCode.UNAVAILABLE,
                        f"{self.tenant}/{self.workspace} is a fork: its checkout is built "
                        "from a reader replica, which did not answer; retry",
                        {"retry_after_ms": 1000},
                    )
                match event:
                    case ChangesCommitted():  # its files, then the rest of it (evolve)
                        contents = await self._contents(event)
                        # File work off the event loop: a large event must not stall heartbeats.
                        await asyncio.to_thread(self._apply_all, event.changes, contents)
                if evolve(state, event, item.hash, item.seq, tree=False):
                    # purged (and maybe created again): nothing of the old workspace stays
                    await asyncio.to_thread(self._wipe)
                    self.begin()
                self._keep(state)
            else:
                continue
            break  # at upto_version
        self._at_head(last)
        await asyncio.to_thread(self.save)

    def _state(self) -> WorkspaceState:
        """The manifest's head as a state to evolve (the files are on disk: ``tree=False``)."""
        m = self.manifest
        state = WorkspaceState(
            self.tenant, self.workspace, exists=m.version > 0, version=m.version,
            last_seq=m.seq, trust=m.trust, limits=m.limits, floor=m.floor,
            uncommitted=m.uncommitted,
        )  # fmt: skip
        controls = state.controls
        controls.commands = m.commands
        controls.lock = None if m.lock is None else LockState(*m.lock)
        controls.archived = None if m.archived is None else ArchiveState(*m.archived)
        return state

    def _keep(self, state: WorkspaceState) -> None:
        """What the manifest's head keeps of ``state``."""
        m, controls = self.manifest, state.controls
        m.version, m.seq, m.floor = state.version, state.last_seq, state.floor
        m.limits, m.trust, m.commands = state.limits, state.trust, controls.commands
        lock, archived = controls.lock, controls.archived
        m.lock = None if lock is None else (lock.holder, lock.expires)
        m.archived = None if archived is None else (archived.at, archived.by, archived.reason)
        m.uncommitted = state.uncommitted

    async def _seed(self, upto: int | None) -> None:
        """Build the new checkout from a reader's tree as of ``upto`` (default: the reader's
        latest version), checked against the log (``infra.exec.seed``); if it cannot be, it
        stays empty, to be replayed from the log."""
        assert self._tree is not None
        try:
            await self._build(self._tree, upto)
            COUNTS["seeded"] += 1
        except Exception as exc:
            COUNTS["replayed"] += 1
            how = log.warning if isinstance(exc, seed.Mismatch) else log.info
            how(
                "checkout %s/%s: replayed from the log, not built from a reader: %s",
                *self._name,
                exc,
            )
            await asyncio.to_thread(self._wipe)
            self.begin()

    async def _linked(self, last: int, upto: int | None) -> Committed | None:
        """``_from_source`` (``infra.exec.builds``), counted; a half-made build starts over
        empty (then built from a reader's tree)."""
        try:
            forked = await self._from_source(last, upto)
        except Exception as exc:
            COUNTS["unlinked"] += 1
            log.warning("checkout %s/%s: not linked to its source's: %s", *self._name, exc)
            await asyncio.to_thread(self._wipe)
            self.begin()
            return None
        if forked is not None:
            COUNTS["linked"] += 1
        return forked

    # ------------------------------------------------------------------ capture
    def ignore_patterns(self) -> Globs:
        """The defaults plus the workspace's ``.quillignore``, if the checkout has one."""
        with self._root() as root:
            return self._ignore_patterns(root)

    def _ignore_patterns(self, root: Dir) -> Globs:
        data: bytes | None
        try:  # a link there is not followed: the defaults only
            data, _ = root.read_file(IGNORE_FILE, IGNORE_FILE_BYTES)
        except OSError:
            data = None
        cached = self._ignore
        if cached is not None and cached[0] == data:
            return cached[1]
        globs = self._compiled(data)
        self._ignore = (data, globs)
        return globs

    def _compiled(self, data: bytes | None) -> Globs:
        if data is None:
            return Globs.names(DEFAULT_IGNORE)
        text = data.decode("utf-8", "replace")
        lines = [line.strip().rstrip("/") for line in text.splitlines()]
        patterns = [line for line in lines if line and not line.startswith("#")]
        try:
            return Globs.names([*DEFAULT_IGNORE, *patterns])
        except QuillError as exc:
            log.warning("%s/%s: %s ignored: %s", *self._name, IGNORE_FILE, exc.message)
            return Globs.names(DEFAULT_IGNORE)

    def capture(self, merged: layers.Merged | None = None) -> Captured:
        """What differs from the manifest (blocking: run it in a thread): at the paths a merge
        touched (``merged``), else in the whole of ``tree/`` (``infra.exec.capture``)."""
        with self._root() as root:
            ignore = self._ignore_patterns(root)
            git = self.gitignores.lookup(root) if self.manifest.limits.gitignore else None
            if merged is None:  # the command changed tree/ in place (a spare's mount is stale)
                self.changed()
                dirty = self.watch.take() if self.watch is not None else None
                if dirty is not None:  # a shell's: what its watch saw change
                    return capturing.touched(root, self.manifest, ignore, dirty, git, True)
                return capturing.whole(root, self.manifest, ignore, git)
            return capturing.touched(root, self.manifest, ignore, merged.touched, git)

    def merge(self, layer: Path) -> layers.Merged:
        """Move what a command wrote over its overlay (``layer``) into ``tree/``, and remove
        the layer (blocking: run it in a thread). Call ``begin`` first."""
        merged = None
        try:
            with self._root() as root:
                merged = layers.merge(root, layer)
        finally:
            if merged is None or merged.touched or merged.failed:  # else tree/ is as it was
                self.changed()
            with contextlib.suppress(OSError):
                overlay.remove(layer)
        return merged

    def committed(self, out: Captured, applied: set[str], base: int) -> None:
        """Record the committed part of ``out`` (``applied`` paths) in the manifest, so that
        syncing over the event it made rewrites nothing; ``version`` stays ``base``."""
        paths = self.manifest.paths
        for item in out.changes:
            path = item.path
            if path not in applied:
                continue
            if isinstance(item, rq.DeleteChange):
                held = paths.pop(path, None)
                if held is not None and held.sha256 is None:  # a directory: what is below
                    prefix = path + "/"
                    for p in [p for p in paths if p.startswith(prefix)]:
                        del paths[p]
            elif isinstance(item, rq.MkdirChange):
                paths[path] = Tracked(None)
            else:
                digest, executable, sig = out.sigs[path]
                for parent in ancestors(path):
                    if parent not in paths:
                        paths[parent] = Tracked(None)
                paths[path] = Tracked(digest, executable, sig)
        manifest = self.manifest
        manifest.local.update(out.local)
        for key in [k for k in manifest.present if k not in out.kept]:
            del manifest.present[key]
        for key, value in out.kept.items():
            if manifest.present.get(key) != value:
                manifest.present[key] = value
        manifest.present_known = True
        known = set(manifest.ignored)
        manifest.ignored += [p for p, _ in out.seen_ignored if p not in known]
        assert manifest.version == base
