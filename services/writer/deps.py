"""What a workspace actor and the command entry are given: the writer's collaborators.

``app.py`` builds one :class:`Deps` and hands it to the actors (``actors.py``, which give it
to every ``WorkspaceActor``), the entry (``handlers.py``) and the applier (``applier.py``);
none reaches back into the ``Writer``. The partitions are seen through :class:`Fencing`, the
few questions an actor and the entry ask them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from contracts.events import CompactionManifest
from contracts.limits import (
    WRITER_MAX_QUEUED,
    WRITER_MAX_QUEUED_BYTES,
    WRITER_MAX_QUEUED_PER_WORKSPACE,
    WRITER_MAX_WAITING_PER_WORKSPACE,
)
from contracts.subjects import Subjects
from core.lru import SizedLRU
from core.secrets import Secrets
from infra.approvals import Approvals
from infra.blobs import Blobs
from infra.bridges import Bridges
from infra.fork_registry import Registry
from infra.offload import Offload
from infra.runtime import Auditor
from infra.storage import FullState
from infra.store import Store
from services.writer.append import Appender
from services.writer.partitions import Fence


class ContentCache(SizedLRU[bytes]):
    """Recently written or read contents by sha256, bounded in bytes (LRU)."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        super().__init__(max_bytes)


@dataclass
class Backlog:
    """Commands accepted and not yet answered: counted up by the entry, down by the actor
    that answers them; the entry refuses past the bounds (``contracts/limits.py``)."""

    limit: int = WRITER_MAX_QUEUED
    """The most commands held, all workspaces together."""
    max_bytes: int = WRITER_MAX_QUEUED_BYTES
    """The most bytes of requests they hold."""
    per_workspace: int = WRITER_MAX_QUEUED_PER_WORKSPACE
    """The most commands one workspace holds queued, deciding or appending."""
    parked_per_workspace: int = WRITER_MAX_WAITING_PER_WORKSPACE
    """The most commands one workspace holds waiting for its lock (or their approval)."""
    queued: int = 0
    bytes: int = 0


@dataclass
class Completeness:
    """Whether the writer's projection holds every event of the log of each workspace it has
    a row of: set at start once it has applied what it missed (``Applier.complete``),
    cleared when an apply fails (``Applier.apply``). While set, loading a workspace the
    projection holds does not ask the log for its last sequence (a round trip to the server,
    a third of a cold write's cost): the append's condition
    (``Nats-Expected-Last-Subject-Sequence``) still refuses a decision made on a stale state,
    which is then decided again on the log's."""

    complete: bool = False


class Fencing(Protocol):
    """The partitions as an actor and the entry see them (``partitions.Partitions``)."""

    @property
    def count(self) -> int: ...

    def fence(self, partition: int) -> Fence | None: ...

    async def still_holds(self, partition: int, fence: Fence) -> bool: ...


@dataclass(frozen=True, slots=True)
class Deps:
    """The writer's collaborators, built once by ``app.py``."""

    subjects: Subjects
    nc: NATS
    """Publishes ``workspace.updated``."""
    js: JetStreamContext
    """Reads the log (catch-up) and purges it after a compaction."""
    store: Store
    """The writer's projection."""
    appender: Appender
    blobs: Blobs
    """``WS_BLOBS``, backed by the projection's contents."""
    manifest_blobs: Blobs
    """``WS_BLOBS`` alone: manifests are not kept in the projection."""
    bridges: Bridges
    secrets: Secrets
    auditor: Auditor
    partitions: Fencing | None
    """On a cluster: the command partitions this writer leases (None: it serves all)."""
    backlog: Backlog
    offload: Offload
    """Worker processes for the expensive steps of decisions (``core.decision.Expensive``)."""
    approvals: Approvals
    """``WS_APPROVALS``: the requests parked for approval, carried out once approved."""
    registry: Registry
    """``WS_FORKS``: the forks standing on each workspace, cluster-wide (a fork, a purge)."""
    contents: ContentCache = field(default_factory=ContentCache)
    manifests: dict[str, CompactionManifest] = field(default_factory=dict)
    """Manifests of the compactions being appended, by sha256 (for the projection)."""
    log_storage: FullState = field(default_factory=lambda: FullState("log"))
    """Whether the log refused the last append for storage (``infra/storage.py``)."""
    projection: Completeness = field(default_factory=Completeness)
    """Whether a load may trust the projection without asking the log."""
