"""The SQLite projection of the log, shared by the writer and the readers.

One database file per service instance holds every workspace it follows. It is a cache of
WS_EVENTS: delete it and it is rebuilt from the log. Each batch of events is applied in one
transaction together with the tracking position, so a crash never leaves half a change set
or a position that disagrees with the data. Reads use a second connection (WAL), so queries
never wait behind an apply.

Every path's history is kept as revision rows valid over ``[version, until)``: a read of a
path as of any version is one index seek, as fast at version 1 as at the latest. A whole tree
at the newest version is the live rows (one seek); at an older version, the live rows and
those ended since (``as_of``): an operation costs what it returns, not the history behind it
(issue 29). The writer loads a workspace's live tree only, and looks up the history of the
other paths a decision names (``look_up``).

Workspace rows are held in a bounded cache (``PROJECTION_ROWS``, least recently used first
out), loaded on a miss by one indexed lookup: opening costs the same at any number of
workspaces, and memory grows with the budget, not with the workspaces (issue 17).

The planner's statistics are seeded when the projection is made and gathered again as it
grows (``gather_statistics``); the statements themselves, the schema and the plan each is meant
to have are in ``infra/sql/``, so a schema change is one module's change; the plan of what to
write is pure (``core.plan``). ``count_steps`` counts what the statements touch, for tests.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sqlite3
import sys
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import aiosqlite
import msgspec
import zstandard

from contracts import codec
from contracts.events import (
    CompactionManifest,
    HistoryCompacted,
    WorkspaceCreated,
    WorkspacePurged,
)
from contracts.limits import PROJECTION_ROWS, Limits
from contracts.uncommitted import Recorded
from core.content import as_text
from core.decision import Needs
from core.evolve import WorkspaceState, evolve
from core.plan import Committed, Plan, head_of, plan, row_of, subtree
from core.rows import Node, WorkspaceRow
from core.tree import Tree, place
from infra import sql

log = logging.getLogger("quill.store")

SCHEMA_VERSION = sql.SCHEMA_VERSION
ROLE_INDEXES = sql.ROLE_INDEXES
ROLE_DROPS = sql.ROLE_DROPS
REVISION_COLUMNS = sql.REVISION_COLUMNS
R_REVISION_COLUMNS = sql.R_REVISION_COLUMNS
HIGH_WATER = "high_water"
"""The meta key of the newest event a writer's projection holds (``Store.high_water``)."""

STASH_LEVEL = 3
"""zstd level of a stashed text (``index_remote``)."""
HISTORIES_INLINE = 16
"""Paths whose history ``Store.histories`` looks up on the event loop's thread (more: on
aiosqlite's)."""
SMALL_LOAD = 64
"""A workspace of at most this many events and revision rows is loaded on the event loop's
thread (``Store.load``)."""

WAL_PAGES = 10_000
"""WAL pages after which a commit moves them into the database (SQLite's autocheckpoint): 40
MiB at 4 KiB pages."""
BULK_WAL_PAGES = 262_144
"""The same while the store takes a bulk of events (``Store.bulk``): 1 GiB. A replica catching
up on 20,000 events to workspaces at random writes ~8 pages for each, and paid about a third
of its catch-up in the checkpoints of its commits (a 1,000,000-workspace projection: 7.8 s →
5.5 s without them, issue 17); one checkpoint at the end, on another thread, does it once."""
WAL_KEPT_BYTES = 64 * 2**20
"""What the WAL file keeps of its size once checkpointed (the rest is given back)."""
ROWS_ENV = "QUILL_PROJECTION_ROWS"
"""The environment's budget of workspace rows held in memory (``--projection-rows``)."""
_limits_decoder = msgspec.json.Decoder(Limits)
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


async def _schema_version(db: aiosqlite.Connection) -> str | None:
    try:
        rows = list(await db.execute_fetchall(sql.SCHEMA_OF))
    except aiosqlite.OperationalError:
        return None
    return str(rows[0][0]) if rows else None


def _unstash(stash: bytes) -> bytes:
    """The text ``index_remote`` compressed."""
    return zstandard.ZstdDecompressor().decompressobj().decompress(stash)


def _results(rows: list[Any]) -> list[tuple[str, int, bytes]]:
    """``sql.RECENT_RESULTS``'s rows, oldest first, those of events with a request id."""
    return [(r[0], int(r[1]), str(r[2]).encode()) for r in reversed(rows) if r[0]]


class Loaded(NamedTuple):
    """What ``Store.load`` read of a workspace: the writer's state and its recent results."""

    state: WorkspaceState
    recent: list[tuple[str, int, bytes]]
    """``(request_id, version, result)`` of its last events, oldest first."""


class ProjectionGap(Exception):
    """An event arrived before the one preceding it: the projection must catch up first."""


@functools.lru_cache(maxsize=256)
def _limits(encoded: str) -> Limits:
    """Decoded once per distinct value: most workspaces share the defaults (frozen, so one
    object serves them all; ~0.5 KB saved per workspace held in ``Store``'s maps)."""
    return _limits_decoder.decode(encoded)


def _workspace_row(r: Any) -> WorkspaceRow:
    return WorkspaceRow(
        r[0],
        sys.intern(r[1]),
        r[2],
        sys.intern(r[3]),
        _limits(r[4]),
        datetime.fromisoformat(r[5]),
        r[6],
        r[7],
        r[8],
        r[9],
        datetime.fromisoformat(r[10] or r[5]),
        r[11],
    )


def node_from_row(row: Any) -> Node:
    return Node(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        bool(row[5]),
        bool(row[6]),
        datetime.fromisoformat(row[7]),
        datetime.fromisoformat(row[8]),
        row[9],
        row[10],
        row[11],
    )


class Steps:
    """The virtual machine steps each connection of a store ran, and the statements, while a
    test counts them (``Store.count_steps``). Each connection's count is kept apart (each is
    used by one thread at a time)."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(("write", "read", "lookup", "loader"), 0)
        self.statements: list[str] = []

    def handler(self, name: str) -> Callable[[], int]:
        def step() -> int:
            self.counts[name] += 1
            return 0

        return step

    def statement(self, text: str) -> None:
        self.statements.append(text)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _instrument(db: sqlite3.Connection, steps: Steps | None, name: str) -> None:
    db.set_progress_handler(steps.handler(name) if steps else None, 1)
    db.set_trace_callback(steps.statement if steps else None)


def gather_statistics(path: Path, position: int) -> None:
    """Gather the planner's statistics of the projection at ``path`` again (``sql.ANALYZE``:
    bounded, milliseconds at any size), seed those of the indexes still without (empty
    tables), and remember the log ``position`` it was done at, in one transaction; every
    connection plans with them from its next statement. Blocking."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        for statement in sql.ANALYZE:
            db.execute(statement)
        db.executemany(sql.SEED_STAT, sql.SEEDED_STATS)
        db.execute(sql.SET_META, (sql.STATS_AT, str(position)))
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    finally:
        db.close()


class Store:
    """A projection database. Open with ``await Store.open(path)``."""

    def __init__(
        self,
        path: Path,
        write: aiosqlite.Connection,
        read: aiosqlite.Connection,
        role: str,
        lookup: sqlite3.Connection,
        max_rows: int = PROJECTION_ROWS,
    ) -> None:
        self.path = path
        self.role = role
        self._w = write
        self._r = read
        self._lookup = lookup
        """Loads a workspace row missing from ``_rows`` on the event loop's thread: one
        indexed lookup (tens of microseconds) is cheaper than a hop to aiosqlite's thread, and
        keeps ``workspace``/``version_of`` synchronous. It sees committed rows only, which is
        what ``_rows`` holds too: ``apply`` updates both after its commit."""
        self._rows: OrderedDict[tuple[str, str], WorkspaceRow] = OrderedDict()
        """The workspace rows used last, at most ``max_rows`` (the least recently used goes)."""
        self.max_rows = max_rows
        self.rows_loaded = 0
        """Rows read from SQLite on a miss since opening (none at open)."""
        self._next_id = 1
        """The id the next new workspace gets (ids are never handed out twice in a process)."""
        self._lock = asyncio.Lock()
        self._loading = ThreadPoolExecutor(1, thread_name_prefix="store-load")
        """The thread ``load`` reads on, with its own connection (``_loader``)."""
        self._loader: sqlite3.Connection | None = None
        self._checkpointing: asyncio.Future[None] | None = None
        """The checkpoint at the end of a bulk of applies, while it runs."""
        self._in_bulk = False
        self._stats_at = 0
        """The log position at which statistics were last gathered (``_upkeep``)."""
        self.steps: Steps | None = None
        """Counts the SQLite virtual machine's steps on every connection, while a test
        wants it (``count_steps``)."""

    @classmethod
    async def open(cls, path: Path, role: str = "reader", max_rows: int | None = None) -> Store:
        """Open (or create) the projection at ``path`` for ``role`` (``writer``/``reader``),
        holding at most ``max_rows`` workspace rows in memory (default: ``$QUILL_PROJECTION_ROWS``
        or ``PROJECTION_ROWS``). A projection written by another schema version is deleted
        and rebuilt from the log. Opening reads no workspace row: it costs the same at any
        number of workspaces."""
        if max_rows is None:
            max_rows = int(os.environ.get(ROWS_ENV) or PROJECTION_ROWS)
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, not {max_rows}")
        path.parent.mkdir(parents=True, exist_ok=True)
        write = await aiosqlite.connect(path)
        if await _schema_version(write) not in (None, SCHEMA_VERSION):
            await write.close()
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            write = await aiosqlite.connect(path)
        await write.execute("PRAGMA journal_mode=WAL")
        await write.execute("PRAGMA synchronous=NORMAL")  # a rebuildable cache: no fsync per txn
        await write.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
        await write.execute(f"PRAGMA journal_size_limit={WAL_KEPT_BYTES}")
        await write.execute("PRAGMA cache_size=-65536")
        await write.executescript(sql.SCHEMA + ROLE_INDEXES[role])
        await write.execute(sql.SET_SCHEMA, (SCHEMA_VERSION,))
        await write.commit()
        await write.execute(sql.STATS_CREATE)
        await write.executemany(sql.SEED_STAT, sql.SEEDED_STATS)
        await write.commit()
        await write.execute(sql.STATS_CREATE)  # loads the seeded rows; connections below too
        read = await aiosqlite.connect(path)
        await read.execute("PRAGMA query_only=1")
        await read.execute("PRAGMA cache_size=-65536")
        lookup = sqlite3.connect(path, timeout=30, isolation_level=None)
        lookup.execute("PRAGMA query_only=1")
        store = cls(path, write, read, role, lookup, max_rows)
        top = list(await write.execute_fetchall(sql.TOP_ID))[0][0]
        store._next_id = int(top or 0) + 1
        store._stats_at = int(await store.get_meta(sql.STATS_AT) or 0)
        return store

    @property
    def reads(self) -> aiosqlite.Connection:
        """The read-only connection (WAL snapshot per statement), for query modules."""
        return self._r

    async def close(self) -> None:
        await self.checkpointed()
        self._lookup.close()
        await asyncio.get_running_loop().run_in_executor(self._loading, self._close_loader)
        self._loading.shutdown()
        await self._r.close()
        await self._w.close()

    def _close_loader(self) -> None:
        if self._loader is not None:
            self._loader.close()
            self._loader = None

    # ------------------------------------------------------------------ statistics
    async def analyze(self, position: int) -> None:
        """``gather_statistics`` (at log ``position``), between applies."""
        async with self._lock:
            await self._analyze(position)

    async def _analyze(self, position: int) -> None:
        await asyncio.to_thread(gather_statistics, self.path, position)
        self._stats_at = position

    async def _upkeep(self, position: int) -> None:
        """After an apply up to log ``position``: statistics gathered again when the
        projection has doubled since they last were (and at least ``sql.STATS_EVERY`` events
        later), so a projection that grows from nothing is analysed a few dozen times in its
        life, each time in milliseconds (the lock is held)."""
        if position < max(2 * self._stats_at, self._stats_at + sql.STATS_EVERY):
            return
        try:
            await self._analyze(position)
        except Exception as exc:  # the plans do not hang on it (``infra/sql/``): next time
            log.warning("gathering statistics at log position %d: %r", position, exc)

    # ------------------------------------------------------------------ counting (tests)
    async def count_steps(self, steps: Steps | None) -> None:
        """Count the virtual machine's steps (a proxy for the rows each statement touches)
        and record the statements run, on every connection of this store, into ``steps``
        (None: stop). For tests: a progress handler called at every step costs."""
        self.steps = steps
        for name, conn in (("write", self._w), ("read", self._r)):
            if steps is None:  # aiosqlite's hints do not say None removes them; sqlite3's do
                await conn.set_progress_handler(None, 1)  # type: ignore[arg-type]
                await conn.set_trace_callback(None)  # type: ignore[arg-type]
            else:
                await conn.set_progress_handler(steps.handler(name), 1)
                await conn.set_trace_callback(steps.statement)
        _instrument(self._lookup, steps, "lookup")
        if self._loader is not None:  # on the thread that made it
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._loading, _instrument, self._loader, steps, "loader")

    async def bulk(self, on: bool) -> None:
        """Begin (``on``) or end a bulk of applies: a replica catching up on the log.
        Meanwhile commits leave the WAL to grow to ``BULK_WAL_PAGES`` rather than checkpoint
        every ``WAL_PAGES``; at the end a checkpoint on a thread of its own moves it into the
        database, applies going on meanwhile (and returns at once)."""
        self._in_bulk = on
        if on:
            await self._w.execute(f"PRAGMA wal_autocheckpoint={BULK_WAL_PAGES}")
            return
        if self._checkpointing is None or self._checkpointing.done():
            self._checkpointing = asyncio.ensure_future(self._end_bulk())

    async def checkpointed(self) -> None:
        """Wait for the checkpoint at the end of a bulk of applies, if one runs."""
        if self._checkpointing is not None:
            await asyncio.gather(self._checkpointing, return_exceptions=True)

    async def _end_bulk(self) -> None:
        try:  # most of the WAL moved in before the commits would do it inline
            await asyncio.to_thread(self._checkpoint)
        except Exception as exc:  # the commits' own checkpoints will do it
            log.warning("checkpoint after a bulk of applies: %r", exc)
        if not self._in_bulk:  # not begun again meanwhile
            await self._w.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")

    def _checkpoint(self) -> None:
        """Move the WAL into the database, without waiting for (or stopping) applies."""
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute(sql.CHECKPOINT).fetchall()
        finally:
            db.close()

    async def high_water(self) -> int:
        """The log sequence of the newest event this projection holds (0: none): kept by a
        writer's applies; else (a reader's projection, or one from before it was kept) the
        newest of its workspaces' last events, a scan of their rows."""
        kept = await self.get_meta(HIGH_WATER)
        if kept is not None:
            return int(kept)
        rows = list(await self._w.execute_fetchall(sql.NEWEST_SEQ))
        return int(rows[0][0] or 0)

    # ------------------------------------------------------------------ tracking, meta
    async def position(self, name: str) -> int:
        rows = list(await self._w.execute_fetchall(sql.POSITION, (name,)))
        return int(rows[0][0]) if rows else 0

    async def get_meta(self, key: str) -> str | None:
        rows = list(await self._w.execute_fetchall(sql.META, (key,)))
        return str(rows[0][0]) if rows else None

    async def set_meta(self, key: str, value: str) -> None:
        await self._w.execute(sql.SET_META, (key, value))
        await self._w.commit()

    # ------------------------------------------------------------------ apply
    def workspace_id(self, tenant: str, name: str) -> int | None:
        row = self.workspace(tenant, name)
        return None if row is None else row.id

    def version_of(self, tenant: str, name: str) -> int:
        """The workspace's projected version (0 if unknown)."""
        row = self.workspace(tenant, name)
        return 0 if row is None else row.version

    @property
    def rows_held(self) -> int:
        """Workspace rows in memory (at most ``max_rows``)."""
        return len(self._rows)

    def _hold(self, key: tuple[str, str], row: WorkspaceRow) -> None:
        self._rows[key] = row
        self._rows.move_to_end(key)
        while len(self._rows) > self.max_rows:
            self._rows.popitem(last=False)

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
                if have and isinstance(item.event, WorkspaceCreated):
                    seen = seqs[key] if key in seqs else (row.last_seq if row else 0)
                    if item.seq > seen:
                        wipes.add(id(item))  # created again after a purge this projection missed
                        have = 0
                if item.event.version <= have:
                    continue
                # a compaction replaces the workspace, a purge ends it: what the log purged
                # before either is moot
                jumps = isinstance(item.event, HistoryCompacted | WorkspacePurged)
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
                content = bytes(data) if data is not None else _unstash(bytes(stash))
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
        row = _workspace_row(list(await self._w.execute_fetchall(sql.WORKSPACE_BY_ID, (ws,)))[0])
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

    async def put_blob(self, sha256: str, data: bytes) -> None:
        """Keep content fetched from WS_BLOBS (a reader's indexer then indexes it)."""
        async with self._lock:
            await self._w.execute(sql.PUT_BLOB, (sha256, len(data), data))
            await self._w.commit()

    async def index_pending(self, max_bytes: int) -> int:
        """Add contents not yet in the trigram index to it (about ``max_bytes`` of them, in one
        transaction); return how many blobs were taken. Readers only."""
        async with self._lock:
            rows = list(await self._w.execute_fetchall(sql.UNINDEXED))
            taken, texts, used = [], [], 0
            for rowid, data in rows:
                taken.append((rowid,))
                text = as_text(bytes(data))
                if text is not None:
                    texts.append((rowid, text))
                used += len(data)
                if used >= max_bytes:
                    break
            if not taken:
                return 0
            await self._w.executemany(sql.INDEX_CONTENT, texts)
            await self._w.executemany(sql.MARK_INDEXED, taken)
            await self._w.commit()
            return len(taken)

    async def remote_unindexed(self, limit: int) -> list[tuple[int, str, str, str]]:
        """Up to ``limit`` contents not indexed because they are only in WS_BLOBS: ``(rowid,
        sha256, tenant, workspace)``, the workspace whose namespace holds each. Readers only."""
        rows = await self._r.execute_fetchall(sql.REMOTE_UNINDEXED, (limit,))
        return [(int(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows]

    async def index_remote(self, texts: list[tuple[int, str]]) -> None:
        """Index ``(rowid, text)``: contents of blobs fetched from WS_BLOBS, without keeping
        them: only compressed in ``stash``, for a purge to take them out of the index again (a
        contentless index forgets an entry only given its content). Readers only."""
        compress = zstandard.ZstdCompressor(level=STASH_LEVEL).compress
        stashed = [(rowid, text, compress(text.encode())) for rowid, text in texts]
        async with self._lock:
            for rowid, text, stash in stashed:
                if not list(await self._w.execute_fetchall(sql.IS_UNINDEXED, (rowid,))):
                    continue  # indexed meanwhile (a read fetched and kept it)
                await self._w.execute(sql.INDEX_CONTENT, (rowid, text))
                await self._w.execute(sql.INDEXED_REMOTE, (stash, rowid))
            await self._w.commit()

    async def content_unreachable(self, sha256: str) -> None:
        """Its workspace's namespace no longer has ``sha256``: stop fetching it (it stays a
        grep candidate, read when a grep asks). Readers only."""
        async with self._lock:
            await self._w.execute(sql.UNREACHABLE, (sha256,))
            await self._w.commit()

    async def indexed_without_content(self, sha256: str) -> None:
        """A binary content the indexer fetched: nothing to index, nothing to keep (the next
        read fetches it again). Readers only."""
        async with self._lock:
            await self._w.execute(sql.INDEXED_WITHOUT_CONTENT, (sha256,))
            await self._w.commit()

    # ------------------------------------------------------------------ queries
    def workspace(self, tenant: str, name: str) -> WorkspaceRow | None:
        """The workspace as projected: held in memory (updated by ``apply``), or read by one
        indexed lookup and held, the least recently used row dropped past ``max_rows``."""
        key = (tenant, name)
        row = self._rows.get(key)
        if row is not None:
            self._rows.move_to_end(key)
            return row
        # fetched to the end: no read transaction left open
        found = self._lookup.execute(sql.WORKSPACE_BY_NAME, key).fetchall()
        if not found:
            return None
        row = _workspace_row(found[0])
        self.rows_loaded += 1
        self._hold(key, row)
        return row

    async def blob(self, sha256: str) -> bytes | None:
        rows = list(await self._r.execute_fetchall(sql.BLOB, (sha256,)))
        return bytes(rows[0][0]) if rows and rows[0][0] is not None else None

    async def as_of(
        self,
        ws: int,
        version: int,
        statement: Callable[[bool], tuple[str, list[Any]]],
        found: Callable[[list[Any]], bool] = bool,
    ) -> list[Any]:
        """The rows of a statement as of ``version``: its live form first (``statement(True)``:
        one seek of the live rows, which answers nothing unless ``version`` is the workspace's
        newest when it runs); if that finds nothing (``found``) and ``version`` is not the
        newest, its historical form (``statement(False)``: the live rows and those ended
        since ``version``). An empty answer at the newest version is checked with one lookup
        of the workspace's row, never by the historical form (which reads the whole tree)."""
        text, args = statement(True)
        rows = list(await self._r.execute_fetchall(text, args))
        if found(rows) or self.is_newest(ws, version):
            return rows
        text, args = statement(False)
        return list(await self._r.execute_fetchall(text, args))

    def is_newest(self, ws: int, version: int) -> bool:
        """Whether ``version`` is workspace ``ws``'s newest (committed) version."""
        return self._lookup.execute(sql.IS_NEWEST, (ws, version)).fetchone() is not None

    async def entries_at(
        self, ws: int, version: int, scope: str = "", *, with_scope: bool = False
    ) -> list[Node]:
        """Every entry below directory ``scope`` as of ``version`` (and ``scope`` itself, when
        ``with_scope`` and it exists), in path order. At the newest version, one seek of the
        live rows (of the subtree); at an older one, the workspace's live rows and those
        ended since ``version``: what changed since, never the history before it."""
        rows = await self.as_of(
            ws, version, lambda newest: sql.entries(ws, version, scope, with_scope, newest)
        )
        return [node_from_row(r) for r in rows]

    async def uncommitted(self, ws: int, paths: list[str]) -> dict[str, Recorded]:
        """Which of ``paths`` a command left in its sandbox uncommitted, as last recorded."""
        rows = await self._r.execute_fetchall(
            sql.UNCOMMITTED_AT.format(marks=sql.marks(len(paths))), (ws, *paths)
        )
        return {str(r[0]): Recorded(str(r[1]), str(r[2]), int(r[3])) for r in rows}

    def results_of(self, ws: int, request_ids: list[str]) -> dict[str, tuple[int, bytes]]:
        """The version and result of the event of each of ``request_ids`` the workspace has,
        by request id: one seek of the writer's ``events_request`` index an id, all in one
        statement, on the event loop's thread (a writer asks for a group's ids at once, at
        most ``MAX_GROUP``: ~20 us for one id, ~0.2 ms for 256). It was a hop to aiosqlite's
        writing thread for each command, queued behind the projection's apply: 40% of a hot
        workspace's time."""
        rows = self._lookup.execute(sql.RESULTS_OF, (ws, json.dumps(request_ids))).fetchall()
        found: dict[str, tuple[int, bytes]] = {}
        for request_id, version, result in rows:  # index order: the first event of an id
            found.setdefault(str(request_id), (int(version), str(result).encode()))
        return found

    async def histories(
        self, ws: int, paths: list[str]
    ) -> dict[str, tuple[int | None, int | None]]:
        """Of each of ``paths``: its last file version and the version it last changed at
        (None: never a file; never existed), two seeks a path. A few on the event loop's
        thread (less than a hop to aiosqlite's), more on aiosqlite's."""
        args = (ws, json.dumps(paths))
        if len(paths) <= HISTORIES_INLINE:
            rows = self._lookup.execute(sql.PATH_HISTORIES, args).fetchall()
        else:
            rows = list(await self._r.execute_fetchall(sql.PATH_HISTORIES, args))
        return {str(r[0]): (r[1], r[2]) for r in rows}

    async def look_up(self, tree: Tree, ws: int | None, wanted: Needs) -> None:
        """Put into ``tree`` (loaded from this projection: ``Tree.partial``) the history of
        workspace ``ws`` that ``wanted`` names. Those paths did not change since the tree was
        loaded (else it has them), so this projection holds what they are."""
        if ws is None:  # not projected yet: no history before this tree
            tree.looked.update(wanted.history)
            return
        found = await self.histories(ws, wanted.history) if wanted.history else {}
        for path in wanted.history:
            tree.learn(path, *found.get(path, (None, None)))
        for directory, after in wanted.changes_below:
            for path, until in await self.changed_below(ws, directory, after):
                tree.changed.setdefault(path, until)

    async def changed_below(self, ws: int, directory: str, after: int) -> list[tuple[str, int]]:
        """The paths below ``directory`` that ended after version ``after``, and when they
        last did (the revisions ended since ``after``)."""
        lo, hi = subtree(directory)
        rows = await self._r.execute_fetchall(sql.CHANGED_BELOW, (ws, after, lo, hi))
        return [(str(r[0]), int(r[1])) for r in rows]

    # ------------------------------------------------------------------ writer state
    async def load_state(self, tenant: str, name: str) -> WorkspaceState:
        """The writer's in-memory state of a workspace, as projected here."""
        return (await self.load(tenant, name)).state

    async def load(self, tenant: str, name: str, recent: int = 0) -> Loaded:
        """The writer's in-memory state of a workspace, as projected here, and the request
        id, version and result of its last ``recent`` events, every query in one read
        transaction: on the event loop's thread for a small workspace (``SMALL_LOAD``: a few
        dozen microseconds of SQLite, less than a hop to another thread), else on the loading
        thread, so that the loop never waits on a large one. Before, five queries on
        aiosqlite's connection were five hops, queued behind the applier's transactions:
        what a write to a workspace the writer no longer holds paid (issue 17)."""
        row = self.workspace(tenant, name)
        if row is None:
            return Loaded(WorkspaceState(tenant, name), [])
        state = head_of(row)
        if row.version <= SMALL_LOAD and self._small(row.id):
            return Loaded(state, self._fill(self._lookup, state, row.id, recent))
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self._loading, self._fill_apart, state, row, recent)
        return Loaded(state, results)

    def _small(self, ws: int) -> bool:
        """Whether the workspace has at most ``SMALL_LOAD`` revision rows (counting stops
        there: the question costs the same for any workspace)."""
        probe = self._lookup.execute(sql.SMALL_PROBE, (ws, SMALL_LOAD + 1))
        return int(probe.fetchone()[0]) <= SMALL_LOAD

    def _fill_apart(
        self, state: WorkspaceState, row: WorkspaceRow, recent: int
    ) -> list[tuple[str, int, bytes]]:
        """``_fill`` on the loading thread, on its own connection."""
        if self._loader is None:
            self._loader = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self._loader.execute("PRAGMA query_only=1")
            if self.steps is not None:
                _instrument(self._loader, self.steps, "loader")
        return self._fill(self._loader, state, row.id, recent)

    @staticmethod
    def _fill(
        db: sqlite3.Connection, state: WorkspaceState, ws: int, recent: int
    ) -> list[tuple[str, int, bytes]]:
        """``state``'s tree, controls and uncommitted files, and the last ``recent`` results,
        from one read transaction on ``db``.

        The tree is the live rows (one seek of ``revisions_live``), each path's last file
        version and last change those of its live row: O(files of the tree). The history of
        the paths that are not live (deleted, moved away) stays in the projection until a
        decision reads it (``Tree.partial``, ``core.decide.needs``): grouping every revision
        of the workspace for it cost a restarted writer 1.2 s at 100,000 events (issue 29),
        and a table kept per path ever made would still grow with every deleted build output
        or temporary file; these lookups cost two seeks a path a command names."""
        db.execute("BEGIN")
        try:
            tree = state.tree
            tree.partial, tree.loaded_at = True, state.version
            for r in db.execute(sql.LIVE_TREE, (ws,)):
                node = node_from_row(r)
                place(tree, node)
                if node.file_version:
                    tree.last_fv[node.path] = node.file_version
                tree.changed[node.path] = node.version
            for (event,) in db.execute(sql.LIVE_CONTROLS, (ws,)):  # their effect: evolved
                evolve(state, codec.decode_event(str(event).encode()), tree=False)
            for path, reason, by, version in db.execute(sql.UNCOMMITTED_OF, (ws,)):
                state.uncommitted[str(path)] = Recorded(str(reason), str(by), int(version))
            results = (
                _results(db.execute(sql.RECENT_RESULTS, (ws, recent)).fetchall()) if recent else []
            )
        finally:
            db.execute("COMMIT")
        return results

    async def recent_results(
        self, tenant: str, name: str, limit: int
    ) -> list[tuple[str, int, bytes]]:
        """``(request_id, version, result)`` of the workspace's last ``limit`` events, oldest
        first (what ``load`` reads with the state, alone)."""
        ws = self.workspace_id(tenant, name)
        if ws is None:
            return []
        return _results(list(await self._w.execute_fetchall(sql.RECENT_RESULTS, (ws, limit))))
