"""What a three-way merge of two workspaces works with and produces (``core.merge``).

In: one ``Sides`` per path changed on either side since the merge base, each side's
``Entry`` there (a ``File``, a ``Dir`` or None: no such path). Out: a ``MergePlan``: the
changes to make on the target (``Put``, ``MakeDir``, ``Remove``, in the order to apply
them) and the ``Conflict`` s found, each with how the strategy decided it. msgspec structs,
so a plan's conflicts go into a reply (or an approval's preview) as they are (the entries
and conflicts are ``contracts.merging`` 's: the wire's).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from contracts.events import Change, MakeDir, Remove
from contracts.merging import (
    Conflict,
    ConflictKind,
    Dir,
    Entry,
    File,
    Hunk,
    Resolution,
    Side,
    Strategy,
    same,
)

__all__ = [
    "Conflict", "ConflictKind", "Dir", "Entry", "File", "Hunk", "MergePlan", "PlanChange",
    "Put", "Resolution", "Side", "Sides", "Strategy", "same",
]  # fmt: skip


class Sides(msgspec.Struct, frozen=True):
    """A path changed on either side since the merge base: what base, ours (the target)
    and theirs (the workspace merged in) have there."""

    path: str
    base: Entry
    ours: Entry
    theirs: Entry


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
