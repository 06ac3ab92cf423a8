"""Builders for the pure tests: decide commands as the writer does, without NATS or a disk."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from contracts import codec, hashing
from contracts import requests as rq
from contracts.events import PutFile
from contracts.subjects import Origin
from core.decide import decide
from core.decision import Context, to_event
from core.evolve import WorkspaceState, evolve
from core.plan import Committed

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class LogBuilder:
    """Decide commands like the writer does and keep the committed log, without NATS."""

    def __init__(self, tenant: str = "acme", workspace: str = "demo") -> None:
        self.state = WorkspaceState(tenant, workspace)
        self.log: list[Committed] = []
        self.contents: dict[str, bytes] = {}
        self.seq = 0

    def run(self, cmd: rq.Request, op: str = "write") -> None:
        past = self.replay(cmd.version).tree if isinstance(cmd, rq.RestorePath) else None
        ctx = Context(
            version=self.state.version + 1,
            at=T0 + timedelta(seconds=self.state.version),
            content=self.contents.get,
            past=past,
        )
        with self.state.tree.savepoint():
            decision = decide(self.state, cmd, ctx)
            assert decision.commits, cmd
            event = to_event(self.state, decision, ctx, op, Origin(f"req-{ctx.version}"))
        for change in decision.changes:
            if isinstance(change, PutFile) and (change.text is not None or change.data):
                self.contents[change.sha256] = (
                    change.text.encode() if change.text is not None else change.data or b""
                )
        payload = codec.encode(event)
        self.seq += 1
        digest = hashing.event_hash(payload)
        # as the writer does: the tree already holds the decision's changes
        evolve(self.state, event, digest, self.seq, tree=False)
        self.log.append(Committed(codec.decode_event(payload), digest, self.seq))

    def replay(self, upto: int | None = None) -> WorkspaceState:
        """Rebuild the state from the log alone (up to version ``upto``)."""
        state = WorkspaceState(self.state.tenant, self.state.workspace)
        for item in self.log:
            if upto is not None and item.event.version > upto:
                break
            evolve(state, item.event, item.hash, item.seq)
        return state
