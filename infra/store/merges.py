"""What a merge reads of the projection (issue 33): what a workspace changed in a range of
versions, through its layers when it is a fork (a reader's diff of two versions reads it
too), and its last merge of another.

**What changed, without the tree.** A workspace's paths changed in ``(after, upto]`` are the
paths its events there name (their summaries: puts, directories made, removals) and those
whose revisions ended there (a removed directory's contents, a fork's whiteouts): two range
seeks (``events`` by version, ``revisions_live`` by ``until``), so the cost is what changed
in the range. A fork's versions up to its fork point are its layers': each layer is asked for
the part of the range it holds. An event whose summary was cut (``SUMMARY_CHANGES``) is named
by its log sequence: its caller reads it from the log.

**The last merge.** A workspace's last merge of another is one seek of ``events_merges`` (the
writer's partial index of merge events, by the workspace each took in), whichever direction
the caller asks about.
"""

from __future__ import annotations

import json

from infra import sql
from infra.store.base import StoreBase
from infra.store.layers import Layers


class Merging(StoreBase):
    """What a merge reads."""

    async def changed_in(self, layers: Layers, after: int, upto: int) -> tuple[set[str], list[int]]:
        """The paths changed in versions ``(after, upto]`` through ``layers`` (the workspace
        first), and the log sequences of events there whose summaries were cut."""
        paths: set[str] = set()
        cut: list[int] = []
        for i, (ws, cap) in enumerate(layers):
            below = layers[i + 1][1] if i + 1 < len(layers) else 0
            lo, hi = max(after, below), min(cap, upto)
            if hi > lo:
                rows = await self._r.execute_fetchall(sql.EVENTS_CHANGED, (ws, lo, hi))
                for _, seq, changes, total in rows:
                    listed = json.loads(changes)
                    paths.update(str(c["path"]) for c in listed)
                    if total > len(listed):
                        cut.append(int(seq))
                for (path,) in await self._r.execute_fetchall(sql.ENDED_IN, (ws, lo, hi)):
                    paths.add(str(path))
            if after >= below:
                break
        return paths, cut

    async def last_merge(self, ws: int, after: int, source: str) -> tuple[int, int, bytes] | None:
        """Workspace ``ws``'s last merge of ``source`` (``tenant/name``) after version
        ``after``: its version, log sequence and result (JSON). One seek (``events_merges``)."""
        rows = list(await self._r.execute_fetchall(sql.LAST_MERGE, (ws, source, after)))
        if not rows:
            return None
        version, seq, result = rows[0]
        return int(version), int(seq), str(result).encode()
