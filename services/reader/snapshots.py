"""The reader's snapshots (``infra/snapshots.py``): it starts from one, and makes them.

A replica with no projection, or one more than ``behind`` events older than the newest
snapshot, installs that snapshot before its store opens (``prepare``), then follows the log
from the snapshot's position. While it serves, each replica checks every ``check_s`` whether a
snapshot is due: ``every_events`` events applied since the newest one in WS_SNAPSHOTS, or
``every_s`` seconds since it was made (and something applied since). The replicas share that
newest snapshot, so they agree on when one is due; the one that takes the lease
(WS_SNAPSHOT_LEASES) makes it, the others see it made. ``<root>.sys.snapshot.reader`` asks one
replica (the queue group) for one now (``quill snapshot``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from contracts import codec
from infra import bus, snapshot_install
from infra import snapshots as snaps
from infra.loops import Loop

log = logging.getLogger("quill.reader.snapshots")

ROLE = "reader"


@dataclasses.dataclass(frozen=True)
class SnapshotConfig:
    """How a reader replica makes and uses snapshots: ``quill reader``'s options
    (``--snapshot-events``, ``--snapshot-minutes``, ``--snapshot-keep``, ``--snapshot-behind``),
    which are all its own."""

    every_events: int = 20_000
    """Make one once this many events were applied since the newest (0: this replica never
    makes one unless asked)."""
    every_s: float = 30 * 60.0
    """... or once the newest is this old and events were applied since."""
    keep: int = 3
    """Snapshots kept in WS_SNAPSHOTS (the oldest deleted when one is made)."""
    behind: int = 20_000
    """Start from the newest snapshot when the local projection is more than this many events
    behind it, or missing (0: never start from one)."""
    check_s: float = 5.0
    """How often a replica checks whether one is due."""


async def prepare(js: JetStreamContext, path: Path, tracking: str, config: SnapshotConfig) -> None:
    """Before the projection at ``path`` opens: install the newest snapshot if it is far ahead."""
    await snapshot_install.bootstrap(js, path, ROLE, tracking, behind=config.behind)


class Snapshotter:
    """Makes this replica's share of the snapshots (see the module docstring)."""

    def __init__(
        self,
        js: JetStreamContext,
        path: Path,
        tracking: str,
        instance: str,
        config: SnapshotConfig,
        position: Callable[[], int | None],
    ) -> None:
        self._js, self._path, self._tracking = js, path, tracking
        self._instance, self.config = instance, config
        self._position = position
        """The log position applied, or None while catching up (no snapshot then)."""
        self._loop = Loop("snapshots", self._tick, every=config.check_s, failed=self._failed)
        self._making = asyncio.Lock()
        self.newest: snaps.Snapshot | None = None
        self.made = 0
        self._started = datetime.now(UTC)

    def start(self) -> None:
        if self.config.every_events > 0:
            self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def due(self, position: int, now: datetime) -> bool:
        """Whether a snapshot is due at log ``position`` (none yet: as if one had been made
        at position 0 when this replica started)."""
        newest = self.newest
        since, made = (newest.position, newest.made) if newest else (0, self._started)
        behind, age = position - since, (now - made).total_seconds()
        return behind >= self.config.every_events or (behind > 0 and age >= self.config.every_s)

    def _failed(self, exc: Exception) -> None:
        log.exception("snapshot check failed; trying again in %.0f s", self.config.check_s)

    async def _tick(self) -> None:
        position = self._position()
        if position is None:
            return
        if self.newest is None or self.due(position, datetime.now(UTC)):
            found = await snaps.listing(self._js, ROLE)  # what the other replicas made
            self.newest = found[0] if found else None
            if self.due(position, datetime.now(UTC)):
                await self.make()

    async def make(self) -> snaps.Snapshot | None:
        """Make one now, if no other replica is making one (None then); the newest again if
        nothing was applied since it (asking again and again costs nothing)."""
        async with self._making:
            newest, position = self.newest, self._position()
            if position is None:  # events of some workspaces may be applied ahead of it
                raise RuntimeError("this replica is catching up with the log: none until it has")
            if newest is not None and newest.position >= position:
                return newest
            lease = snaps.Lease(self._js, ROLE, self._instance)
            if not await lease.take():
                log.info("another replica is making a snapshot")
                return None
            try:
                snap = await snaps.make(
                    self._js, self._path, ROLE, self._tracking, self._instance,
                    keep=self.config.keep,
                )  # fmt: skip
            finally:
                await lease.release()
            self.newest, self.made = snap, self.made + 1
            return snap

    async def on_request(self, msg: Msg) -> None:
        """``<root>.sys.snapshot.reader``: make one now; answer what was made."""
        body: dict[str, Any]
        try:
            snap = await self.make()
            if snap is None:
                body = {"ok": False, "error": "another replica is making a snapshot"}
            else:
                body = {
                    "ok": True,
                    "name": snap.name,
                    "position": snap.position,
                    "bytes": snap.size,
                    "stored_bytes": snap.stored,
                    "by": snap.by,
                }
        except Exception as exc:
            log.exception("snapshot failed")
            body = {"ok": False, "error": f"snapshot failed: {exc}"}
        await bus.respond(msg, codec.encode(body))
