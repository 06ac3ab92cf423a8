"""The decision of ``merge`` (issue 33): another workspace's changes since the merge base
merged into this one, as one event (op ``merge``, ``merged_from``), or a dry run's answer.

The writer gathers what the merge reads (``Context.merge``: the merge base, one ``Sides``
per path changed on either side since it, with base and theirs from the projection and ours
from this workspace's state, and the contents to read); ``core.merge.plan`` decides it per
path, in place when no text needs merging line by line, else in a worker
(``Context.compute``: a client can make diff3 slow). The plan's changes are then made here
as a write makes them: through ``put_file`` (the target's secret rules redact, its limits
count), parents first, each file continuing its file versions. So a merge is decided on
the target's state when it is decided, never on a stale plan (a dry run is only an answer).

The event records, besides what the merge took (``merged_from``), the paths where the merged
tree differs from theirs (``kept``): the merge back the other way reads them (where the
other side differs from its base) rather than everything either side changed since the
fork point (``services/writer/merges.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError, no_content
from contracts.events import MERGE_KEPT_MAX_BYTES, AnyChange, MakeDir, MergedFrom, Remove
from core import merge as merging
from core.decide_tree import commit, ensure_parents, make_dirs, put_file
from core.decision import Context, Decision, MergeSource
from core.diff3 import Labels
from core.evolve import WorkspaceState
from core.merge_types import Dir, Entry, File, MergePlan, PlanChange, Put, Sides, same
from core.rows import Node
from core.tree import FileNode, Tree

MERGE_BUDGET_S = 10.0
"""CPU a merge's line merges may take (in a worker); past it: "too large to merge here"."""
SHOWN_CHANGES = 1000
"""Changes a merge's answer lists (``changes_total`` counts them all)."""
SHOWN_CONFLICTS = 100
"""Conflicts a merge's answer (or its error's details) lists (``conflicts_total``)."""


def plan_merge(
    sides: list[Sides],
    strategy: str,
    contents: dict[str, bytes],
    labels: Labels,
    max_file_bytes: int,
    *,
    remaining: Callable[[], float],
) -> MergePlan:
    """``core.merge.plan`` over prefetched contents (what a worker process is handed)."""
    return merging.plan(
        sides,
        strategy,  # type: ignore[arg-type]  # plan checks it
        contents.get,
        labels=labels,
        max_file_bytes=max_file_bytes,
        remaining=remaining,
    )


def merge(state: WorkspaceState, cmd: rq.MergeWorkspace, ctx: Context) -> Decision:
    """Merge ``cmd.source`` into this workspace (or answer what it would do).

    Raises:
        QuillError: ``MERGE_CONFLICT`` (conflicts the strategy leaves: nothing committed),
            ``SIZE_LIMIT_EXCEEDED`` (the result over the target's limits), what
            ``core.merge.plan`` raises; the writer's gathering raised the rest
            (``NO_MERGE_BASE``, ``WORKSPACE_NOT_FOUND``, ``INVALID_ARGUMENT``).
    """
    src = ctx.merge
    if src is None:
        raise QuillError(ErrorCode.INTERNAL, "Merge without what it merges")
    limits = state.limits
    labels = Labels(
        ours=f"{state.workspace}@{state.version}",
        base=f"base@{src.base}",
        theirs=f"{src.name}@{src.version}",
    )
    args = (src.sides, cmd.strategy, src.contents, labels, limits.max_file_bytes)
    if merging.needs(src.sides):  # texts to merge line by line: in a worker
        plan = ctx.compute(plan_merge, *args, budget_s=MERGE_BUDGET_S)
    else:
        plan = plan_merge(*args, remaining=lambda: 1.0)
    conflicts = plan.conflicts[:SHOWN_CONFLICTS]
    if plan.refused is not None and not cmd.dry_run:
        raise QuillError(
            ErrorCode.MERGE_CONFLICT,
            f"Merge of {state.tenant}/{src.name}@{src.version} refused, nothing committed: "
            f"{plan.refused}",
            {
                "conflicts": [_plain(c) for c in conflicts],
                "conflicts_total": len(plan.conflicts),
                "base_version": src.base,
                "from_version": src.version,
            },
        )
    changes: list[AnyChange] = []
    if plan.refused is None:
        try:
            with state.tree.savepoint():
                _make(state, plan.changes, src, ctx, changes)
                if cmd.dry_run:
                    raise _Undo
        except _Undo:
            pass
    if len(changes) > limits.max_change_paths:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"Merge touches {len(changes)} paths (limit {limits.max_change_paths})",
            {"changes": len(changes), "max_change_paths": limits.max_change_paths},
        )
    shown = [_shown(c) for c in plan.changes]
    # conflicts decided (for ours) are recorded even when the merge changes no file, so that
    # it is the next merge's base and what it decided is not asked again (git's merge
    # commit); a merge that found nothing to take or decide records nothing
    decided = bool(changes) or bool(plan.conflicts)
    committed = decided and plan.refused is None and not cmd.dry_run
    result = rp.Merged(
        workspace=f"{state.tenant}/{state.workspace}",
        source=f"{state.tenant}/{src.name}",
        from_version=src.version,
        base_version=src.base,
        from_base=src.from_base,
        strategy=cmd.strategy,
        dry_run=cmd.dry_run,
        committed=committed,
        changes=shown[:SHOWN_CHANGES],
        changes_total=len(shown),
        conflicts=conflicts,
        conflicts_total=len(plan.conflicts),
        marked=plan.marked[:SHOWN_CHANGES],
        merged=plan.merged[:SHOWN_CHANGES],
        refused=plan.refused,
    )
    if not committed:
        return Decision(result=result)
    origin = MergedFrom(
        workspace=src.name,
        version=src.version,
        base_version=src.base,
        from_base=src.from_base,
        kept=kept(state.tree, src.sides, src.apart),
    )
    return Decision(
        result=result,
        changes=changes,
        paths=[c.path for c in plan.changes][:SHOWN_CHANGES],
        message=f"merge {src.name}@{src.version}",
        merged_from=origin,
    )


def kept(tree: Tree, sides: list[Sides], apart: list[str] | None) -> list[str] | None:
    """The paths where ``tree`` (the target after the merge) differs from theirs
    (``MergedFrom.kept``): of the paths the merge read, those where it is not theirs; of
    those ours had apart from the base it did not read (``MergeSource.apart``), all (neither
    side changed them since, so they still differ); elsewhere ours, base and theirs are
    alike and the merge changed nothing. None: ``apart`` unknown, or over
    ``MERGE_KEPT_MAX_BYTES``."""
    if apart is None:
        return None
    read = {r.path for r in sides}
    paths = {r.path for r in sides if not same(entry_at(tree, r.path), r.theirs)}
    paths.update(p for p in apart if p not in read)
    out = sorted(paths)
    if len(msgspec.json.encode(out)) > MERGE_KEPT_MAX_BYTES:
        return None
    return out


def entry_at(tree: Tree, path: str) -> Entry:
    """What ``tree`` has at ``path``, as a merge sees it."""
    node = tree.files.get(path)
    if node is not None:
        return file_entry(node)
    folder = tree.dirs.get(path)
    return Dir(version=folder.version) if folder is not None else None


def file_entry(node: Node | FileNode) -> File:
    """A file as the merge sees it, from a projection's row or a tree's node."""
    assert node.sha256 is not None
    return File(
        sha256=node.sha256,
        size=node.size,
        executable=node.executable,
        binary=node.binary,
        version=node.version,
    )


def _make(
    state: WorkspaceState,
    planned: list[PlanChange],
    src: MergeSource,
    ctx: Context,
    changes: list[AnyChange],
) -> None:
    """Make the plan's changes on the tree, as writes make them."""
    tree = state.tree
    for change in planned:
        path = change.path
        if isinstance(change, Remove):
            if tree.kind(path) is not None:
                commit(tree, Remove(path=path), ctx, changes)
        elif isinstance(change, MakeDir):
            make_dirs(state, path, ctx, changes)
        else:
            data = change.data if change.data is not None else _content(change, src, ctx)
            ensure_parents(state, path, ctx, changes, create=True)
            if tree.kind(path) == "d":  # the plan removed it first; a directory left is a bug
                raise QuillError(ErrorCode.INTERNAL, f"Merge put a file on the directory {path}")
            put_file(state, path, data, ctx, changes, change.executable)


def _content(change: Put, src: MergeSource, ctx: Context) -> bytes:
    data = src.contents.get(change.sha256)
    if data is None:
        data = ctx.content(change.sha256)
    if data is None:
        raise no_content(change.path, change.sha256)
    return data


def _shown(change: PlanChange) -> rp.MergeChange:
    if isinstance(change, Remove):
        return rp.MergeChange(path=change.path, kind="delete")
    if isinstance(change, MakeDir):
        return rp.MergeChange(path=change.path, kind="mkdir")
    return rp.MergeChange(path=change.path, kind="put", source=change.source, size=change.size)


def _plain(conflict: Any) -> Any:
    """A conflict as error details hold it (plain JSON)."""
    return msgspec.to_builtins(conflict)


class _Undo(Exception):
    """Raised inside a savepoint to undo a dry run's changes."""


DECIDERS: dict[str, Any] = {"merge": merge}
"""This module's decision, by op name (``core.decide.DECIDERS`` holds every command's)."""
