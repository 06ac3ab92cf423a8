"""Decisions: a command and a workspace's state → the changes to commit and the reply.

No I/O. ``decide`` simulates its changes on ``state.tree`` as it goes, so later steps of one
command and later commands of one group commit see them; the caller wraps each call in
``tree.savepoint()`` so that a refused command leaves no trace. What a command reads beyond the
in-memory state (the text an ``edit`` changes, the past tree a ``restore`` brings back) is
named by ``needs`` and handed in through the ``Context`` by the caller.

The deciders are in rooms: this module takes a command to its decider (``decide``: the
workspace exists, the expected version, the gate of ``decide_control``) and names what it
reads (``needs``); ``decide_files`` decides the commands on one path or a subtree (write,
mkdir, delete, move, edit, modify, restore), ``decide_apply`` the multi-path ``apply``,
``decide_control`` the control commands; the steps they share on the simulated tree
(``put_file``, ``ensure_parents``, ``check_etag``...) are ``decide_tree``'s, the text
transformations ``textops`` and ``matches``. ``DECIDERS`` joins their tables into the one the
registry checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts import ops
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError, no_workspace
from contracts.limits import effective_limits
from contracts.paths import (
    ancestors,
    is_within,
    normalize,
    normalize_existing,
    normalize_file,
    rebase,
)
from contracts.uncommitted import asked_path, lookup, not_committed
from core import decide_apply as applying
from core import decide_control as control
from core import decide_files as files
from core import decide_fork as forking
from core import decide_merge as merging
from core.decision import Context, Decision, Needs
from core.evolve import WorkspaceState
from core.tree import Tree


def needs(state: WorkspaceState, cmd: rq.Request, past: Tree | None = None) -> Needs:
    """What deciding ``cmd`` reads beyond ``state``: contents, a past tree, and the history
    of paths ``state.tree`` does not hold (a tree loaded from a projection holds the live
    paths' only: ``Tree.partial``). ``past``: a restore's past tree, once fetched (the
    history of the files it brings back is named then)."""
    tree = state.tree
    try:
        if isinstance(cmd, rq.RestorePath):
            scope = normalize(cmd.path) if cmd.path is not None else ""
            named = [p for p in past.files if not tree.knows(p)] if past is not None else []
            return Needs([], (cmd.version, scope), named)
        if isinstance(cmd, rq.ApplyChanges):
            blobs = [c.blob for c in cmd.changes if isinstance(c, rq.PutChange) and c.blob]
            return Needs(blobs, None, *_apply_history(tree, cmd))
        if isinstance(cmd, rq.WriteFile):
            path = normalize_file(cmd.path)
            node = tree.files.get(path) if cmd.mode == "append" else None
            return Needs([node.sha256] if node else [], None, _unknown(tree, [path]))
        if isinstance(cmd, rq.EditFile | rq.ModifyFile):
            node = tree.files.get(normalize(cmd.path))
            return Needs([node.sha256] if node is not None else [])
        if isinstance(cmd, rq.MovePath):
            src, dst = normalize_existing(cmd.path), normalize(cmd.to)
            if tree.kind(src) is None or src == "" or dst == "" or is_within(dst, src):
                return Needs([])
            moving = [src, *tree.walk(src)] if tree.kind(src) == "d" else [src]
            return Needs([], None, _unknown(tree, [rebase(p, src, dst) for p in moving]))
    except QuillError:
        pass  # decide reports the bad path
    return Needs([])


def _unknown(tree: Tree, paths: list[str]) -> list[str]:
    return [p for p in dict.fromkeys(paths) if not tree.knows(p)]


def _apply_history(tree: Tree, cmd: rq.ApplyChanges) -> tuple[list[str], list[tuple[str, int]]]:
    """The history an ``apply`` reads: its puts' file versions; when its base precedes the
    tree's load, the last change of its paths and their parents, and what changed below
    the directories it deletes."""
    if not tree.partial:
        return [], []
    named: list[str] = []
    below: list[tuple[str, int]] = []
    base = cmd.base_version
    for item in cmd.changes:
        put = isinstance(item, rq.PutChange)
        path = normalize_file(item.path) if put else normalize(item.path)
        if put:
            named.append(path)
        if base < tree.loaded_at:
            named += [p for p in (path, *ancestors(path)) if not tree.knows_change(p, base)]
            if isinstance(item, rq.DeleteChange) and tree.kind(path) == "d":
                below.append((path, base))
    return _unknown(tree, named), below


def decide(state: WorkspaceState, cmd: rq.Request, ctx: Context) -> Decision:
    """Decide ``cmd`` against ``state``.

    Raises:
        QuillError: the command is refused; nothing is committed.
    """
    spec = ops.BY_REQUEST.get(type(cmd))
    if spec is None or spec.kind != "cmd":
        raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Not a command: {type(cmd).__name__}")
    handler = DECIDERS[spec.name]
    if isinstance(cmd, rq.CreateWorkspace | rq.ForkWorkspace):
        return handler(state, cmd, ctx)
    if not state.exists:
        raise no_workspace(state.tenant, state.workspace)
    if isinstance(cmd, rq.Command) and cmd.expected_version is not None:
        if cmd.expected_version != state.version:
            raise QuillError(
                ErrorCode.CONFLICT,
                f"Workspace is at version {state.version}, not {cmd.expected_version}",
                {"current_version": state.version, "expected_version": cmd.expected_version},
            )
    control.gate(state, cmd, ctx)
    try:
        return handler(state, cmd, ctx)
    except QuillError as exc:
        raise _explained(state, exc) from None


def _explained(state: WorkspaceState, error: QuillError) -> QuillError:
    """``error``, a path not found or a name refused, saying why when a command left that
    path (or a parent of it) in its sandbox uncommitted (``contracts.uncommitted``)."""
    path = asked_path(error) if state.uncommitted else None
    if path is None or state.tree.kind(path) is not None:
        return error
    found = lookup(state.uncommitted, path)
    return error if found is None else not_committed(error, path, *found)


# ---------------------------------------------------------------- create


def _create(state: WorkspaceState, cmd: rq.CreateWorkspace) -> Decision:
    if state.exists:
        if not cmd.exist_ok:
            raise QuillError(
                ErrorCode.ALREADY_EXISTS,
                f"Workspace already exists: {state.tenant}/{state.workspace}",
                {"tenant": state.tenant, "workspace": state.workspace},
            )
        result = rp.WorkspaceCreatedResult(
            tenant=state.tenant,
            workspace=state.workspace,
            created=False,
            trust=state.trust,
            limits=state.limits,
        )
        return Decision(result=result)
    limits = effective_limits(cmd.limits)
    result = rp.WorkspaceCreatedResult(
        tenant=state.tenant,
        workspace=state.workspace,
        created=True,
        trust=cmd.trust,
        limits=limits,
    )
    return Decision(result=result, created=(cmd.trust, limits))


DECIDERS: dict[str, Callable[[WorkspaceState, Any, Context], Decision]] = ops.table(
    "cmd",
    {
        "create": lambda state, cmd, ctx: _create(state, cmd),
        **files.DECIDERS,
        **applying.DECIDERS,
        **control.DECIDERS,
        "fork": forking.fork,
        **merging.DECIDERS,
    },
)
"""Each command's decision, by op name: the registry (``contracts/ops.py``) checks it is whole."""
