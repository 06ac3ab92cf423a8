"""Commands drawn for the property tests of the one fold (``core.evolve``), the writer's state
machine without NATS that decides them, and what states are compared by
(``tests/core/test_evolve_property.py``, ``tests/integration/test_evolve_property.py``). Pure,
as every module of ``tests/core`` (``test_pure.py``): what the tests against a real writer
share is ``tests/integration/real_writer.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from contracts import codec, hashing
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import QuillError
from contracts.events import (
    ApprovalRequested,
    CompactionManifest,
    PutFile,
    UncommittedPath,
    WorkspaceEvent,
)
from contracts.subjects import Origin
from core.decide import decide
from core.decision import Context, Decision, to_event
from core.evolve import WorkspaceState, evolve
from core.plan import Committed
from tests.core.build import T0

TENANT = "acme"
PATHS = ["a", "b", "d", "d/x", "d/y", "d/e/z"]
SESSIONS = [None, "s1", "s2"]

# ---------------------------------------------------------------- the commands drawn

text = st.text(alphabet="ab\n", min_size=0, max_size=6)
path = st.sampled_from(PATHS)
session = st.sampled_from(SESSIONS)
approval = st.sampled_from(["q1", "q2", "q3"])

both = [  # what both the pure and the real writer's tests draw
    st.tuples(st.just("write"), path, text, st.booleans(), session),
    st.tuples(st.just("mkdir"), path, session),
    st.tuples(st.just("delete"), path, session),
    st.tuples(st.just("move"), path, path, session),
    st.tuples(st.just("lock"), st.sampled_from(["s1", "s2"])),
    st.tuples(st.just("unlock"), st.sampled_from(["s1", "s2"])),
    st.tuples(st.just("trust"), st.sampled_from(["full", "restricted"]), st.booleans()),
    st.tuples(st.just("archive"), st.none() | st.just("done")),
    st.tuples(st.just("unarchive")),
    st.tuples(st.just("run_start"), st.sampled_from(["r1", "r2"])),
    st.tuples(st.just("run_end"), st.sampled_from(["r1", "r2"])),
    st.tuples(st.just("attach"), st.sampled_from(["o1", "o2"])),
    st.tuples(st.just("detach"), st.sampled_from(["o1", "o2"])),
    st.tuples(st.just("purge")),
    st.tuples(st.just("create"), st.sampled_from(["full", "restricted"])),
]


def applies(reasons: list[str]) -> st.SearchStrategy[tuple[Any, ...]]:
    """An executor's apply: a few puts, and the paths its sandbox left uncommitted (or None)."""
    return st.tuples(
        st.just("apply"),
        st.lists(st.tuples(path, text), max_size=3, unique_by=lambda p: p[0]),
        st.none() | st.lists(st.tuples(path, st.sampled_from(reasons)), max_size=2),
        session,
    )


actions = st.one_of(
    *both,
    applies(["symlink", "big"]),
    st.tuples(st.just("ask"), approval, st.sampled_from([2, 3600])),
    st.tuples(st.just("decide"), approval, st.booleans()),
)
COMPACT = ("compact",)
"""Compact what the projection holds (2 revisions a path kept): ``tests/integration``."""


def request(action: tuple[Any, ...], workspace: str, version: int) -> rq.Request | None:
    """The request an action sends (None: ``ask``, which the writer makes itself)."""
    match action:
        case ("write", p, body, append, _):
            return rq.WriteFile(path=p, content=body, mode="append" if append else "overwrite")
        case ("mkdir", p, _):
            return rq.MakeDirectory(path=p)
        case ("delete", p, _):
            return rq.DeletePath(path=p, recursive=True)
        case ("move", src, dst, _):
            return rq.MovePath(path=src, to=dst)
        case ("apply", puts, left, _):
            return rq.ApplyChanges(
                base_version=version,
                changes=[rq.PutChange(path=p, content=body) for p, body in puts],
                uncommitted=None
                if left is None
                else [UncommittedPath(path=f"{p}.out", reason=why) for p, why in left],
            )
        case ("lock", _):
            return rq.Lock(ttl_ms=3_600_000)
        case ("unlock", _):
            return rq.Unlock()
        case ("trust", trust, commands):
            return rq.SetTrust(trust=trust, commands=commands)
        case ("archive", reason):
            return rq.ArchiveWorkspace(reason=reason)
        case ("unarchive",):
            return rq.UnarchiveWorkspace()
        case ("run_start", run):
            return rq.RunStart(run=run)
        case ("run_end", run):
            return rq.RunEnd(run=run)
        case ("attach", other):
            return rq.Attach(uri=f"server:/{TENANT}/{other}")
        case ("detach", other):
            return rq.Detach(uri=f"server:/{TENANT}/{other}")
        case ("decide", aid, approve):
            return rq.Decide(approval_id=aid, approve=approve, reason="because")
        case ("purge",):
            return rq.PurgeWorkspace(confirm=f"{TENANT}/{workspace}")
        case ("create", trust):
            return rq.CreateWorkspace(trust=trust)
    return None


def session_of(action: tuple[Any, ...]) -> str | None:
    if action[0] in ("lock", "unlock"):
        return str(action[1])
    last = action[-1]
    return last if action[0] in ("write", "mkdir", "delete", "move", "apply") else None


# ---------------------------------------------------------------- the writer, without NATS


@dataclass
class Decided:
    """The writer's state machine without NATS: each command decided against the state the
    ones before it left, its event folded onto it as the writer folds it."""

    workspace: str
    state: WorkspaceState = field(init=False)
    log: list[Committed] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    contents: dict[str, bytes] = field(default_factory=dict)
    clock: int = 0

    def __post_init__(self) -> None:
        self.state = WorkspaceState(TENANT, self.workspace)

    def run(self, action: tuple[Any, ...]) -> None:
        state = self.state
        self.clock += 1
        at = T0 + timedelta(seconds=self.clock)
        version = state.version + 1
        request_id = f"req-{self.clock}"
        origin = Origin(request_id, "tester", session_of(action))
        ctx = Context(version=version, at=at, content=self.contents.get, origin=origin)
        try:
            with state.tree.savepoint():
                if action[0] == "ask":  # as the writer's actor parks a request
                    if not state.exists or state.controls.approval(action[1]) is not None:
                        return
                    decision = asked(action[1], at + timedelta(seconds=action[2]))
                    op = "approval_requested"
                else:
                    cmd = request(action, self.workspace, state.version)
                    assert cmd is not None
                    decision = decide(state, cmd, ctx)
                    op = str(action[0])
                if not decision.commits:
                    return
                event = to_event(state, decision, ctx, op, Origin(request_id, "tester"))
        except QuillError:
            return
        for change in decision.changes:
            if isinstance(change, PutFile) and change.text is not None:
                self.contents[change.sha256] = change.text.encode()
        self.commit(event)

    def commit(self, event: WorkspaceEvent, manifest: CompactionManifest | None = None) -> None:
        """Append ``event`` (decided against ``state``) and fold it as the writer does."""
        payload = codec.encode(event)
        digest = hashing.event_hash(payload)
        seq = len(self.log) + 1
        evolve(self.state, event, digest, seq, tree=False)  # the decider applied its changes
        self.payloads.append(payload)
        self.log.append(Committed(codec.decode_event(payload), digest, seq, manifest))


def asked(approval_id: str, expires: datetime) -> Decision:
    def make(common: dict[str, Any]) -> WorkspaceEvent:
        return ApprovalRequested(
            approval_id=approval_id, request_op="cmd.write", summary="write a",
            requested_by="tester", preview="--- a\n+++ a\n", digest="0" * 64,
            expires=expires, **common,
        )  # fmt: skip

    return Decision(result=rp.ApprovalList(pending=[]), make=make)


# ---------------------------------------------------------------- comparing states


def norm(s: WorkspaceState, *, seq: bool = True) -> dict[str, object]:
    """What must agree: the head, the live tree, the controls, the uncommitted paths (not
    the history of paths no longer live, which a loaded tree looks up when a decision needs
    it: ``Tree.partial``). ``seq`` False: not the stream sequence (a replay of payloads
    alone does not know it)."""
    if not s.exists:
        return {"exists": False}
    t = s.tree
    return {
        "head": (s.version, s.last_hash, s.trust, s.limits, s.created, s.updated),
        "seq": s.last_seq if seq else None,
        "tree_hash": (s.tree_hash, hashing.tree_hex(t.hash)),
        "floor": s.floor,
        "files": dict(t.files),
        "dirs": dict(t.dirs),
        "bytes": t.total_bytes,
        "controls": s.controls,
        "uncommitted": dict(s.uncommitted),
    }


def folded(log: list[Committed]) -> WorkspaceState:
    state = WorkspaceState(TENANT, log[0].event.workspace)
    for item in log:
        evolve(state, item.event, item.hash, item.seq, manifest=item.manifest)
    return state


def decided(script: list[tuple[Any, ...]]) -> Decided:
    """``script`` decided by the writer's state machine, its fold checked after each command."""
    writer = Decided("demo")
    for action in script:
        writer.run(action)
        assert norm(folded(writer.log)) == norm(writer.state), action
    return writer


def commands(first: str = "full") -> st.SearchStrategy[list[tuple[Any, ...]]]:
    return st.lists(actions, min_size=1, max_size=24).map(lambda a: [("create", first), *a])


real_actions = st.one_of(
    *both,
    applies(["symlink"]),
    st.tuples(st.just("deny"), st.integers(min_value=0, max_value=2)),
)
"""As ``actions``; approvals are asked by the writer (a mutation of a restricted workspace)
and denied (an approved one would be carried out after its answer, on the writer's time)."""
