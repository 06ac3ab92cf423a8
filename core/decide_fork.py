"""The decision of ``fork`` (issue 33): a workspace made of another's history up to a
version, in one event that copies nothing (``workspace_forked``).

The event takes the version forked at (the fork's version N *is* the source's), the source's
chain hash at N as its ``prev_hash`` and its tree hash at N: the fork's chain continues the
source's prefix, and its first change is N + 1. The writer finds the source in its
projection (``Context.fork``); reads go through the fork's layers (``infra/store/layers.py``).
"""

from __future__ import annotations

from typing import Any

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError, no_version, no_workspace
from contracts.events import ForkBase, WorkspaceForked
from contracts.limits import DEFAULT_LIMITS
from core.decision import Context, Decision
from core.evolve import WorkspaceState

MAX_FORK_DEPTH = 16
"""Layers a fork may stand on (a fork of a fork of ...): every read of it asks each."""


def fork(state: WorkspaceState, cmd: rq.ForkWorkspace, ctx: Context) -> Decision:
    """Fork ``cmd.source`` at ``cmd.version`` (its latest) as this workspace.

    Raises:
        QuillError: ``ALREADY_EXISTS`` (this workspace exists, or is the source),
            ``WORKSPACE_NOT_FOUND`` (no source), ``INVALID_ARGUMENT`` (no such version, too
            deep), ``VERSION_TRIMMED`` (compacted away).
    """
    name = f"{state.tenant}/{state.workspace}"
    if cmd.source == state.workspace:
        raise QuillError(
            ErrorCode.ALREADY_EXISTS,
            f"A fork needs a name of its own: {name} is the workspace to fork",
            {"tenant": state.tenant, "workspace": state.workspace},
        )
    if state.exists:
        raise QuillError(
            ErrorCode.ALREADY_EXISTS,
            f"Workspace already exists: {name}",
            {"tenant": state.tenant, "workspace": state.workspace},
        )
    src = ctx.fork
    if src is None or not src.exists:
        raise no_workspace(state.tenant, cmd.source)
    at = src.at
    if at > src.version:
        raise no_version(at, src.version, f"{state.tenant}/{cmd.source}")
    if at < src.floor or src.hash_at is None or src.tree_hash_at is None:
        raise QuillError(
            ErrorCode.VERSION_TRIMMED,
            f"Version {at} of {state.tenant}/{cmd.source} was compacted away (max_versions); "
            f"fork at version {src.floor} or later",
            {"version": at, "floor": src.floor},
        )
    if len(src.lineage) + 1 > MAX_FORK_DEPTH:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"{state.tenant}/{cmd.source} is a fork {len(src.lineage)} deep: forks stand on "
            f"at most {MAX_FORK_DEPTH} layers",
            {"depth": len(src.lineage), "max_depth": MAX_FORK_DEPTH},
        )
    lineage = [ForkBase(workspace=cmd.source, version=at)]
    lineage += [ForkBase(workspace=w, version=v) for w, v in src.lineage]
    limits = src.limits or DEFAULT_LIMITS
    prev, tree = src.hash_at, src.tree_hash_at

    def make(common: dict[str, Any]) -> WorkspaceForked:
        common = {**common, "version": at, "prev_hash": prev, "tree_hash": tree}
        return WorkspaceForked(
            source=cmd.source,
            lineage=lineage,
            trust=src.trust,
            limits=limits,
            commands=src.commands,
            **common,
        )

    result = rp.Forked(
        workspace=name,
        source=f"{state.tenant}/{cmd.source}",
        version=at,
        trust=src.trust,
        limits=limits,
    )
    return Decision(result=result, make=make)
