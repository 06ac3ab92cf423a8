"""Applying a batch of committed events to a projection (``core.plan``'s rows, in one
transaction with the tracking position), purging a workspace, and replacing one with what a
compaction's manifest keeps (``infra.store``)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from contracts.events import (
    CompactionManifest,
    HistoryCompacted,
    WorkspaceCreated,
    WorkspaceForked,
    WorkspacePurged,
)
from core.content import as_text
from core.evolve import WorkspaceState, evolve
from core.plan import Committed, Plan, head_of, plan, row_of
from core.rows import WorkspaceRow
from infra import sql
from infra.store.base import HIGH_WATER, workspace_row
from infra.store.blobs import unstash
from infra.store.layers import Layering

_encoder = msgspec.json.Encoder()


def _segments(
    batch: list[Committed], wipes: frozenset[int] = frozenset()
) -> list[list[Committed] | Committed]:
    """``batch`` split at its compactions and purges (each applied alone, between the runs
    around it), and before each item of ``wipes`` (``id()`` s: a workspace created again
    where this projection had the old one, which is purged first)."""
    out: list[list[Committed] | Committed] = []
    run: list[Committed] = []
    for item in batch:
        if id(item) in wipes:
            if run:
                out.append(run)
                run = []
            out.append(Committed(_purge_of(item), item.hash, item.seq))
        if isinstance(item.event, HistoryCompacted | WorkspacePurged):
            if run:
                out.append(run)
                run = []
            out.append(item)
        else:
            run.append(item)
    if run:
        out.append(run)
    return out


def _purge_of(item: Committed) -> WorkspacePurged:
    """The purge a ``workspace_created`` of a name this projection holds implies (the
    ``workspace_purged`` event before it was removed from the log)."""
    ev = item.event
    return WorkspacePurged(
        tenant=ev.tenant, workspace=ev.workspace, version=0, at=ev.at, op="purge",
        request_id=ev.request_id, prev_hash="", tree_hash="", purged_version=0,
    )  # fmt: skip


class ProjectionGap(Exception):
    """An event arrived before the one preceding it: the projection must catch up first."""


class Applying(Layering):
    """Applying committed events: a batch's plan, a purge, a compaction's replacement."""

    async def apply(
        self, batch: list[Committed], tracking: str | None = None, *, ahead: bool = False
    ) -> Plan | None:
        """Apply committed events (log order) in one transaction, with the tracking position.

        Events a workspace already has (version <= its projected version) are skipped, so
        applying the same event twice is harmless. Returns what was executed.

        ``ahead``: one workspace's events, applied before the events of others that precede
        them in the log (a replica catching up, asked for that workspace now): neither the
        tracking position nor the high water moves, since what lies before them in the log
        is not all applied. When the replica's catch-up reaches them, they are skipped; those
        the catch-up applied first (as far as the workspace's last sequence) are skipped here.

        Raises:
            ProjectionGap: an event's predecessor has not been applied (nothing is applied).
        """
        async with self._lock:
            # What this batch changes, over the projection's maps: the cost of an apply is
            # the batch's, never the number of workspaces the projection holds.
            # ``base``: each workspace's row before the batch (held, or one indexed lookup;
            # nothing of this batch is written yet, so the committed row is the current one).
            base: dict[tuple[str, str], WorkspaceRow | None] = {}
            versions: dict[tuple[str, str], int] = {}
            seqs: dict[tuple[str, str], int] = {}
            fresh: list[Committed] = []
            wipes: set[int] = set()
            for item in batch:
                key = (item.event.tenant, item.event.workspace)
                if key not in base:
                    base[key] = self.workspace(*key)
                row = base[key]
                have = versions[key] if key in versions else (row.version if row else 0)
                if ahead and item.seq <= (
                    seqs[key] if key in seqs else (row.last_seq if row else 0)
                ):
                    continue  # the catch-up got there first (maybe past a purge: not this life's)
                if have and isinstance(item.event, WorkspaceCreated | WorkspaceForked):
                    seen = seqs[key] if key in seqs else (row.last_seq if row else 0)
                    if item.seq > seen:
                        wipes.add(id(item))  # created again after a purge this projection missed
                        have = 0
                if item.event.version <= have:
                    continue
                # a compaction replaces the workspace, a purge ends it: what the log purged
                # before either is moot
                jumps = isinstance(item.event, HistoryCompacted | WorkspacePurged) or (
                    not have and isinstance(item.event, WorkspaceForked)
                )  # a fork starts at the version it was forked at
                if item.event.version != have + 1 and not jumps:
                    raise ProjectionGap(f"{key[0]}/{key[1]}: v{item.event.version} after v{have}")
                fresh.append(item)
                purged = isinstance(item.event, WorkspacePurged)
                versions[key] = 0 if purged else item.event.version
                seqs[key] = item.seq
            if not fresh and tracking is None:
                return None
            ids: dict[tuple[str, str], int] = {}
            next_id = self._next_id
            for item in fresh:
                key = (item.event.tenant, item.event.workspace)
                if key not in ids:
                    before = base[key]
                    if before is None:
                        ids[key], next_id = next_id, next_id + 1
                    else:
                        ids[key] = before.id
            executed = Plan()
            heads = {ws: head_of(row) for key, ws in ids.items() if (row := base[key]) is not None}
            try:
                for part in _segments(fresh, frozenset(wipes)):
                    if isinstance(part, Committed):  # a compaction or a purge, alone
                        ev, ws = part.event, ids[(part.event.tenant, part.event.workspace)]
                        head = heads.setdefault(ws, WorkspaceState(ev.tenant, ev.workspace))
                        if isinstance(ev, WorkspacePurged):
                            await self._purge(ws)
                            evolve(head, ev, part.hash, part.seq, tree=False)
                        else:  # its head evolved by the plan of its event's row
                            await self._replace(part, ws, head)
                        executed.replaced.append(ws)
                        continue
                    done = plan(part, ids, heads)
                    await self._execute(done)
                    executed.closes += done.closes
                    executed.blobs += done.blobs
                # applied ahead: events before them are not all applied, no position to record
                if not ahead and tracking is not None and batch:
                    await self._w.execute(sql.SET_POSITION, (tracking, batch[-1].seq))
                elif not ahead and fresh:  # a writer's: the newest event it holds (``high_water``)
                    await self._w.execute(
                        sql.RAISE_META, (HIGH_WATER, max(item.seq for item in fresh))
                    )
                await self._w.commit()
            except BaseException:
                await self._w.rollback()
                raise
            self._next_id = next_id
            if executed.replaced or any(isinstance(i.event, WorkspaceForked) for i in fresh):
                self._layers.clear()  # an id reused, or a fork made: its layers looked up again
            for key, ws in ids.items():  # the rows as the batch left them: no SQLite read
                after = heads.get(ws)
                if after is None or not after.exists:
                    self._rows.pop(key, None)  # purged: no workspace of that name
                else:
                    self._hold(key, row_of(ws, after))
            if not ahead and batch:
                newest = max((item.seq for item in fresh), default=0)
                await self._upkeep(batch[-1].seq if tracking is not None else newest)
            return executed

    async def _execute(self, p: Plan) -> None:
        # One executemany per table (each is a thread round trip in aiosqlite); empty ones skipped.
        statements: list[tuple[str, list[Any]]] = [
            (sql.NEW_WORKSPACE, p.new_workspaces),
            (sql.CLOSE_LIVE, p.closes),
            (sql.INSERT_REVISION, p.rows),
            (sql.INSERT_EVENT, p.events),
            (sql.UPSERT_BLOB, p.blobs),
            (sql.INSERT_CONTROL, p.controls),
            (sql.SET_HEAD, list(p.workspace_updates.values())),
        ]
        for statement, rows in statements:
            if rows:
                await self._w.executemany(statement, rows)
        if p.uncommitted_clears:
            await self._w.executemany(sql.CLEAR_UNCOMMITTED, p.uncommitted_clears)
        if p.whiteouts:
            await self.whiteouts(self._w, p.whiteouts)
        for ws, kept in p.uncommitted_sets.items():
            await self._w.execute(sql.DROP_UNCOMMITTED, (ws,))
            await self._w.executemany(sql.SET_UNCOMMITTED, [(ws, *r) for r in kept])

    async def _purge(self, ws: int) -> None:
        """Delete every row of workspace ``ws``, and the contents no other workspace has
        (with their entries in the trigram index)."""
        shas = [str(r[0]) for r in await self._w.execute_fetchall(sql.CONTENTS_OF, (ws,))]
        for table in sql.HISTORY_TABLES:
            await self._w.execute(sql.DELETE_ROWS[table], (ws,))
        await self._w.execute(sql.DELETE_WORKSPACE, (ws,))
        if not shas:
            return
        wanted = json.dumps(shas)
        kept = {str(r[0]) for r in await self._w.execute_fetchall(sql.CONTENTS_KEPT, (wanted,))}
        gone = json.dumps([sha for sha in shas if sha not in kept])
        if self.role == "reader":  # a contentless index forgets an entry given its content
            for rowid, data, stash in await self._w.execute_fetchall(sql.INDEXED_CONTENTS, (gone,)):
                content = bytes(data) if data is not None else unstash(bytes(stash))
                text = as_text(content)
                if text is not None:
                    await self._w.execute(sql.UNINDEX, (rowid, text))
        await self._w.execute(sql.DELETE_BLOBS, (gone,))

    async def _replace(self, item: Committed, ws: int, head: WorkspaceState) -> None:
        """Make workspace ``ws`` exactly what a ``history_compacted`` event's manifest says
        (``head``, its head before, evolved)."""
        ev, m = item.event, item.manifest
        assert isinstance(ev, HistoryCompacted) and m is not None
        for table in sql.HISTORY_TABLES:
            await self._w.execute(sql.DELETE_ROWS[table], (ws,))
        await self._w.execute(
            sql.REPLACE_WORKSPACE,
            (ws, ev.tenant, ev.workspace, m.trust, _encoder.encode(m.limits).decode(),
             m.created.isoformat()),
        )  # fmt: skip
        await self._w.executemany(sql.INSERT_REVISION, [(ws, *r) for r in m.revisions])
        padded = [(ws, *e, *(None,) * (sql.EVENT_ROW - len(e))) for e in m.events]
        await self._w.executemany(sql.INSERT_EVENT, padded)
        await self._w.executemany(sql.INSERT_CONTROL, [(ws, *c) for c in m.controls])
        await self._w.executemany(sql.INSERT_UNCOMMITTED, [(ws, *u) for u in m.uncommitted])
        summary = plan([item], {(ev.tenant, ev.workspace): ws}, {ws: head})
        await self._w.executemany(sql.INSERT_EVENT, summary.events)
        await self._w.execute(
            sql.SET_COMPACTED,
            (ev.version, item.seq, item.hash, ev.tree_hash, ev.at.isoformat(), m.floor, ws),
        )
        await self._w.executemany(
            sql.KNOWN_BLOB, [(r[5], r[6], ws) for r in m.revisions if r[4] == "f"]
        )

    async def compaction(self, ws: int, max_versions: int) -> tuple[CompactionManifest, int, int]:
        """What compacting workspace ``ws`` to ``max_versions`` revisions per path keeps:
        the manifest, and how many revisions and events it drops. Writer only."""
        row = workspace_row(list(await self._w.execute_fetchall(sql.WORKSPACE_BY_ID, (ws,)))[0])
        kept: list[tuple[Any, ...]] = []
        floor, dropped = row.floor, 0
        rows = await self._w.execute_fetchall(sql.ALL_REVISIONS, (ws,))
        last_path, count = None, 0
        for r in rows:
            count = count + 1 if r[0] == last_path else 1
            last_path = r[0]
            if count <= max_versions:
                kept.append(tuple(r))
            else:
                dropped += 1
                floor = max(floor, r[2])
        starts = {r[1] for r in kept}
        events = [
            tuple(e)
            for e in await self._w.execute_fetchall(sql.ALL_EVENTS, (ws,))
            if e[0] >= floor or e[0] in starts
        ]
        total = list(await self._w.execute_fetchall(sql.COUNT_EVENTS, (ws,)))[0][0]
        controls = [
            (int(c[0]), str(c[1]), str(c[2]))
            for c in await self._w.execute_fetchall(sql.ALL_CONTROLS, (ws,))
        ]
        uncommitted = [
            (str(u[0]), str(u[1]), str(u[2]), int(u[3]))
            for u in await self._w.execute_fetchall(sql.ALL_UNCOMMITTED, (ws,))
        ]
        manifest = CompactionManifest(
            trust=row.trust,
            limits=row.limits,
            created=row.created,
            floor=floor,
            revisions=kept,
            events=events,
            controls=controls,
            uncommitted=uncommitted,
        )
        return manifest, dropped, int(total) - len(events)

    async def revision_counts(self, ws: int) -> dict[str, int]:
        """How many revisions each path of workspace ``ws`` has kept."""
        rows = await self._w.execute_fetchall(sql.REVISION_COUNTS, (ws,))
        return {str(r[0]): int(r[1]) for r in rows}
