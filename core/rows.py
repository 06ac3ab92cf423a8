"""A workspace's row and a path's revision, as the projection (``infra/store/``) holds them
and the pure renderers (``core/answers.py``, ``core/finding.py``) read them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from contracts.limits import Limits


@dataclass(frozen=True, slots=True)
class WorkspaceRow:
    id: int
    tenant: str
    name: str
    trust: str
    limits: Limits
    created: datetime
    version: int
    last_seq: int
    last_hash: str
    tree_hash: str
    updated: datetime
    floor: int = 0
    """The oldest version whose whole tree is kept (0: every version is)."""
    lineage: tuple[tuple[str, int], ...] = ()
    """A fork's layers, nearest first (``WorkspaceState.lineage``); empty: not a fork."""


@dataclass(frozen=True, slots=True)
class Node:
    """A path as of some version."""

    path: str
    kind: str
    sha256: str | None
    size: int
    file_version: int | None
    executable: bool
    binary: bool
    created: datetime
    modified: datetime
    version: int
    until: int
    moved_from: str | None
