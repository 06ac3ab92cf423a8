"""What a command changed in its checkout's ``tree/``, as an ``apply`` change set.

Two ways to find it, one answer. ``whole`` walks the tree and compares every entry with the
manifest (what ``tree/`` holds from the log, with stat signatures: only what differs is
hashed): what a command that wrote into the tree itself needs (``--sandbox local``, git
actions). ``touched`` looks only at the paths a merge of the command's overlay layer touched
(``infra.exec.layers``): what it changed, nothing else. Both classify an entry with the same
code (``_Capture.visit``), and ``touched`` carries over from the manifest what it does not look
at (the paths left uncommitted, ``Manifest.present``), so they give the same result for the
same tree. ``touched`` walks the whole tree after all when the command changed
``.quillignore`` or the root's ``.gitignore`` (what is ignored changed everywhere) or the
manifest does not know what the tree holds uncommitted (written by an older executor); it looks
at the whole of a directory whose ``.gitignore`` the command changed (what is ignored below it
changed).

What is left out: a new path matching Quill's default patterns or ``.quillignore``
(``quillignore``), or, unless the workspace turned it off (``Limits.gitignore``), one a
``.gitignore`` file ignores as git would (``gitignored``: ``core.gitignore``, the files read
on the paths looked at only, ``infra.exec.gitignores``; none inside a ``.git`` directory, as
in git). An ignored directory holding nothing
from the log is not entered (it counts as one path). As in git, a path the log holds is never
ignored: its changes and its deletion are committed whatever a pattern says, so a
``.gitignore`` cannot hide a change to a committed file. A new directory holding only what is
ignored is not committed either (git keeps no directories; an empty one is committed).

Capture never follows a symlink and never descends into an ignored directory that holds
nothing from the log, into a directory whose name breaks the path rule, or deeper than
``MAX_PATH_BYTES``.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from contracts import requests as rq
from contracts.paths import MAX_PATH_BYTES, ancestors, check_name, printable
from core.globs import Globs
from infra.exec.gitignores import Lookup
from infra.exec.layers import How
from infra.exec.manifest import Manifest, PathMap, Sig, Tracked, watched
from infra.safefs import Dir, parent_of, walk

IGNORE_FILE = ".quillignore"
"""A workspace file of more ignore patterns (one glob a line, ``#`` comments; a pattern
without ``/`` matches a name at any depth, as in ``.gitignore``)."""
GITIGNORE = ".gitignore"
QUILLIGNORED = "quillignore"
"""Why a path was left out: Quill's default patterns or the workspace's ``.quillignore``."""
GITIGNORED = "gitignored"
"""Why a path was left out: a ``.gitignore`` file ignores it."""


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
    kept: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Every path not committed that the tree holds now (reported or not): key (as in
    ``Manifest.local``) -> (path as shown, reason)."""
    ignored: list[tuple[str, str]] = field(default_factory=list)
    """Paths left out by an ignore pattern, not reported before: (path, reason)."""
    local: dict[str, Sig] = field(default_factory=dict)
    seen_ignored: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What capture could not honour (a ``.gitignore`` too large, or a link)."""
    looked_at: int = 0
    """Entries examined (a stat each): the whole tree, or what the command touched."""

    @property
    def present(self) -> list[tuple[str, str]]:
        """Every path not committed that the tree holds now: (path as shown, reason)."""
        return list(self.kept.values())


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


def key_of(rel: str) -> tuple[str, str]:
    """(key, shown) of a path found in the tree: a name that is not valid (not UTF-8...) is
    shown escaped, and keyed so that it is never a valid path and always encodable."""
    shown = printable(rel)
    return (rel if shown == rel else "\0" + shown), shown


def whole(root: Dir, manifest: Manifest, ignore: Globs, git: Lookup | None = None) -> Captured:
    """Walk ``root`` (``tree/``) and list what differs from ``manifest`` (blocking); ``git``:
    the tree's ``.gitignore`` files, if honoured."""
    run = _Capture(root, manifest, ignore, git)
    for rel, parent, name, st in walk(root, run.prune, MAX_PATH_BYTES, run.enter):
        run.visit(rel, parent, name, st)
    return run.finish(None)


def touched(
    root: Dir,
    manifest: Manifest,
    ignore: Globs,
    paths: list[tuple[str, How]],
    git: Lookup | None = None,
    strict: bool = False,
) -> Captured:
    """What differs from ``manifest`` at ``paths`` (a merge's, parents first) and below those
    it replaced whole; the rest is as the manifest says (blocking).

    ``strict``: ``paths`` are a shell's dirty paths (``infra.exec.watch``), not a merge's: a
    path's directories above it are not listed, so each is checked as a walk would enter it
    (ignored, invalid, too deep: what is below is not looked at), and a regular file with
    more than one link is doubt (its other names changed too, unseen): the whole tree is
    walked."""
    widened = paths if git is None else _widened(paths)
    if not manifest.present_known or widened is None or any(p == IGNORE_FILE for p, _ in paths):
        return whole(root, manifest, ignore, git)
    paths = widened
    run = _Capture(root, manifest, ignore, git)
    blocked: set[str] = set()
    candidates: set[str] = set()
    entered: set[str] = set()
    for rel, how in paths:
        if strict and not _enters(run, rel, entered, blocked):
            continue
        if any(a in blocked for a in ancestors(rel)):
            continue  # (strict: below a directory looked at whole, it was looked at)
        candidates.add(rel)
        if how != "dir":
            candidates.update(run.below(rel))
        if how == "gone":
            continue
        with parent_of(root, rel) as found:
            st = None if found is None else found[0].lstat(found[1])
            if found is None or st is None:
                continue
            parent, name = found
            if stat.S_ISDIR(st.st_mode) and run.prune(rel):
                blocked.add(rel)
                continue
            run.visit(rel, parent, name, st)
            if not stat.S_ISDIR(st.st_mode):
                continue
            deep = len(rel.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES
            if deep or not run.enter(rel):
                blocked.add(rel)
                continue
            if how == "all":
                run.subtree(rel, parent, name, st)
                if strict:
                    blocked.add(rel)
    if strict and run.linked:
        return whole(root, manifest, ignore, git)
    dropped = {printable(p) for p, how in paths if how != "dir"}
    exact = {printable(p) for p, how in paths if how == "dir"}
    for key, value in manifest.present.items():
        path = key[1:] if key.startswith("\0") else key
        if key in run.out.kept or path in exact or path in dropped:
            continue
        if any(a in dropped for a in ancestors(path)):
            continue
        run.out.kept[key] = value
    return run.finish(candidates)


def _enters(run: _Capture, rel: str, entered: set[str], blocked: set[str]) -> bool:
    """Whether a walk would reach ``rel``: each directory above it neither pruned (ignored,
    holding nothing tracked) nor invalid nor too deep (each checked once)."""
    for a in ancestors(rel):
        if a in blocked:
            return False
        if a in entered:
            continue
        deep = len(a.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES
        if deep or run.prune(a) or not run.enter(a):
            blocked.add(a)
            return False
        entered.add(a)
    return True


def _widened(paths: list[tuple[str, How]]) -> list[tuple[str, How]] | None:
    """``paths`` with each directory whose ``.gitignore`` changed looked at whole (``all``,
    in place of what was listed in it): what it ignores changed below it; None when the
    root's changed (the whole tree is to be looked at)."""
    tops = {p.rpartition("/")[0] for p, _ in paths if p.rpartition("/")[2] == GITIGNORE}
    if not tops:
        return paths
    if "" in tops:
        return None
    tops = {d for d in tops if not any(a in tops for a in ancestors(d))}
    out: list[tuple[str, How]] = []
    placed: set[str] = set()
    for rel, how in paths:
        top = next((d for d in [*ancestors(rel), rel] if d in tops), None)
        if top is None:
            out.append((rel, how))
        elif top not in placed:  # its parents come before it, as before
            placed.add(top)
            out.append((top, "all"))
    return out


def _in_git(rel: str) -> bool:
    """``rel`` is a ``.git`` directory or inside one: git reads no ignore pattern there (a
    project's ``logs/`` or ``objects/`` line must not take a repository's state apart)."""
    return rel == ".git" or rel.startswith(".git/") or "/.git/" in rel or rel.endswith("/.git")


def _parent(rel: str) -> str:
    return rel.rpartition("/")[0]


class _Capture:
    """One capture's state: what it has seen, made, put (see ``whole`` and ``touched``)."""

    def __init__(self, root: Dir, manifest: Manifest, ignore: Globs, git: Lookup | None) -> None:
        self.root, self.manifest, self.ignore, self.git = root, manifest, ignore, git
        self.holding: set[str] = set()
        """Directories holding something not ignored (a directory made: once committed)."""
        self.ignoring: set[str] = set()
        """Directories holding something ignored."""
        self.out = Captured()
        self.limit = manifest.limits.max_file_bytes
        self.paths: PathMap = watched(manifest).paths  # type: ignore[assignment]
        self.seen: set[str] = set()
        self.made: list[str] = []
        self.puts: list[str] = []
        self.replaced: set[str] = set()  # a directory the log holds, now a file
        self._sorted: list[str] | None = None
        self._scans = 0
        self.dropped: set[str] = set()
        self.linked = False
        """A regular file with more than one link was looked at (``touched``'s ``strict``)."""

    def holds_tracked(self, rel: str) -> bool:
        """Whether the log holds ``rel`` as a directory or anything below it."""
        return self.paths.holds(rel)

    def below(self, rel: str) -> list[str]:
        """The paths the log holds below ``rel`` (none unless it holds ``rel`` as a
        directory): a scan of the manifest for the first few, then a sorted copy of it."""
        tracked = self.paths.get(rel)
        if tracked is None or tracked.sha256 is not None:
            return []
        prefix = rel + "/"
        self._scans += 1
        if self._scans <= 4:
            return [p for p in self.paths if p.startswith(prefix)]
        if self._sorted is None:
            self._sorted = sorted(self.paths)
        start = bisect.bisect_left(self._sorted, prefix)
        end = bisect.bisect_left(self._sorted, rel + "0")  # "0" follows "/"
        return self._sorted[start:end]

    def prune(self, rel: str) -> bool:
        """An ignored directory holding nothing tracked: not entered (reported once)."""
        if invalid(rel) is not None or self.holds_tracked(rel):
            return False
        why = self.ignored(rel, True)
        if why is None:
            return False
        self.left_out(rel, why)
        return True

    def ignored(self, rel: str, is_dir: bool) -> str | None:
        """Why ``rel``, a path the log does not hold, is left out, or None."""
        if self.ignore.match_dir(rel) if is_dir else self.ignore.match(rel):
            return QUILLIGNORED
        if self.git is not None and not _in_git(rel) and self.git.ignored(rel, is_dir):
            return GITIGNORED
        return None

    def left_out(self, rel: str, why: str) -> None:
        self.out.seen_ignored.append((rel, why))
        self.ignoring.add(_parent(rel))

    def enter(self, rel: str) -> bool:
        return invalid(rel) is None  # what is below an invalid name is skipped with it

    def subtree(self, rel: str, parent: Dir, name: str, st: os.stat_result) -> None:
        """Visit everything below the directory ``rel`` (as ``whole`` would)."""
        room = MAX_PATH_BYTES - len(rel.encode("utf-8", "surrogateescape")) - 1
        prefix = rel + "/"
        with parent.open_dir(name, expect=st) as here:
            for sub, holder, entry, est in walk(
                here,
                lambda r: self.prune(prefix + r),
                room,
                lambda r: self.enter(prefix + r),
            ):
                self.visit(prefix + sub, holder, entry, est)

    def visit(self, rel: str, parent: Dir, name: str, st: os.stat_result) -> None:
        """Classify one entry of the tree: seen as the log has it, made, put or skipped."""
        out, paths = self.out, self.paths
        out.looked_at += 1
        why = invalid(rel)
        if why is not None:
            self.holding.add(_parent(rel))
            self.skip(rel, f"invalid name: {why}: not committed", file_sig(st))
            return
        tracked = paths.get(rel)
        if stat.S_ISDIR(st.st_mode):
            if tracked is not None and tracked.sha256 is None:
                self.seen.add(rel)
                self.holding.add(_parent(rel))
            else:
                self.made.append(rel)  # its parent holds it if it is committed (``finish``)
            return
        if tracked is None and not stat.S_ISREG(st.st_mode):
            why = self.ignored(rel, False)  # an ignored link is ignored, as in git
            if why is not None:
                self.left_out(rel, why)
                return
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            self.holding.add(_parent(rel))
            reason = "symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            self.skip(rel, reason, file_sig(st))
            return
        if st.st_nlink > 1:
            self.linked = True
        if st.st_mode & (stat.S_ISUID | stat.S_ISGID):  # never kept, never committed
            try:
                st = parent.set_mode(name, stat.S_IMODE(st.st_mode) & 0o1777, st)
            except OSError:
                return
        sig = file_sig(st)
        executable = bool(st.st_mode & 0o100)
        if tracked is not None and tracked.sha256 is not None:
            if tracked.sig == sig and tracked.executable == executable:
                self.seen.add(rel)
                return
        elif tracked is not None:
            self.replaced.add(rel)
        elif (why := self.ignored(rel, False)) is not None:
            self.left_out(rel, why)  # a new file matching a pattern directly
            return
        self.holding.add(_parent(rel))
        if st.st_size > self.limit:
            why = f"over max_file_bytes ({size_text(st.st_size)} > {size_text(self.limit)})"
            self.skip(rel, why, sig)
            if tracked is not None and tracked.sha256 is not None:
                self.seen.add(rel)  # the log keeps its last committed content
            return
        kept = self.manifest.present.get(rel)
        if kept is not None and self.manifest.local.get(rel) == sig:
            out.kept[rel], out.local[rel] = kept, sig  # withheld before, unchanged since
            if tracked is not None:
                self.seen.add(rel)
            return
        try:  # the file listed, never what a link or a swap put there since
            data, _ = parent.read_file(name, self.limit, st)
        except OSError:
            return
        digest = hashlib.sha256(data).hexdigest()
        if tracked is not None and tracked.sha256 == digest:
            self.seen.add(rel)
            if tracked.executable == executable:
                paths[rel] = Tracked(digest, executable, sig)  # touched, not changed
                return
        out.contents[rel] = data
        out.sigs[rel] = (digest, executable, sig)
        self.puts.append(rel)

    def skip(self, rel: str, reason: str, sig: Sig) -> None:
        key, shown = key_of(rel)
        self.out.local[key] = sig
        self.out.kept[key] = (shown, reason)
        if self.manifest.local.get(key) != sig:
            self.out.skipped.append((shown, reason))

    def finish(self, candidates: Iterable[str] | None) -> Captured:
        """The change set: what the log holds and was not seen (among ``candidates``, or all
        of it) is deleted; what was made or put is created or modified."""
        out, paths, seen = self.out, self.paths, self.seen
        pool = paths if candidates is None else [p for p in candidates if p in paths]
        gone = [p for p in pool if p not in seen and (p not in out.sigs or p in self.replaced)]
        gone_set = set(gone)
        for path in sorted(gone):  # only the topmost path
            if any(a in gone_set for a in ancestors(path)):
                continue
            out.changes.append(rq.DeleteChange(path=path))
            out.kinds[path] = ("deleted", "directory" if paths[path].sha256 is None else "file")
        parents_of_puts = {a for p in self.puts for a in ancestors(p)}
        for path in sorted(self.made, reverse=True):  # what is below a directory first
            if path in self.ignoring and path not in self.holding:
                self.dropped.add(path)  # it holds only what is ignored: as git, not kept
                self.ignoring.add(_parent(path))
            else:
                self.holding.add(_parent(path))
        for path in self.made:
            if path in parents_of_puts or path in self.dropped:
                continue  # a put inside creates it; or nothing in it is committed
            out.changes.append(rq.MkdirChange(path=path))
            out.kinds[path] = ("created", "directory")
        for path in self.puts:
            out.changes.append(rq.PutChange(path=path, data=b""))  # content packed later
            held = paths.get(path)
            created = held is None or held.sha256 is None or path in gone_set
            out.kinds[path] = ("created" if created else "modified", "file")
        known = set(self.manifest.ignored)
        out.ignored = [(p, why) for p, why in out.seen_ignored if p not in known]
        if self.git is not None:
            out.warnings = list(dict.fromkeys(self.git.warnings))
        return out
