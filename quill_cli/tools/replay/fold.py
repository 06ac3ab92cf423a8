"""The fold a replay checks as it goes: one workspace's log folded by ``core.evolve`` (the
fold the writer holds its state by) into a ``Fold``, with the contents it carries inline kept
in ``Contents`` and how far it is reported to a ``Progress``.

``Fold`` checks a workspace's log as it folds it: every payload hashes to its
``Ws-Event-Hash``, versions follow each other, each ``prev_hash`` is the previous event's
hash, and after each event the tree hash of the rebuilt tree equals the ``tree_hash`` the
event records. A log that starts at a ``history_compacted`` event (the older log was purged)
starts from its manifest: the manifest's event rows must chain into the compaction event, and
the tree as of any version from the manifest's ``floor`` on is rebuilt from its revision rows.
A log that does not verify is ``INTERNAL`` (``corrupt``: it is not what a writer appended), a
version below a compaction's floor ``VERSION_TRIMMED``.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import msgspec

from contracts import codec, hashing
from contracts.errors import ErrorCode, QuillError
from contracts.events import (
    ChangesCommitted,
    CompactionManifest,
    HistoryCompacted,
    PutFile,
    WorkspaceCreated,
    WorkspaceEvent,
    WorkspaceForked,
)
from core import chain
from core.controls import run_info
from core.evolve import WorkspaceState, evolve, restore
from core.tree import Tree
from infra.compaction import trimmed

MEMORY_BUDGET = 64 * 1024 * 1024
"""Inline contents kept in memory during a replay; more go to a temporary SQLite file."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class RunRecord(msgspec.Struct, kw_only=True):
    """A run as the log tells it: the version it read, who started it, when it ended."""

    run: str
    version: int
    """The version the run read (``pinned_version``)."""
    status: str = "running"
    """``running`` or ``ended``."""
    actor: str | None
    parent: str | None
    started: datetime
    started_version: int
    ended: datetime | None = None
    ended_version: int | None = None


class Summary(msgspec.Struct, kw_only=True):
    """What a replay rebuilt and checked."""

    tenant: str
    workspace: str
    version: int
    at: datetime
    """Time of the event at ``version`` (the mtime of the replayed root directory)."""
    tree_hash: str
    last_hash: str
    files: int
    directories: int
    bytes: int
    events_verified: int
    """Events read from the log and checked (the compaction's manifest rows not counted)."""
    compaction: int | None
    """Version of the ``history_compacted`` event the log starts at, if it was compacted."""
    floor: int
    """The oldest version a replay can rebuild (1 unless compacted)."""
    run: str | None = None
    out: str | None = None


def corrupt(message: str, version: int | None, **details: Any) -> QuillError:
    """The log (or an export) is not what a writer appended."""
    where = f" (version {version})" if version is not None else ""
    return QuillError(ErrorCode.INTERNAL, message + where, details)


# ---------------------------------------------------------------- progress


class Progress(Protocol):
    """Where a long tool reports how far it is (``quill_cli/progress.py`` draws a bar)."""

    def start(self, what: str, total: int | None) -> None:
        """A new phase: ``what`` is being done to ``total`` items (None: unknown)."""

    def update(self, completed: int) -> None:
        """``completed`` items of the current phase are done."""


class NoProgress:
    """Reports nowhere."""

    def start(self, what: str, total: int | None) -> None:
        pass

    def update(self, completed: int) -> None:
        pass


QUIET: Progress = NoProgress()


# ---------------------------------------------------------------- contents


class Contents:
    """Contents carried inline by the log, by sha256 (a move or restore names one again).
    Up to ``budget`` bytes in memory (each content counted with ``ENTRY_COST`` for its
    bookkeeping: a million small contents cost more in keys than in bytes), the rest in a
    SQLite file in a temporary directory; ``close`` removes it."""

    ENTRY_COST = 200

    def __init__(self, budget: int = MEMORY_BUDGET) -> None:
        self._mem: dict[str, str | bytes] = {}
        self._left = budget
        self._spill: Path | None = None
        self._db: sqlite3.Connection | None = None

    def add(self, put: PutFile) -> None:
        sha, value = put.sha256, _inline(put)
        if value is None or sha in self._mem:
            return
        cost = put.size + self.ENTRY_COST
        if cost <= self._left:
            self._mem[sha] = value
            self._left -= cost
            return
        self._disk().execute("INSERT OR IGNORE INTO c VALUES (?, ?)", (sha, _bytes(value)))

    def _disk(self) -> sqlite3.Connection:
        if self._db is None:
            self._spill = Path(tempfile.mkdtemp(prefix="quill-replay-"))
            self._db = sqlite3.connect(self._spill / "contents.db", check_same_thread=False)
            self._db.execute("PRAGMA journal_mode = OFF")
            self._db.execute("PRAGMA synchronous = OFF")
            self._db.execute("CREATE TABLE c (sha TEXT PRIMARY KEY, data BLOB) WITHOUT ROWID")
        return self._db

    def get(self, sha256: str) -> bytes | None:
        value = self._mem.get(sha256)
        if value is not None:
            return _bytes(value)
        if self._db is not None:
            row = self._db.execute("SELECT data FROM c WHERE sha = ?", (sha256,)).fetchone()
            if row is not None:
                return bytes(row[0])
        return None

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._spill is not None:
            shutil.rmtree(self._spill, ignore_errors=True)


def _inline(put: PutFile) -> str | bytes | None:
    return put.text if put.text is not None else put.data


def _bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value


# ---------------------------------------------------------------- the fold


class Fold:
    """One workspace's log folded in order (``core.evolve``), checked as it goes (see the
    module docstring); with ``contents``, the contents it carries inline are kept there."""

    def __init__(self, tenant: str, workspace: str, contents: Contents | None = None) -> None:
        self.tenant, self.workspace, self.contents = tenant, workspace, contents
        self.state = WorkspaceState(tenant, workspace)
        self.events = 0
        self.floor = 1
        self.compaction: int | None = None
        self.lineage: tuple[tuple[str, int], ...] = ()
        """A fork's layers (``workspace_forked``): where its inherited contents are."""

    @property
    def tree(self) -> Tree:
        return self.state.tree

    @property
    def version(self) -> int:
        return self.state.version

    @property
    def last_hash(self) -> str:
        return self.state.last_hash

    @property
    def at(self) -> datetime:
        """Time of the event at ``version``."""
        return self.state.updated or _EPOCH

    @property
    def runs(self) -> dict[str, RunRecord]:
        """The runs as the log tells them, in the order they started."""
        return {
            run_id: RunRecord(
                **msgspec.structs.asdict(run_info(run_id, r)),
                status="running" if r.ended_version is None else "ended",
                ended=r.ended,
            )
            for run_id, r in (self.state.controls.runs or {}).items()
        }

    def check(self, data: bytes, carried: str | None) -> tuple[WorkspaceEvent, str]:
        """Decode one message, checking its hash and whose event it is."""
        digest, broken = chain.payload(data, carried, self.version + 1)
        if broken is not None:
            raise corrupt(broken.message, broken.version)
        try:
            event = codec.decode_event(data)
        except msgspec.MsgspecError as exc:
            raise corrupt(f"Unreadable event: {exc}", self.version + 1) from None
        if (event.tenant, event.workspace) != (self.tenant, self.workspace):
            raise corrupt(
                f"An event of {event.tenant}/{event.workspace} in the log of "
                f"{self.tenant}/{self.workspace}",
                event.version,
            )
        return event, digest

    def apply(
        self, event: WorkspaceEvent, digest: str, manifest: CompactionManifest | None = None
    ) -> None:
        """Fold the next event of the log (``manifest``: a compaction's, if it is one)."""
        if self.version == 0 and not (event.version == 1 and isinstance(event, WorkspaceCreated)):
            raise corrupt(
                "The log starts neither with the creation nor a compaction", event.version
            )
        broken = chain.link(self.version, self.last_hash, event.version, event.prev_hash)
        if broken is not None:
            raise corrupt(broken.message, broken.version, **broken.details)
        match event:  # the contents it carries: checked, and kept
            case ChangesCommitted(changes=changes, version=version):
                for change in changes:
                    if isinstance(change, PutFile):
                        self._carried(change, version)
        evolve(self.state, event, digest, manifest=manifest)
        self._recorded(event.version, event.tree_hash)
        self.events += 1

    def graft(self, base: Fold, event: WorkspaceForked | None, digest: str) -> None:
        """Start a fork's fold from its source's (``base``, folded up to the fork point, or
        below it when the version asked is); ``event`` (the fork's first, None below the
        fork point) must continue the source's chain at the fork point and its tree hash.

        Raises:
            QuillError: ``INTERNAL`` when it does not.
        """
        state = base.state
        state.workspace = self.workspace
        self.state, self.events, self.floor = state, base.events, base.floor
        if event is None:
            return
        if base.version != event.version or event.prev_hash != base.last_hash:
            raise corrupt(
                f"The fork does not continue the chain of {self.tenant}/{event.source} at "
                f"version {event.version}",
                event.version,
                prev_hash=event.prev_hash,
                source_hash=base.last_hash,
            )
        evolve(self.state, event, digest)
        self.lineage = self.state.lineage
        self._recorded(event.version, event.tree_hash)
        self.events += 1

    def _carried(self, change: PutFile, version: int) -> None:
        inline = _inline(change)
        if inline is not None and (
            broken := chain.content(change.path, _bytes(inline), change.sha256, version)
        ):
            raise corrupt(broken.message, broken.version)
        if self.contents is not None:
            self.contents.add(change)

    def start(
        self, event: HistoryCompacted, digest: str, manifest: CompactionManifest, at: int
    ) -> None:
        """Start from the compaction the log begins with, as of version ``at``.

        Raises:
            QuillError: ``VERSION_TRIMMED`` below the manifest's floor; ``INTERNAL`` if its
                rows do not chain into ``event`` or the tree they give does not hash right.
        """
        floor = max(manifest.floor, 1)
        rows = {int(r[0]): r for r in manifest.events if int(r[0]) >= floor}
        previous = hashing.ZERO_HASH if floor == 1 else None
        for version in range(floor, event.version):
            row = rows.get(version)
            if row is None:
                raise corrupt("The compaction's manifest lacks an event", version)
            if previous is not None and row[10] != previous:
                raise corrupt("Hash chain broken in the compaction's manifest", version)
            previous = str(row[9])
        if previous is not None and event.prev_hash != previous:
            raise corrupt("The compaction does not chain to its manifest", event.version)
        if at < floor:
            raise trimmed(f"{self.tenant}/{self.workspace}", at, floor)
        restore(self.state, event, manifest, at, digest)
        self._recorded(self.version, self.state.tree_hash)
        self.floor, self.compaction = floor, event.version
        self.events += 1

    def _recorded(self, version: int, tree_hash: str) -> None:
        rebuilt = hashing.tree_hex(self.tree.hash)
        if rebuilt != tree_hash:
            raise corrupt(
                "The rebuilt tree does not hash to the tree_hash recorded",
                version,
                rebuilt=rebuilt,
                recorded=tree_hash,
            )

    def summary(self, *, run: str | None = None, out: str | None = None) -> Summary:
        return Summary(
            tenant=self.tenant,
            workspace=self.workspace,
            version=self.version,
            at=self.at,
            tree_hash=hashing.tree_hex(self.tree.hash),
            last_hash=self.last_hash,
            files=len(self.tree.files),
            directories=len(self.tree.dirs),
            bytes=self.tree.total_bytes,
            events_verified=self.events,
            compaction=self.compaction,
            floor=self.floor,
            run=run,
            out=out,
        )
