"""A workspace's log made up in this process, without a writer: what the benchmarks that
measure reading a large log (replay, size, console, bootstrap) append to a bare nats-server.

Each event is what a writer would commit: the common fields filled the same way, the tree
hash of the tree after its changes, and each event's hash chained to the one before."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

from contracts import codec, hashing
from contracts.events import AnyChange, ChangesCommitted, WorkspaceCreated
from contracts.limits import DEFAULT_LIMITS, Limits
from contracts.subjects import Subjects
from core.tree import Tree

BATCH = 500
"""Events appended in one atomic batch."""
T0 = datetime(2026, 1, 1, tzinfo=UTC)
"""The time of a made-up log's first event."""
SUBJECTS = Subjects()

Changes = Callable[[Tree, int, datetime], tuple[str, list[AnyChange]]]
"""``(tree, version, at)`` to the op and changes of the event at ``version`` (from 2 on),
each already applied to ``tree``."""


def chained(
    tenant: str, workspace: str, events: int, changes: Changes, limits: Limits = DEFAULT_LIMITS
) -> Iterator[tuple[bytes, str, str]]:
    """``(payload, Nats-Msg-Id, hash)`` of each event of a workspace's log, in order: its
    creation, then ``events - 1`` events of ``changes``, a millisecond apart."""
    tree, prev = Tree(), hashing.ZERO_HASH
    for version in range(1, events + 1):
        at = T0 + timedelta(milliseconds=version)
        event: WorkspaceCreated | ChangesCommitted
        if version == 1:
            event = WorkspaceCreated(
                tenant=tenant, workspace=workspace, version=version, at=at, actor="bench",
                request_id=f"r{version}", prev_hash=prev,
                op="create", tree_hash=prev, trust="full", limits=limits,
            )  # fmt: skip
        else:
            op, made = changes(tree, version, at)
            event = ChangesCommitted(
                tenant=tenant, workspace=workspace, version=version, at=at, actor="bench",
                request_id=f"r{version}", prev_hash=prev,
                op=op, tree_hash=hashing.tree_hex(tree.hash), changes=made,
            )  # fmt: skip
        payload = codec.encode(event)
        prev = hashing.event_hash(payload)
        yield payload, SUBJECTS.msg_id(tenant, workspace, f"r{version}"), prev
