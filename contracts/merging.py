"""What a three-way merge of two workspaces shows on the wire (issue 33): each side's entry
at a path (``File``, ``Dir`` or nothing) and the ``Conflict`` s a merge finds, with their
three-way view. The merge itself is ``core/merge.py``; its plan's types are
``core/merge_types.py``, which takes these from here, so a plan's conflicts go into a reply
(``contracts.replies.Merged``) or an approval's preview as they are. No logic but ``same``.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class File(msgspec.Struct, frozen=True, kw_only=True, tag="file", tag_field="kind"):
    """A file as one side has it."""

    sha256: str
    size: int
    executable: bool = False
    binary: bool = False
    version: int = 0
    """The side's version at which the path last changed (shown in a conflict)."""


class Dir(msgspec.Struct, frozen=True, kw_only=True, tag="directory", tag_field="kind"):
    """A directory as one side has it."""

    version: int = 0


Entry = File | Dir | None
"""A path on one side: a file, a directory or nothing."""


def same(a: Entry, b: Entry) -> bool:
    """Whether two entries are the same content (a file's bytes and mode; any directory is
    any other: its contents are paths of their own). Versions do not count."""
    if isinstance(a, File) and isinstance(b, File):
        return a.sha256 == b.sha256 and a.executable == b.executable
    return type(a) is type(b)


Strategy = Literal["fail", "ours", "theirs", "markers"]
"""How conflicts are decided: ``fail`` (the default: nothing committed), for one side, or
with git's conflict markers in the texts."""
ConflictKind = Literal["content", "binary", "delete_modify", "file_directory", "add_add", "mode"]
"""``content``: a text both sides changed, with overlapping hunks. ``binary``: a binary
file both sides changed. ``delete_modify``: one side removed a file the other changed.
``file_directory``: a file on one side where the other has a directory with changes below.
``add_add``: both sides created the file, differently. ``mode``: both created it with the
same content, one executable."""
Side = Literal["ours", "theirs"]
Resolution = Literal["ours", "theirs", "markers"]


class Hunk(msgspec.Struct, frozen=True, kw_only=True):
    """One conflicting region of a text: where it starts in each file (line numbers from 1)
    and the lines of each, cut to ``core.merge.VIEW_SIDE_BYTES`` (``cut``)."""

    base_line: int
    ours_line: int
    theirs_line: int
    base: str
    ours: str
    theirs: str
    cut: bool = False


class Conflict(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A path both sides changed in ways that do not merge."""

    path: str
    kind: ConflictKind
    base: Entry
    ours: Entry
    theirs: Entry
    hunks: list[Hunk] = msgspec.field(default_factory=list)
    """The three-way view of a text conflict (the first ``core.merge.VIEW_HUNKS``)."""
    hunks_total: int = 0
    paths: list[str] = msgspec.field(default_factory=list)
    """For ``file_directory``: the changed paths below ``path`` that go with it (the first
    ``core.merge.VIEW_PATHS``); the side chosen for ``path`` is chosen for them."""
    paths_total: int = 0
    resolution: Resolution | None = None
    """How the plan decided it; None: it did not (the plan is refused)."""
