"""What a three-way merge of two workspaces works with and produces (``core.merge``).

In: one ``Sides`` per path changed on either side since the merge base, each side's
``Entry`` there (a ``File``, a ``Dir`` or None: no such path). Out: a ``MergePlan``: the
changes to make on the target (``Put``, ``MakeDir``, ``Remove``, in the order to apply
them) and the ``Conflict`` s found, each with how the strategy decided it. msgspec structs,
so a plan's conflicts go into a reply (or an approval's preview) as they are.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from contracts.events import Change, MakeDir, Remove


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


class Sides(msgspec.Struct, frozen=True):
    """A path changed on either side since the merge base: what base, ours (the target)
    and theirs (the workspace merged in) have there."""

    path: str
    base: Entry
    ours: Entry
    theirs: Entry


Strategy = Literal["fail", "ours", "theirs", "markers"]
ConflictKind = Literal["content", "binary", "delete_modify", "file_directory", "add_add", "mode"]
"""``content``: a text both sides changed, with overlapping hunks. ``binary``: a binary
file both sides changed. ``delete_modify``: one side removed a file the other changed.
``file_directory``: a file on one side where the other has a directory with changes below.
``add_add``: both sides created the file, differently. ``mode``: both created it with the
same content, one executable."""
Side = Literal["ours", "theirs"]
Resolution = Literal["ours", "theirs", "markers"]


class Put(Change, frozen=True, kw_only=True, omit_defaults=True, tag="put"):
    """Put a file at ``path`` (its parent exists by then). ``data``: its content when the
    merge made it (a text merged line by line, or with markers); None: the content named by
    ``sha256`` is ``source`` 's (the writer has it in that workspace's log or blobs)."""

    sha256: str
    size: int
    executable: bool = False
    binary: bool = False
    data: bytes | None = None
    source: Literal["ours", "theirs", "merged"] = "theirs"


PlanChange = Put | MakeDir | Remove


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


class MergePlan(msgspec.Struct, frozen=True, kw_only=True):
    changes: list[PlanChange]
    """What to do to the target, in order (empty when ``refused``)."""
    conflicts: list[Conflict]
    marked: list[str]
    """The files written with conflict markers (``markers``)."""
    merged: list[str]
    """The texts both sides changed that merged line by line without a conflict."""
    refused: str | None = None
    """Why nothing is to be committed (``fail`` with conflicts, or ``markers`` with a
    conflict markers cannot hold); None: commit ``changes``."""
