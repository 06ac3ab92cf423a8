"""Snapshot-and-trim (``max_versions``): when compaction is due, and reading its manifests.

A workspace created with ``max_versions = N`` keeps at least the last N revisions of every
path (the latest always). The writer lets a path gather up to ``N + slack(N)`` revisions,
then compacts the whole workspace at once: it stores a ``CompactionManifest`` (the
revisions kept, the events from the floor on, every control event) and every content those
revisions name in WS_BLOBS, appends a ``history_compacted`` event naming the manifest, and
purges the workspace's log before that event. Every projection (writer, readers) replaces
the workspace with the manifest when it folds the event, so replicas that lived through the
old history and replicas that start from the compaction hold the same rows; replay is exact
from the compaction on.
"""

from __future__ import annotations

import msgspec

from contracts.errors import ErrorCode, QuillError
from contracts.events import CompactionManifest, HistoryCompacted
from core.plan import Committed
from infra.blobs import Blobs

_decoder = msgspec.json.Decoder(CompactionManifest)
encode_manifest = msgspec.json.Encoder().encode


def slack(max_versions: int) -> int:
    """Revisions a path may gather beyond ``max_versions`` before the workspace is compacted:
    compactions cost the whole workspace, so they come at most every ``slack`` writes."""
    return max(max_versions, 16)


def due(count: int, max_versions: int | None) -> bool:
    """Whether a path with ``count`` revisions kept makes compaction due."""
    return max_versions is not None and count > max_versions + slack(max_versions)


def trimmed(what: str, version: int, floor: int) -> QuillError:
    """The answer to a query as of a version compaction dropped."""
    return QuillError(
        ErrorCode.VERSION_TRIMMED,
        f"Version {version} of {what} was compacted away (max_versions); the whole "
        f"workspace is kept from version {floor} on",
        {"version": version, "floor": floor},
    )


def decode_manifest(data: bytes) -> CompactionManifest:
    return _decoder.decode(data)


async def with_manifests(batch: list[Committed], blobs: Blobs) -> list[Committed]:
    """``batch`` with the manifest of each ``history_compacted`` event, from WS_BLOBS."""
    if not any(isinstance(item.event, HistoryCompacted) for item in batch):
        return batch
    out = []
    for item in batch:
        event = item.event
        if isinstance(event, HistoryCompacted) and item.manifest is None:
            manifest = decode_manifest(
                await blobs.of(event.tenant, event.workspace).get(event.manifest)
            )
            item = Committed(item.event, item.hash, item.seq, manifest)
        out.append(item)
    return out
