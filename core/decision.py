"""What ``decide`` works with and produces: the ``Context`` handed in, the ``Decision`` made,
the ``Needs`` fetched before, and the event that records a decision.

**Expensive steps.** A step whose cost a client controls (``modify``'s regular expressions, a
refused ``edit``'s search for the closest text) is asked of ``Context.compute``, never run by
``decide`` itself. Where the context holds ``computed`` (the writer's), a step it has no result
for raises ``Expensive``: the writer runs it in a worker process (``infra/offload.py``), adds
the result, and decides again from the same state (the savepoint undid the first try). So
``decide`` stays pure and quick, and the work runs where it can be stopped. Without
``computed`` (the bridge, tests) a step runs in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import msgspec

from contracts import codec, hashing
from contracts import replies as rp
from contracts.errors import QuillError
from contracts.events import (
    AnyChange,
    ChangesCommitted,
    MergedFrom,
    UncommittedPath,
    WorkspaceCreated,
    WorkspaceEvent,
)
from contracts.limits import Limits
from contracts.subjects import Origin
from core.evolve import WorkspaceState
from core.merge_types import Sides
from core.secrets import NO_SECRETS, Secrets
from core.tree import Tree


@dataclass(frozen=True)
class Context:
    version: int
    """The version the event will get if the command commits."""
    at: datetime
    content: Callable[[str], bytes | None]
    """Content by sha256 (prefetched); None if unknown."""
    past: Tree | None = None
    """For ``restore``: the workspace (or the restored path) as it was, prefetched."""
    origin: Origin | None = None
    """Who asks (the session a lock belongs to, the run a command is part of)."""
    locate: Callable[[str, str, str], str | None] = lambda tenant, client, path: None
    """The workspace of ``tenant`` a bridge serves ``<client>:<path>`` as, if one does."""
    secrets: Secrets = NO_SECRETS
    """Values no content may keep (WSR-1): each becomes ``[REDACTED:<id>]``."""
    redacted: set[str] = field(default_factory=set)
    """Out: the ids of the secrets redacted (for the audit record)."""
    computed: list[Computed] | None = None
    """The expensive steps computed elsewhere, with their results (a ``QuillError`` when the
    step failed); None: ``compute`` runs a step in place."""
    fork: ForkSource | None = None
    """For ``fork``: the source as the writer's projection holds it."""
    forks: list[str] | None = None
    """For ``purge``: the workspaces forked from this one (their history is partly its)."""
    merge: MergeSource | None = None
    """For ``merge``: what it merges, gathered by the writer (``core/decide_merge.py``)."""

    def compute(self, fn: Callable[..., T], *args: Any, budget_s: float) -> T:
        """``fn(*args, remaining=...)``, a step a client can make expensive, within
        ``budget_s`` seconds.

        Raises:
            Expensive: ``computed`` is kept and holds no result for it yet.
            QuillError: the step's own error.
        """
        if self.computed is None:
            return fn(*args, remaining=lambda: budget_s)  # each search bounded, not the whole
        for done, given, result in self.computed:
            if done is fn and given == args:
                if isinstance(result, QuillError):
                    raise result
                return result  # type: ignore[no-any-return]
        raise Expensive(fn, args, budget_s)


@dataclass(frozen=True)
class ForkSource:
    """What forking a workspace needs of it (``core/decide_fork.py``), at the version asked
    (``at``; its latest when none was)."""

    name: str
    exists: bool
    version: int
    """Its latest version."""
    floor: int
    at: int
    """The version to fork at."""
    hash_at: str | None
    """The chain hash of its event at ``at`` (None: the projection holds no such event)."""
    tree_hash_at: str | None
    lineage: tuple[tuple[str, int], ...] = ()
    trust: str = "full"
    limits: Limits | None = None
    commands: bool = False


@dataclass(frozen=True)
class MergeSource:
    """What a merge reads (``core/decide_merge.py``), gathered by the writer: the workspace
    merged in, the merge base, and one ``Sides`` per path changed on either side since it."""

    name: str
    """The workspace merged in (same tenant)."""
    version: int
    """Its version merged."""
    base: int
    """The merge base, as the target's version."""
    from_base: int
    """The merge base, as the version of ``name``."""
    sides: list[Sides]
    contents: dict[str, bytes]
    """The contents the merge reads, by sha256: the texts to merge and theirs to put."""
    apart: list[str] | None = None
    """Paths where ours differs from the base that ``sides`` may leave out (what this
    workspace's merge of ``name`` that is the base kept, ``MergedFrom.kept``): ours there
    is the merge's result, still apart from theirs where not read. Empty at the fork point
    or when the base is a merge of ours into ``name``; None: unknown (not recorded), and so
    is what this merge keeps."""


T = TypeVar("T")
Computed = tuple[Callable[..., Any], tuple[Any, ...], Any]
"""A step (function, arguments) and its result."""


class Expensive(Exception):  # noqa: N818 - not an error: a request to run a step elsewhere
    """A step ``decide`` asked for that its caller has to compute (then decide again)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], budget_s: float) -> None:
        super().__init__(f"{fn.__qualname__} to compute")
        self.fn, self.args, self.budget_s = fn, args, budget_s


Maker = Callable[[dict[str, Any]], WorkspaceEvent]
"""Builds a control event from the fields every event has."""


@dataclass
class Decision:
    result: rp.Result
    changes: list[AnyChange] = field(default_factory=list)
    created: tuple[str, Limits] | None = None
    """``(trust, limits)`` when the command creates the workspace."""
    paths: list[str] = field(default_factory=list)
    message: str | None = None
    make: Maker | None = None
    """For a control command (run, lock, trust, approval): its event."""
    redacted: list[str] = field(default_factory=list)
    """Ids of the secrets its contents had (they were replaced)."""
    uncommitted: list[UncommittedPath] | None = None
    """For an executor's ``apply``: the paths its sandbox left uncommitted, when the set
    recorded changes (``contracts.uncommitted``)."""
    merged_from: MergedFrom | None = None
    """For a merge: what it took in (``ChangesCommitted.merged_from``)."""

    @property
    def commits(self) -> bool:
        return (
            bool(self.changes)
            or self.created is not None
            or self.make is not None
            or self.uncommitted is not None
            or self.merged_from is not None  # a merge that took theirs, changing no file
        )


def to_event(
    state: WorkspaceState, decision: Decision, ctx: Context, op: str, origin: Origin
) -> WorkspaceEvent:
    """The event recording ``decision`` (``state`` is the state after it)."""
    common: dict[str, Any] = {
        "tenant": state.tenant,
        "workspace": state.workspace,
        "version": ctx.version,
        "at": ctx.at,
        "op": op,
        "request_id": origin.request_id,
        "actor": origin.actor,
        "session": origin.session,
        "run": origin.run,
        "prev_hash": state.last_hash,
        "tree_hash": hashing.tree_hex(state.tree.hash),
        "result": msgspec.Raw(codec.encode(decision.result)),
    }
    if decision.created is not None:
        trust, limits = decision.created
        return WorkspaceCreated(trust=trust, limits=limits, **common)
    if decision.make is not None:
        return decision.make(common)
    return ChangesCommitted(
        changes=decision.changes,
        message=decision.message,
        uncommitted=decision.uncommitted,
        merged_from=decision.merged_from,
        **common,
    )


@dataclass(frozen=True)
class Needs:
    """What ``decide`` will read that is not in the in-memory state (the caller fetches it)."""

    contents: list[str]
    """sha256 of contents to have in ``Context.content``."""
    past: tuple[int, str] | None = None
    """``(version, path)`` of a past tree to put in ``Context.past``."""
    history: list[str] = field(default_factory=list)
    """Paths whose history (last file version, last change) the decision reads and the tree
    does not hold (``Tree.knows``): the caller looks them up and ``Tree.learn`` s them."""
    changes_below: list[tuple[str, int]] = field(default_factory=list)
    """``(directory, version)``: the decision asks whether anything below ``directory``
    changed after ``version``, which a tree loaded later holds only since its load: the
    caller adds what changed between (``Tree.changed``)."""
