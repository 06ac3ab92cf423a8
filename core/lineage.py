"""Where two workspaces' histories meet (issue 33): pure, no I/O.

A fork's versions continue its source's (version N of a fork made at N is version N of the
source), so a workspace as of a version stands on a chain: itself as of that version, then
each layer of its lineage (nearest first) as of the version the layer was forked at, or as
of the workspace's own version where that is older (a fork read below its fork point is its
source as of then). Two chains that name one workspace share its history up to the older of
their two versions of it: the nearest such workspace is where they meet. What can differ
between the two sides is then only what each changed since that version, through its own
layers.

The writer's merge takes that point as its merge base before any merge between the two
(``services/writer/merges.py``); the reader's diff between two workspaces compares only
what changed on either side since it (``services/reader/diff.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Chain = Sequence[tuple[str, int]]
"""A workspace as of a version, then its layers: ``(name, version)``, nearest first."""


def chain(name: str, version: int, lineage: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """Workspace ``name`` as of ``version`` and the layers it stands on then (``lineage``: its
    layers and the versions it forked them at, nearest first; each as of the older of that
    and ``version``)."""
    return [(name, version), *((layer, min(at, version)) for layer, at in lineage)]


def common(ours: Chain, theirs: Chain) -> int | None:
    """The version of the nearest workspace both chains stand on, the older of the two;
    None: they share no history."""
    mine = dict(ours)
    for name, version in theirs:
        if name in mine:
            return min(version, mine[name])
    return None
