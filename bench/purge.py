"""Purges (``python -m bench purge``, issue 33 item 5): what purging a fork costs a projection,
and what the index that makes it cheap costs every apply, each beside its baseline.

A purge deletes the workspace's rows, then asks which of its contents another workspace
still holds before it deletes the others' blobs (``sql.CONTENTS_KEPT``). That question was a
scan of every revision of the projection, so purging a 5-file fork of a 100,000-file source
cost a scan of the source; it is now a seek per content on ``revisions_sha``, a partial
index on ``revisions(sha256)`` that every applied file revision pays for.

Measured on the store itself (``Store.apply``, as the writer and a reader apply what the log
holds), for each role's projection, on events made here (writer-shaped, as ``bench size``
makes them): a source of ``--full`` 100,000 files (10,000 by default), 100 a event, then
forks of it and standalone workspaces, each of 5 files (4 contents of its own, one the
source's too). Medians of ``SAMPLES``, a figure and its baseline taking turns sample by
sample:

* purging a fork against purging a standalone workspace in the same projection (goal: about
  1x: a purge costs the purged workspace's rows);
* the purge's question alone, as it was (a scan of every revision) against as it is;
* applying ``WRITES`` write events (one file each, a new content, 100 events a batch) to the
  projection against the same to a copy of it without ``revisions_sha`` (the price of the
  index: one more B-tree entry a file revision).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.size import PER_EVENT, synthesise
from bench.synthetic import T0
from contracts import codec, hashing
from contracts.events import (
    ChangesCommitted,
    Event,
    ForkBase,
    PutFile,
    WorkspaceCreated,
    WorkspaceForked,
    WorkspacePurged,
)
from contracts.limits import DEFAULT_LIMITS
from core.plan import Committed
from infra import sql
from infra.store import Steps, Store

FILES = 100_000
SMALL_FILES = 10_000
TENANT = "bench"
SOURCE = "src"
OWN = 5
"""Files of a fork and of a standalone workspace."""
SAMPLES = 15
WRITES = 10_000
BATCH = 100
PATHS = 1_000
"""Paths the writes go round."""
WAS = "SELECT DISTINCT sha256 FROM revisions WHERE +sha256 IN (SELECT value FROM json_each(?))"
"""``sql.CONTENTS_KEPT`` before issue 33's index: a scan of every revision (``+sha256``: with
the index there, SQLite would seek it for this form too, and ignores ``NOT INDEXED`` on a
table ``WITHOUT ROWID``)."""


class Log:
    """Events numbered as a log would (``seq``), each workspace's chained to its last."""

    def __init__(self) -> None:
        self.seq = 0
        self.heads: dict[str, tuple[int, str]] = {}
        """A workspace's version and hash."""

    def commit(self, event: Event) -> Committed:
        payload = codec.encode(event)
        digest = hashing.event_hash(payload)
        self.seq += 1
        self.heads[event.workspace] = (event.version, digest)
        return Committed(codec.decode_event(payload), digest, self.seq)

    def common(self, name: str, op: str, version: int | None = None) -> dict[str, Any]:
        have, prev = self.heads.get(name, (0, hashing.ZERO_HASH))
        version = have + 1 if version is None else version
        return dict(
            tenant=TENANT, workspace=name, version=version, op=op, actor="bench",
            at=T0 + timedelta(seconds=self.seq), request_id=f"r{self.seq}", prev_hash=prev,
            tree_hash=hashing.ZERO_HASH,
        )  # fmt: skip

    def puts(self, name: str, files: dict[str, str], versions: dict[str, int]) -> Committed:
        common = self.common(name, "apply")
        changes = []
        for path, text in files.items():
            versions[path] = versions.get(path, 0) + 1
            changes.append(
                PutFile(
                    path=path,
                    sha256=hashing.content_sha256(text.encode()),
                    size=len(text),
                    file_version=versions[path],
                    created=common["at"],
                    text=text,
                )  # fmt: skip
            )
        return self.commit(ChangesCommitted(changes=list(changes), **common))

    def purge(self, name: str) -> Committed:
        have = self.heads[name][0]
        return self.commit(WorkspacePurged(purged_version=have, **self.common(name, "purge")))


def own_files(name: str, shared: str) -> dict[str, str]:
    """A small workspace's files: contents of its own, and one its source holds too."""
    files = {f"own/f{k}.txt": f"{name}'s own file {k}\n" for k in range(OWN - 1)}
    files["own/shared.txt"] = shared
    return files


async def build(path: Path, role: str, files: int, samples: int) -> tuple[Log, str]:
    """The projection: the source, then ``samples + 2`` forks and standalone workspaces;
    the log as it left it, and a content of the source."""
    store = await Store.open(path, role=role)
    log = Log()
    batch: list[Committed] = []
    first: str | None = None
    for payload, _, digest, _ in synthesise(
        TENANT, SOURCE, files, files // PER_EVENT + 1, max_versions=None
    ):
        event = codec.decode_event(payload)
        log.seq += 1
        log.heads[SOURCE] = (event.version, digest)
        batch.append(Committed(event, digest, log.seq))
        if first is None and isinstance(event, ChangesCommitted):
            change = event.changes[-1]
            assert isinstance(change, PutFile) and change.text is not None
            first = change.text
        if len(batch) == BATCH:
            await store.apply(batch)
            batch = []
    assert first is not None
    version, digest = log.heads[SOURCE]
    for i in range(samples + 2):
        fork, alone = f"fork{i}", f"alone{i}"
        batch.append(
            log.commit(
                WorkspaceForked(
                    source=SOURCE,
                    lineage=[ForkBase(workspace=SOURCE, version=version)],
                    trust="full",
                    limits=DEFAULT_LIMITS,
                    **{**log.common(fork, "fork", version), "prev_hash": digest},
                )  # fmt: skip
            )
        )
        batch.append(log.puts(fork, own_files(fork, first), {}))
        batch.append(
            log.commit(
                WorkspaceCreated(trust="full", limits=DEFAULT_LIMITS, **log.common(alone, "create"))
            )
        )
        batch.append(log.puts(alone, own_files(alone, first), {}))
    await store.apply(batch)
    await store.close()
    return log, first


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


STEPS = "steps"


def line(label: str, value: float, base: float, goal: str = "") -> None:
    """A figure in milliseconds (or steps: ``goal`` is ``STEPS``) and its ratio to ``base``."""
    ratio = value / base if base else 0.0
    shown = f"{value:>10.0f}   " if goal == STEPS else f"{value:>10.2f} ms"
    print(f"{label:<64} {shown} {ratio:>8.2f}x{goal if goal != STEPS else ''}")


async def opened(path: Path, role: str, tmp: Path) -> tuple[Store, Store]:
    """The projection at ``path``, and a copy of it without ``revisions_sha`` (as it was
    before issue 33: the baseline of what the index costs every apply)."""
    bare = tmp / f"{role}-without.db"
    shutil.copy(path, bare)
    stores = (await Store.open(path, role=role), await Store.open(bare, role=role))
    db = sqlite3.connect(bare, isolation_level=None)  # after the open, which makes it
    db.execute(f"DROP INDEX {sql.SHA_INDEX}")
    db.close()
    return stores


async def purges(store: Store, bare: Store, log: Log, samples: int) -> None:
    """Forks and standalone workspaces purged in turn; the purge's question alone, as it is
    (``store``) and as it was (``bare``: no index, the former statement)."""
    asked = [hashing.content_sha256(text.encode()) for text in own_files("fork0", "x").values()]
    was: list[float] = []
    now: list[float] = []
    for i in range(samples + 1):
        for db, statement, times in ((store, sql.CONTENTS_KEPT, now), (bare, WAS, was)):
            t0 = time.perf_counter()
            kept = await db.reads.execute_fetchall(statement, (json.dumps(asked),))
            if i:
                times.append(time.perf_counter() - t0)
            assert len(list(kept)) == OWN - 1  # the fork's own; "x" nowhere
    fork: list[float] = []
    alone: list[float] = []
    for i in range(samples + 1):
        for name, times in ((f"alone{i}", alone), (f"fork{i}", fork)):
            item = log.purge(name)
            t0 = time.perf_counter()
            await store.apply([item])
            if i:  # the first of each is a warm-up
                times.append(time.perf_counter() - t0)
            assert store.workspace(TENANT, name) is None
    steps = {}
    for name in ("alone", "fork"):  # counted, not timed (counting slows every step)
        steps[name] = counted = Steps()
        await store.count_steps(counted)
        await store.apply([log.purge(f"{name}{samples + 1}")])
        await store.count_steps(None)
    base = median_ms(alone)
    line(f"  purge of a {OWN}-file workspace (baseline)", base, base)
    line(f"  purge of a {OWN}-file fork of the source", median_ms(fork), base, "  (goal ~1x)")
    base = steps["alone"].total
    line(f"  the same in SQLite steps: a {OWN}-file workspace (baseline)", base, base, STEPS)
    line(f"  the same in SQLite steps: a {OWN}-file fork", steps["fork"].total, base, STEPS)
    base = median_ms(now)
    line(f"  which of {OWN} contents others hold: a seek each (baseline)", base, base)
    line("  the same, as it was: a scan of every revision", median_ms(was), base)


async def writes(store: Store, bare: Store, log: Log) -> None:
    """``WRITES`` write events applied to the projection and to its copy without
    ``revisions_sha``, a batch to each in turn."""
    name, versions = "writes", dict[str, int]()
    create = WorkspaceCreated(trust="full", limits=DEFAULT_LIMITS, **log.common(name, "create"))
    events = [log.commit(create)]
    for n in range(WRITES):
        text = f"write {n}\n" * 4
        events.append(log.puts(name, {f"w/f{n % PATHS:03}.txt": text}, versions))
    took = [0.0, 0.0]
    for start in range(0, len(events), BATCH):
        for k, db in enumerate((bare, store)):
            t0 = time.perf_counter()
            await db.apply(events[start : start + BATCH])
            took[k] += time.perf_counter() - t0
    base, indexed = took[0] * 1000, took[1] * 1000
    line(f"  {WRITES:,} write events applied without {sql.SHA_INDEX} (baseline)", base, base)
    line(f"  the same with {sql.SHA_INDEX}", indexed, base)


async def main(full: bool = False, samples: int = SAMPLES) -> None:
    files = FILES if full else SMALL_FILES
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        print(f"Purges: a source of {files:,} files, forks and standalone workspaces of {OWN}")
        print(f"{'':<64} {'median':>13} {'ratio':>9}")
        for role in ("writer", "reader"):
            path = tmp / f"{role}.db"
            t0 = time.perf_counter()
            log, _ = await build(path, role, files, samples)
            print(f"{role}'s projection (built in {time.perf_counter() - t0:.0f} s)")
            store, bare = await opened(path, role, tmp)
            try:
                await purges(store, bare, log, samples)
                await writes(store, bare, log)
            finally:
                await store.close()
                await bare.close()


if __name__ == "__main__":
    asyncio.run(main())
