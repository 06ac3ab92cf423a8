"""How a writer runs (``quill writer`` options, one field each, named as the option)."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.limits import (
    WRITER_MAX_QUEUED,
    WRITER_MAX_QUEUED_BYTES,
    WRITER_MAX_QUEUED_PER_WORKSPACE,
    WRITER_MAX_WAITING_PER_WORKSPACE,
    WRITER_WORKSPACES,
)


@dataclass(frozen=True)
class WriterConfig:
    partitions: int = 0
    """On a cluster: the number of command partitions; the writer leases its share of them
    (``services/writer/partitions.py``). 0: it serves every command (one writer)."""
    lease_ttl: float = 5.0
    """Seconds a partition lease lives unrenewed: how soon another writer takes over."""
    max_queued: int = WRITER_MAX_QUEUED
    """Commands held (queued, deciding, appending) at once, all workspaces together."""
    max_queued_bytes: int = WRITER_MAX_QUEUED_BYTES
    """Bytes of the requests of those commands."""
    max_queued_per_workspace: int = WRITER_MAX_QUEUED_PER_WORKSPACE
    """Commands one workspace holds at once (queued, deciding, appending)."""
    max_waiting_per_workspace: int = WRITER_MAX_WAITING_PER_WORKSPACE
    """Commands one workspace holds waiting for its lock or their approval."""
    snapshot_behind: int = 0
    """A writer with no projection starts from the newest reader snapshot if it covers more
    than this many events (0: never; ``infra/snapshot_install.py``)."""
    max_workspaces: int = WRITER_WORKSPACES
    """Workspaces held in memory; past it the least recently used idle one is dropped."""
