"""A workspace's checkout on the executor's disk: materialised from the log, and the capture of
what a command changed in it.

Layout, under ``<data>/checkouts/<tenant>/<workspace>/``::

    tree/          the files as of ``version`` (plus what the ignore patterns keep local)
    manifest.bin   what ``tree/`` holds from the log: per path its sha256, mode and the stat
                   signature it had when last seen, so that capture hashes only what changed
    dirty          exists while ``tree/`` is being changed; found on open, the checkout is
                   rebuilt from the log (a crash mid-command leaves no half state behind)

``sync`` applies the workspace's events after ``version`` (never copies the workspace);
``capture`` walks ``tree/`` after a command and lists the changes to commit; ``committed``
folds the outcome back into the manifest. Capture never follows a symlink and never descends
into an ignored directory that holds nothing from the log.

``tree/`` is the sandboxed command's to change: every name in it may be a link, a hard link or
swapped for one between two looks. Nothing here resolves a name in it on the host: each file
operation goes through ``infra.safefs`` (relative to directory descriptors opened
one name at a time without following links, new files at unpredictable names, checked after
the open), so the executor never reads, writes, chmods or walks outside ``tree/``.

Why one module of ~650 lines: sync and capture are two halves of one invariant (the manifest
says what ``tree/`` holds from the log, and capture trusts it to hash only what changed), and
both walk the same hostile tree through the same ``safefs`` handles; split, each half would
need the other's private view of the manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import msgspec
from nats.js import JetStreamContext

from contracts import requests as rq
from contracts.errors import QuillError
from contracts.events import (
    SCRUB_OP,
    AnyChange,
    ChangesCommitted,
    HistoryCompacted,
    LockAcquired,
    LockReleased,
    MakeDir,
    PutFile,
    Remove,
    TrustChanged,
    WorkspaceArchived,
    WorkspaceCreated,
    WorkspacePurged,
    WorkspaceUnarchived,
)
from contracts.limits import DEFAULT_EXCLUSIONS, DEFAULT_LIMITS, Limits
from contracts.paths import MAX_PATH_BYTES, ancestors, check_name, printable
from contracts.subjects import Subjects
from contracts.uncommitted import Recorded, fold_uncommitted
from core.globs import Globs
from infra import log as eventlog
from infra.blobs import Blobs
from infra.compaction import decode_manifest
from infra.exec.trash import Trash
from infra.safefs import Dir, Owner, parent_of, remove_tree, walk

log = logging.getLogger("quill.executor")

IGNORE_FILE = ".quillignore"
"""A workspace file of more ignore patterns (one glob a line, ``#`` comments; a pattern
without ``/`` matches a name at any depth, as in ``.gitignore``)."""
DEFAULT_IGNORE: tuple[str, ...] = tuple(p for p in DEFAULT_EXCLUSIONS if p != "**/.git/**")
"""WAP's default exclusions, except ``.git``: git state is versioned like any file."""
IGNORE_FILE_BYTES = 1024 * 1024
"""The most of ``.quillignore`` read."""

Fetch = Callable[[str, int], Awaitable[bytes]]
"""A file's content as of a version, from a reader: ``fetch(path, version)``."""

Sig = tuple[int, int, int, int]
"""(size, mtime_ns, ctime_ns, inode): a file is re-read when any of them differs."""


class Tracked(msgspec.Struct, array_like=True, frozen=True):
    """A path the checkout holds from the log."""

    sha256: str | None
    """None for a directory."""
    executable: bool = False
    sig: Sig | None = None


class Manifest(msgspec.Struct, kw_only=True):
    version: int = 0
    seq: int = 0
    limits: Limits = DEFAULT_LIMITS
    trust: str = "full"
    commands: bool = False
    """``restricted``: whether commands are offered."""
    floor: int = 0
    """The oldest version compaction kept whole (``history_compacted``)."""
    paths: dict[str, Tracked] = msgspec.field(default_factory=dict)
    local: dict[str, Sig] = msgspec.field(default_factory=dict)
    """Files left uncommitted (skipped), as last reported: not reported again unless changed."""
    ignored: list[str] = msgspec.field(default_factory=list)
    """Ignored paths seen at the top of an ignored subtree (reported when new)."""
    lock: tuple[str, datetime] | None = None
    """The workspace lock as of ``version``: (holder session, expires); a command of another
    session is refused before it runs, as the writer would refuse its changes."""
    uncommitted: dict[str, Recorded] = msgspec.field(default_factory=dict)
    """The paths the log records as left uncommitted as of ``version`` (a command whose set
    differs records its own, even when it changed nothing)."""
    archived: tuple[datetime, str | None, str | None] | None = None
    """While the workspace is archived: (since, by, reason); commands are refused before
    they run, as the writer would refuse their changes."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Manifest)


@dataclass
class Captured:
    """What a command changed, as an ``apply`` change set, and what was left out."""

    changes: list[rq.ApplyItem] = field(default_factory=list)
    kinds: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Per changed path: (``created``/``modified``/``deleted``, ``file``/``directory``)."""
    contents: dict[str, bytes] = field(default_factory=dict)
    """Per put path: the content (kept out of ``changes`` until the executor packs them)."""
    sigs: dict[str, tuple[str, bool, Sig]] = field(default_factory=dict)
    """Per put path: (sha256, executable, stat signature) to record once committed."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """Paths not committed that are new or changed since last reported: (path, reason)."""
    present: list[tuple[str, str]] = field(default_factory=list)
    """Every path not committed that the tree holds now (reported or not): (path, reason)."""
    ignored: list[str] = field(default_factory=list)
    local: dict[str, Sig] = field(default_factory=dict)
    seen_ignored: list[str] = field(default_factory=list)


def size_text(size: int) -> str:
    """``512 bytes``, ``4 MiB``, ``10.5 MiB``: a size as the reasons say it."""
    if size < 1024:
        return f"{size} bytes"
    value, units = size / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.1f}".removesuffix(".0") + f" {units[0]}"


def file_sig(st: os.stat_result) -> Sig:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def invalid(rel: str) -> str | None:
    """Why the last name of ``rel``, a path found in the tree (its parents already checked),
    breaks the workspace path rule (``contracts.paths``), or None."""
    why = check_name(rel.rpartition("/")[2])
    if why is None and len(rel.encode()) > MAX_PATH_BYTES:
        why = f"path longer than {MAX_PATH_BYTES} bytes"
    return why


def _scrub(event: object) -> bool:
    """``quill scrub``'s closing event: the log before it was rewritten."""
    return isinstance(event, HistoryCompacted) and event.op == SCRUB_OP


class Checkout:
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
    ) -> None:
        """``owner``: who ``tree/`` and everything the checkout writes into it belongs to (the
        sandboxed command's host uid, ``Provider.owner``; None: the executor's own);
        ``trash``: where a wiped checkout goes (None: removed in place)."""
        self.home = home
        self.owner, self.trash = owner, trash
        self._fetch = fetch
        self.tree = home / "tree"
        self.tenant, self.workspace = tenant, workspace
        self._js, self._subject = js, subjects.evt(tenant, workspace)
        self._blobs = blobs.of(tenant, workspace)
        self._manifest_blobs = Blobs(js).of(tenant, workspace)
        self.manifest = Manifest()

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def limits(self) -> Limits:
        return self.manifest.limits

    # ------------------------------------------------------------------ lifetime
    def open(self) -> None:
        """Load the manifest; a checkout left dirty (or without one) starts over empty."""
        path = self.home / "manifest.bin"
        if (self.home / "dirty").exists() or not path.exists():
            self._wipe()
            return
        if self.owner is not None and self._owned_by() != self.owner[0]:
            log.info("checkout %s/%s: not its sandbox's to change: rebuilding", *self._name)
            self._wipe()
            return
        try:
            self.manifest = _decoder.decode(path.read_bytes())
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

    def _root(self) -> Dir:
        """``tree/``, opened so that what is made in it belongs to ``owner``."""
        return Dir.open(self.tree, self.owner)

    def _wipe(self) -> None:
        """Start over empty: the old home goes to the trash (or is removed), however deep
        the command made it."""
        self._discard(self.home)
        self._new_tree()
        self.manifest = Manifest()
        self.save()

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

    def begin(self) -> None:
        """Mark ``tree/`` as being changed (cleared by ``save``)."""
        (self.home / "dirty").touch()

    def save(self) -> None:
        """Write the manifest (atomically), then clear the dirty mark."""
        tmp = self.home / "manifest.tmp"
        tmp.write_bytes(_encoder.encode(self.manifest))
        os.replace(tmp, self.home / "manifest.bin")
        (self.home / "dirty").unlink(missing_ok=True)

    def reset(self) -> None:
        """Forget everything: the next ``sync`` materialises the workspace afresh."""
        self._wipe()

    # ------------------------------------------------------------------ sync
    async def latest_seq(self) -> int:
        # From the stream leader: on a cluster a direct get may come from a replica behind
        # it, and a command asking for the version its client just wrote would be refused.
        return await eventlog.last_seq(self._js, self._subject, fresh=True)

    async def sync(self, upto_version: int | None = None) -> None:
        """Apply the workspace's events after ``version`` (up to ``upto_version``, default
        the latest), writing files, making directories and removing paths."""
        last = await self.latest_seq()
        if last <= self.manifest.seq:
            return
        self.begin()
        # A chunk of the log at a time: an uncompacted log of a million events materialises
        # in bounded memory.
        async for events in eventlog.chunks(self._js, self._subject, self.manifest.seq, last):
            scrubs = [i for i, e in enumerate(events) if _scrub(e.event)]
            if scrubs:  # quill scrub rewrote the log: its (last) scrub event rebuilds the tree
                events = events[scrubs[-1] :]
            for item in events:
                event = item.event
                if isinstance(event, HistoryCompacted) and (
                    event.version != self.manifest.version + 1 or _scrub(event)
                ):
                    # the log before it is purged: start from its manifest (as of an older
                    # version it keeps whole, for a past checkout)
                    at = min(event.version, upto_version or event.version)
                    await self._rebuild(event, at)
                    self.manifest.floor = event.floor
                    if at < event.version:
                        self.manifest.version = at
                        break
                    self.manifest.version, self.manifest.seq = event.version, item.seq
                    continue
                if isinstance(event, WorkspacePurged) or (
                    isinstance(event, WorkspaceCreated) and self.manifest.version
                ):  # purged (and maybe created again): nothing of the old workspace stays
                    await asyncio.to_thread(self._wipe)
                    self.begin()
                    if isinstance(event, WorkspacePurged):
                        self.manifest.seq = item.seq
                        continue
                if upto_version is not None and event.version > upto_version:
                    break
                if isinstance(event, WorkspaceCreated):
                    self.manifest.limits, self.manifest.trust = event.limits, event.trust
                elif isinstance(event, TrustChanged):
                    self.manifest.trust, self.manifest.commands = event.trust, event.commands
                elif isinstance(event, LockAcquired):
                    self.manifest.lock = (event.holder, event.expires)
                elif isinstance(event, LockReleased):
                    self.manifest.lock = None
                elif isinstance(event, WorkspaceArchived):
                    self.manifest.archived = (event.at, event.actor, event.reason)
                elif isinstance(event, WorkspaceUnarchived):
                    self.manifest.archived = None
                elif isinstance(event, ChangesCommitted):
                    contents = await self._contents(event)
                    # File work off the event loop: a large event must not stall heartbeats.
                    await asyncio.to_thread(self._apply_all, event.changes, contents)
                    fold_uncommitted(self.manifest.uncommitted, event)
                elif isinstance(event, HistoryCompacted):
                    self.manifest.floor = event.floor
                self.manifest.version, self.manifest.seq = event.version, item.seq
            else:
                continue
            break  # at upto_version
        await asyncio.to_thread(self.save)

    async def _rebuild(self, event: HistoryCompacted, at: int) -> None:
        """Materialise the tree as of ``at`` from a compaction's manifest (every content it
        names is in WS_BLOBS), in place of what the checkout held: a group of rows at a time
        (at most 512 of them or ~32 MiB of contents, fetched 16 at once), so a compaction of
        100,000 files is never all in memory."""
        kept = decode_manifest(await self._manifest_blobs.get(event.manifest))
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
        self.manifest.limits, self.manifest.trust = kept.limits, kept.trust
        self.manifest.lock = None
        self.manifest.uncommitted = {
            u[0]: Recorded(u[1], u[2], u[3]) for u in kept.uncommitted if u[3] <= at
        }
        for _, kind, body in kept.controls:
            if kind == "trust_changed":
                change = msgspec.json.decode(body.encode(), type=TrustChanged)
                self.manifest.trust, self.manifest.commands = change.trust, change.commands
            elif kind == "lock_acquired":
                taken = msgspec.json.decode(body.encode(), type=LockAcquired)
                self.manifest.lock = (taken.holder, taken.expires)
            elif kind == "lock_released":
                self.manifest.lock = None

    def _materialise(
        self, live: list[tuple[object, ...]], contents: dict[str, bytes], fresh: bool = True
    ) -> None:
        """Write ``live`` (revision rows, parents first); ``fresh``: in an empty tree."""
        if fresh:
            self._discard(self.tree)
            self._new_tree()
            self.manifest.paths, self.manifest.local, self.manifest.ignored = {}, {}, []
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

    async def _contents(self, event: ChangesCommitted) -> dict[str, bytes]:
        """The contents ``event``'s puts do not carry inline, by sha256: a blob from WS_BLOBS;
        for a move or a restore (a put naming content the log carried before), a file the
        checkout already holds with that content, else the file as a reader has it."""
        wanted = await asyncio.to_thread(self._wanted, event)
        if not wanted:
            return {}
        held = {t.sha256: p for p, t in self.manifest.paths.items() if t.sha256 in wanted}
        contents: dict[str, bytes] = {}
        for sha, change in wanted.items():
            path = held.get(sha)
            data = None if path is None else await asyncio.to_thread(self._held, path, sha)
            if data is not None:
                contents[sha] = data
            elif change.blob:
                contents[sha] = await self._blobs.get(sha)
            else:
                contents[sha] = await self._fetch(change.path, event.version)
            if hashlib.sha256(contents[sha]).hexdigest() != sha:
                raise RuntimeError(f"content of {change.path} at v{event.version} is not {sha}")
        return contents

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
                if found is not None:  # else a link or a file stands on the way: not ours
                    found[0].remove(found[1])
            prefix = change.path + "/"
            for path in [p for p in paths if p == change.path or p.startswith(prefix)]:
                del paths[path]
            return
        for above in ancestors(change.path):  # outermost first
            if paths.get(above) is None:
                paths[above] = Tracked(None)
        # Every directory on the way made, or made again where a link or a file stands.
        with parent_of(root, change.path, create=True) as found:
            assert found is not None
            directory, name = found
            if isinstance(change, MakeDir):
                directory.ensure_dir(name).close()
                paths[change.path] = Tracked(None)
                return
            self._put(directory, name, change, contents)

    def _put(self, parent: Dir, name: str, change: PutFile, contents: dict[str, bytes]) -> None:
        paths = self.manifest.paths
        mode = 0o755 if change.executable else 0o644
        tracked = paths.get(change.path)
        st: os.stat_result | None = None
        if self._holds(parent, name, change.path, change.sha256):
            if tracked is not None and tracked.executable == change.executable:
                self.manifest.local.pop(change.path, None)
                return  # our own capture, coming back: the file is already this
            with contextlib.suppress(OSError):  # else rewritten whole below
                st = parent.set_mode(name, mode)
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
        paths[change.path] = Tracked(change.sha256, change.executable, file_sig(st))
        self.manifest.local.pop(change.path, None)

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

    # ------------------------------------------------------------------ capture
    def ignore_patterns(self) -> Globs:
        """The defaults plus the workspace's ``.quillignore``, if the checkout has one."""
        with self._root() as root:
            return self._ignore_patterns(root)

    def _ignore_patterns(self, root: Dir) -> Globs:
        try:  # a link there is not followed: the defaults only
            data, _ = root.read_file(IGNORE_FILE, IGNORE_FILE_BYTES)
        except OSError:
            return Globs.names(DEFAULT_IGNORE)
        text = data.decode("utf-8", "replace")
        lines = [line.strip().rstrip("/") for line in text.splitlines()]
        patterns = [line for line in lines if line and not line.startswith("#")]
        try:
            return Globs.names([*DEFAULT_IGNORE, *patterns])
        except QuillError as exc:
            log.warning("%s/%s: %s ignored: %s", *self._name, IGNORE_FILE, exc.message)
            return Globs.names(DEFAULT_IGNORE)

    def capture(self) -> Captured:
        """Walk ``tree/`` and list what differs from the manifest (blocking: run in a thread)."""
        with self._root() as root:
            return self._capture(root)

    def _capture(self, root: Dir) -> Captured:
        out = Captured()
        ignore = self._ignore_patterns(root)
        limit = self.manifest.limits.max_file_bytes
        paths = self.manifest.paths
        seen: set[str] = set()
        made: list[str] = []
        puts: list[str] = []
        replaced: set[str] = set()  # a directory the log holds, now a file
        dirs_with_tracked = {a for p in paths for a in ancestors(p)} | {
            p for p, t in paths.items() if t.sha256 is None
        }

        def prune(rel: str) -> bool:
            """An ignored directory holding nothing tracked: not entered (reported once)."""
            if invalid(rel) is None and rel not in dirs_with_tracked and ignore.match_dir(rel):
                out.seen_ignored.append(rel)
                return True
            return False

        def enter(rel: str) -> bool:
            return invalid(rel) is None  # what is below an invalid name is skipped with it

        for rel, parent, name, st in walk(root, prune, MAX_PATH_BYTES, enter):
            why = invalid(rel)
            if why is not None:
                self._skip(out, rel, f"invalid name: {why}: not committed", file_sig(st))
                continue
            tracked = paths.get(rel)
            if stat.S_ISDIR(st.st_mode):
                if tracked is not None and tracked.sha256 is None:
                    seen.add(rel)
                else:
                    made.append(rel)
                continue
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
                reason = "symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
                self._skip(out, rel, reason, file_sig(st))
                continue
            if st.st_mode & (stat.S_ISUID | stat.S_ISGID):  # never kept, never committed
                try:
                    st = parent.set_mode(name, stat.S_IMODE(st.st_mode) & 0o1777, st)
                except OSError:
                    continue
            sig = file_sig(st)
            executable = bool(st.st_mode & 0o100)
            if tracked is not None and tracked.sha256 is not None:
                if tracked.sig == sig and tracked.executable == executable:
                    seen.add(rel)
                    continue
            elif tracked is not None:
                replaced.add(rel)
            elif ignore.match(rel):
                out.seen_ignored.append(rel)  # a new file matching a pattern directly
                continue
            if st.st_size > limit:
                why = f"over max_file_bytes ({size_text(st.st_size)} > {size_text(limit)})"
                self._skip(out, rel, why, sig)
                if tracked is not None and tracked.sha256 is not None:
                    seen.add(rel)  # the log keeps its last committed content
                continue
            try:  # the file listed, never what a link or a swap put there since
                data, _ = parent.read_file(name, limit, st)
            except OSError:
                continue
            digest = hashlib.sha256(data).hexdigest()
            if tracked is not None and tracked.sha256 == digest:
                seen.add(rel)
                if tracked.executable == executable:
                    paths[rel] = Tracked(digest, executable, sig)  # touched, not changed
                    continue
            out.contents[rel] = data
            out.sigs[rel] = (digest, executable, sig)
            puts.append(rel)
        # Deleted: what the log holds and the walk did not find (only the topmost path).
        gone = [p for p in paths if p not in seen and (p not in out.sigs or p in replaced)]
        gone_set = set(gone)
        for path in sorted(gone):
            if any(a in gone_set for a in ancestors(path)):
                continue
            tracked = paths[path]
            out.changes.append(rq.DeleteChange(path=path))
            out.kinds[path] = ("deleted", "directory" if tracked.sha256 is None else "file")
        parents_of_puts = {a for p in puts for a in ancestors(p)}
        for path in made:
            if path in parents_of_puts:
                continue  # a put inside creates it
            out.changes.append(rq.MkdirChange(path=path))
            out.kinds[path] = ("created", "directory")
        for path in puts:
            out.changes.append(rq.PutChange(path=path, data=b""))  # content packed later
            tracked = paths.get(path)
            created = tracked is None or tracked.sha256 is None or path in gone_set
            out.kinds[path] = ("created" if created else "modified", "file")
        known = set(self.manifest.ignored)
        out.ignored = [p for p in out.seen_ignored if p not in known]
        return out

    def _skip(self, out: Captured, rel: str, reason: str, sig: Sig) -> None:
        shown = printable(rel)  # a name that is not valid (not UTF-8...) shown escaped
        key = rel if shown == rel else "\0" + shown  # never a valid path, always encodable
        out.local[key] = sig
        out.present.append((shown, reason))
        if self.manifest.local.get(key) != sig:
            out.skipped.append((shown, reason))

    def committed(self, out: Captured, applied: set[str], base: int) -> None:
        """Record the committed part of ``out`` (``applied`` paths) in the manifest, so that
        syncing over the event it made rewrites nothing; ``version`` stays ``base``."""
        paths = self.manifest.paths
        for item in out.changes:
            path = item.path
            if path not in applied:
                continue
            if isinstance(item, rq.DeleteChange):
                prefix = path + "/"
                for p in [p for p in paths if p == path or p.startswith(prefix)]:
                    del paths[p]
            elif isinstance(item, rq.MkdirChange):
                paths[path] = Tracked(None)
            else:
                digest, executable, sig = out.sigs[path]
                for parent in ancestors(path):
                    if parent not in paths:
                        paths[parent] = Tracked(None)
                paths[path] = Tracked(digest, executable, sig)
        self.manifest.local.update(out.local)
        known = set(self.manifest.ignored)
        self.manifest.ignored += [p for p in out.seen_ignored if p not in known]
        assert self.manifest.version == base
