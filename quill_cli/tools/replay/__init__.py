"""Replay and audit tooling over the log alone (``quill replay/verify/runs/export/import``).

A workspace is rebuilt from its log in memory and checked as it is folded (``core.evolve``,
the fold the writer holds its state by); the pieces, along the seams of what was one module
(moved here whole from ``services/common`` in issue 12, split in issue 31):

- ``fold``: ``Fold`` (the checked fold), ``Contents`` (inline contents, spilled to SQLite
  past a budget), ``Progress``, the records a replay reports (``Summary``, ``RunRecord``);
- ``read``: reading the log by a pull consumer of the replay's own (``messages``) and folding
  it (``drive``, ``replay``, ``find_run``), NATS failures as ``UNAVAILABLE``;
- ``tree``: the replayed tree written to disk, byte-identical across replays (``write_tree``);
- ``replicas``: reader replicas checked against a replay (``check_replica``);
- ``exports``: the export file format, ``export``, ``verify_file``, ``import_file``.

Callers use this package (``from quill_cli.tools import replay as rpl``), which names what
each module offers. Failures are ``QuillError``: a log that does not verify is ``INTERNAL``
(it is not what a writer appended), an export file that does not verify
``INVALID_ARGUMENT``, a version below a compaction's floor ``VERSION_TRIMMED``.
"""

from __future__ import annotations

from quill_cli.tools.replay.exports import (
    FORMAT,
    FORMAT_VERSION,
    GROUP_BYTES,
    GROUP_EVENTS,
    PARALLEL,
    AnyRecord,
    BlobRecord,
    End,
    EventRecord,
    Header,
    Moved,
    Record,
    append_batch,
    export,
    import_file,
    read_records,
    verify_file,
)
from quill_cli.tools.replay.fold import (
    MEMORY_BUDGET,
    QUIET,
    Contents,
    Fold,
    NoProgress,
    Progress,
    RunRecord,
    Summary,
    corrupt,
)
from quill_cli.tools.replay.read import (
    BATCH,
    BATCH_BYTES,
    BUFFER_MAX,
    IDLE_S,
    INACTIVE_S,
    OnEvent,
    Raw,
    drive,
    find_run,
    last_event,
    messages,
    nats_errors,
    replay,
)
from quill_cli.tools.replay.replicas import ReplicaCheck, check_replica, live_readers
from quill_cli.tools.replay.tree import WRITERS, each, write_tree

__all__ = [
    "BATCH",
    "BATCH_BYTES",
    "BUFFER_MAX",
    "FORMAT",
    "FORMAT_VERSION",
    "GROUP_BYTES",
    "GROUP_EVENTS",
    "IDLE_S",
    "INACTIVE_S",
    "MEMORY_BUDGET",
    "PARALLEL",
    "QUIET",
    "WRITERS",
    "AnyRecord",
    "BlobRecord",
    "Contents",
    "End",
    "EventRecord",
    "Fold",
    "Header",
    "Moved",
    "NoProgress",
    "OnEvent",
    "Progress",
    "Raw",
    "Record",
    "ReplicaCheck",
    "RunRecord",
    "Summary",
    "append_batch",
    "check_replica",
    "corrupt",
    "drive",
    "each",
    "export",
    "find_run",
    "import_file",
    "last_event",
    "live_readers",
    "messages",
    "nats_errors",
    "read_records",
    "replay",
    "verify_file",
    "write_tree",
]
