"""A projection's opening (schema, role indexes, a projection of another schema rebuilt),
its statistics, bulk applies and checkpoints, meta and tracking, and the bounded cache of
workspace rows: what every part of ``Store`` stands on (``infra.store``)."""

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
from typing import Any, Self

import aiosqlite
import msgspec

from contracts.limits import PROJECTION_ROWS, Limits
from core.rows import Node, WorkspaceRow
from infra import sql

log = logging.getLogger("quill.store")

SCHEMA_VERSION = sql.SCHEMA_VERSION
ROLE_INDEXES = sql.ROLE_INDEXES
ROLE_DROPS = sql.ROLE_DROPS
REVISION_COLUMNS = sql.REVISION_COLUMNS
R_REVISION_COLUMNS = sql.R_REVISION_COLUMNS
HIGH_WATER = "high_water"
"""The meta key of the newest event a writer's projection holds (``Store.high_water``)."""

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


async def _schema_version(db: aiosqlite.Connection) -> str | None:
    try:
        rows = list(await db.execute_fetchall(sql.SCHEMA_OF))
    except aiosqlite.OperationalError:
        return None
    return str(rows[0][0]) if rows else None


@functools.lru_cache(maxsize=256)
def _limits(encoded: str) -> Limits:
    """Decoded once per distinct value: most workspaces share the defaults (frozen, so one
    object serves them all; ~0.5 KB saved per workspace held in ``Store``'s maps)."""
    return _limits_decoder.decode(encoded)


def workspace_row(r: Any) -> WorkspaceRow:
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
        lineage_of(r[12]),
    )


def lineage_of(text: str | None) -> tuple[tuple[str, int], ...]:
    """A fork's lineage from its row's JSON (``core.plan.lineage_text``)."""
    if not text:
        return ()
    return tuple((str(name), int(version)) for name, version in json.loads(text))


def node_from_row(row: Any, until: int | None = None) -> Node:
    """A revision row as a node (``until``: instead of the row's)."""
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
        row[10] if until is None else until,
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


def instrument(db: sqlite3.Connection, steps: Steps | None, name: str) -> None:
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


class StoreBase:
    """A projection database's connections, statistics, meta and the workspace rows it
    holds; ``Store`` adds applying, blobs, queries and loading (``infra.store``)."""

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
        self._layers: dict[int, list[tuple[int, int]] | None] = {}
        """A fork's layers by its id (``infra/store/layers.py``); None: no fork."""
        self.steps: Steps | None = None
        """Counts the SQLite virtual machine's steps on every connection, while a test
        wants it (``count_steps``)."""

    @classmethod
    async def open(cls, path: Path, role: str = "reader", max_rows: int | None = None) -> Self:
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
        instrument(self._lookup, steps, "lookup")
        if self._loader is not None:  # on the thread that made it
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._loading, instrument, self._loader, steps, "loader")

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

    # ------------------------------------------------------------------ workspace rows
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
        row = workspace_row(found[0])
        self.rows_loaded += 1
        self._hold(key, row)
        return row
