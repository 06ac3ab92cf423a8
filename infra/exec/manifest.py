"""What a checkout's ``tree/`` holds, and how that is kept on disk at the cost of what changed.

``Manifest`` is the checkout's memory of its tree: per path the log holds, its sha256, mode
and the stat signature it had when last seen (so capture hashes only what changed); the paths
left uncommitted, with why; the workspace's state as of ``version`` (limits, trust, lock,
archive). ``infra.exec.checkout`` reads and changes it.

On disk it is ``manifest.bin`` (the whole of it, msgpack) and ``manifest.log`` (what changed
since, one frame per ``save``: the head and the entries added, changed or removed). A command
that changed one file of a 100,000-file checkout appends a frame of one path instead of
rewriting ~11 MB; once the log is over half the size of the whole (or 1 MiB), ``save`` writes
the whole again and starts a new log. What changed is known because the three maps are
``Changes`` (a dict that remembers the keys set or removed since the last save).

A frame that cannot be read (a crash mid-append, which also leaves the checkout's ``dirty``
mark) makes the manifest unreadable: the checkout is rebuilt from the log.
"""

from __future__ import annotations

import os
import struct
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec

from contracts.limits import DEFAULT_LIMITS, Limits
from contracts.paths import ancestors
from contracts.uncommitted import Recorded

K = TypeVar("K")
V = TypeVar("V")

Sig = tuple[int, int, int, int]
"""(size, mtime_ns, ctime_ns, inode): a file is re-read when any of them differs."""

WHOLE = "manifest.bin"
LOG = "manifest.log"
_FRAME = struct.Struct(">I")
LOG_MIN = 1024 * 1024
"""A log shorter than this is never folded into the whole (a small checkout appends)."""


class Tracked(msgspec.Struct, array_like=True, frozen=True):
    """A path the checkout holds from the log."""

    sha256: str | None
    """None for a directory."""
    executable: bool = False
    sig: Sig | None = None


class Changes(dict[K, V], Generic[K, V]):
    """A dict that remembers which keys were set or removed since ``changed`` was cleared."""

    __slots__ = ("changed",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.changed: set[K] = set()

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.changed.add(key)

    def __delitem__(self, key: K) -> None:
        super().__delitem__(key)
        self.changed.add(key)

    def pop(self, key: K, *default: Any) -> Any:
        if key in self:
            self.changed.add(key)
        return super().pop(key, *default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: K, default: V) -> V:
        if key not in self:
            self[key] = default
        return self[key]

    def clear(self) -> None:
        self.changed.update(self)
        super().clear()


class PathMap(Changes[str, "Tracked"]):
    """``Manifest.paths``: also knows, per directory, how many tracked paths lie below it, so
    that "does the log hold anything at or below ``rel``" is one lookup at any tree size.

    The counts are built at the first question (one pass over the map) and then kept as
    paths come and go (a path's ancestors, O(depth)); a checkout keeps its manifest in
    memory across commands, so a command pays for what it changed, not for the tree.
    """

    __slots__ = ("_below",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._below: dict[str, int] | None = None

    def holds(self, rel: str) -> bool:
        """Whether ``rel`` is a tracked directory or anything tracked lies below it."""
        if self._below is None:
            below: dict[str, int] = {}
            for path in self:
                for a in ancestors(path):
                    below[a] = below.get(a, 0) + 1
            self._below = below
        if rel in self._below:
            return True
        tracked = self.get(rel)
        return tracked is not None and tracked.sha256 is None

    def _count(self, path: str, step: int) -> None:
        below = self._below
        if below is None:
            return
        for a in ancestors(path):
            n = below.get(a, 0) + step
            if n:
                below[a] = n
            else:
                del below[a]

    def __setitem__(self, key: str, value: Tracked) -> None:
        if key not in self:
            self._count(key, 1)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._count(key, -1)

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            self._count(key, -1)
        return super().pop(key, *default)

    def clear(self) -> None:
        super().clear()
        self._below = None


class Head(msgspec.Struct, kw_only=True):
    """The manifest's fields other than its three maps (small: written whole every save)."""

    version: int = 0
    seq: int = 0
    limits: Limits = DEFAULT_LIMITS
    trust: str = "full"
    commands: bool = False
    """``restricted``: whether commands are offered."""
    floor: int = 0
    """The oldest version compaction kept whole (``history_compacted``)."""
    lock: tuple[str, datetime] | None = None
    """The workspace lock as of ``version``: (holder session, expires); a command of another
    session is refused before it runs, as the writer would refuse its changes."""
    uncommitted: dict[str, Recorded] = msgspec.field(default_factory=dict)
    """The paths the log records as left uncommitted as of ``version`` (a command whose set
    differs records its own, even when it changed nothing)."""
    archived: tuple[datetime, str | None, str | None] | None = None
    """While the workspace is archived: (since, by, reason); commands are refused before
    they run, as the writer would refuse their changes."""
    present_known: bool = False
    """``present`` is every path the tree holds uncommitted (False for a manifest written
    before it was kept: the next capture walks the whole tree)."""


class Manifest(Head, kw_only=True):
    paths: dict[str, Tracked] = msgspec.field(default_factory=dict)
    local: dict[str, Sig] = msgspec.field(default_factory=dict)
    """Files left uncommitted (skipped), as last reported: not reported again unless changed."""
    present: dict[str, tuple[str, str]] = msgspec.field(default_factory=dict)
    """Every path the tree holds uncommitted as of the last capture: key (``local``'s) ->
    (the path as shown, why)."""
    ignored: list[str] = msgspec.field(default_factory=list)
    """Ignored paths seen at the top of an ignored subtree (reported when new)."""


class Frame(msgspec.Struct, array_like=True):
    """One ``save`` in ``manifest.log``: the head, and the entries changed since (None: gone)."""

    head: Head
    paths: dict[str, Tracked | None]
    local: dict[str, Sig | None]
    present: dict[str, tuple[str, str] | None]
    ignored: list[str]
    """Appended to ``ignored``."""


_whole = msgspec.msgpack.Encoder()
_decode_whole = msgspec.msgpack.Decoder(Manifest)
_decode_frame = msgspec.msgpack.Decoder(Frame)
_HEAD_FIELDS = tuple(f for f in Head.__struct_fields__)


def watched(manifest: Manifest) -> Manifest:
    """``manifest`` with its maps made ``Changes`` (as decoded or made anew, they are dicts)."""
    if not isinstance(manifest.paths, PathMap):
        manifest.paths = PathMap(manifest.paths)
    for name in ("local", "present"):
        value = getattr(manifest, name)
        if not isinstance(value, Changes):
            setattr(manifest, name, Changes(value))
    return manifest


def head_of(manifest: Manifest) -> Head:
    return Head(**{f: getattr(manifest, f) for f in _HEAD_FIELDS})


class Store:
    """A manifest's two files in a checkout's home (see the module docstring)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._whole_bytes = 0
        self._log_bytes = 0
        self._ignored = 0
        self.rewrite = True
        """The next ``save`` writes the whole (set when a map was replaced, not changed)."""

    def load(self) -> Manifest:
        """The manifest as the files hold it.

        Raises:
            OSError: ``manifest.bin`` is missing or unreadable.
            msgspec.DecodeError: a file does not decode (a frame cut short included).
        """
        data = (self.home / WHOLE).read_bytes()
        manifest = _decode_whole.decode(data)
        self._whole_bytes, self._log_bytes = len(data), 0
        try:
            log = (self.home / LOG).read_bytes()
        except FileNotFoundError:
            log = b""
        offset = 0
        while offset < len(log):
            if offset + _FRAME.size > len(log):
                raise msgspec.DecodeError("manifest.log: a frame cut short")
            (size,) = _FRAME.unpack_from(log, offset)
            start = offset + _FRAME.size
            if start + size > len(log):
                raise msgspec.DecodeError("manifest.log: a frame cut short")
            _apply(manifest, _decode_frame.decode(log[start : start + size]))
            offset = start + size
        self._log_bytes = len(log)
        self._ignored = len(manifest.ignored)
        self.rewrite = False
        return watched(manifest)

    def save(self, manifest: Manifest) -> None:
        """Write what changed since the last ``save`` (or ``load``): a frame appended to the
        log, or the whole once the log is long (see the module docstring)."""
        maps = [manifest.paths, manifest.local, manifest.present]
        if not isinstance(manifest.paths, PathMap) or not all(isinstance(m, Changes) for m in maps):
            watched(manifest)
            self.rewrite = True
        if self.rewrite or self._log_bytes > max(LOG_MIN, self._whole_bytes // 2):
            self._save_whole(manifest)
        else:
            self._append(manifest)
        for changes in (manifest.paths, manifest.local, manifest.present):
            assert isinstance(changes, Changes)
            changes.changed.clear()
        self._ignored = len(manifest.ignored)
        self.rewrite = False

    def _save_whole(self, manifest: Manifest) -> None:
        data = _whole.encode(manifest)
        tmp = self.home / "manifest.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.home / WHOLE)
        (self.home / LOG).unlink(missing_ok=True)
        self._whole_bytes, self._log_bytes = len(data), 0

    def _append(self, manifest: Manifest) -> None:
        frame = Frame(
            head=head_of(manifest),
            paths=_delta(manifest.paths),
            local=_delta(manifest.local),
            present=_delta(manifest.present),
            ignored=manifest.ignored[self._ignored :],
        )
        data = _whole.encode(frame)
        with open(self.home / LOG, "ab") as f:
            f.write(_FRAME.pack(len(data)) + data)
        self._log_bytes += _FRAME.size + len(data)


def _delta(changes: dict[K, V]) -> dict[K, V | None]:
    assert isinstance(changes, Changes)
    return {key: changes.get(key) for key in changes.changed}


def _apply(manifest: Manifest, frame: Frame) -> None:
    for name in _HEAD_FIELDS:
        setattr(manifest, name, getattr(frame.head, name))
    _fold(manifest.paths, frame.paths)
    _fold(manifest.local, frame.local)
    _fold(manifest.present, frame.present)
    manifest.ignored += frame.ignored


def _fold(target: dict[str, V], delta: dict[str, V | None]) -> None:
    for key, value in delta.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
