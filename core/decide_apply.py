"""The decision on ``apply``: a set of changes made against a base version, each checked
for a conflict with what changed after it, committed together (or the conflicting ones
skipped: ``on_conflict``), and the paths a command left uncommitted in its sandbox recorded.

No I/O (``core.decide``); the steps on the simulated tree are ``core.decide_tree``'s. The
history an ``apply`` reads when the tree was loaded after its base is named by
``core.decide.needs``.
"""

from __future__ import annotations

from typing import Any

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import AnyChange, Remove, UncommittedPath
from contracts.paths import ancestors, normalize, normalize_file
from contracts.uncommitted import capped, clear
from core.decide_tree import (
    commit,
    ensure_parents,
    file_or_dir_target,
    make_dirs,
    payload,
    put_file,
)
from core.decision import Context, Decision
from core.evolve import WorkspaceState
from core.tree import Tree


def _apply_conflict(tree: Tree, item: rq.ApplyItem, path: str, base: int) -> str | None:
    """Why ``item`` conflicts with changes made after ``base``, or None."""
    if tree.last_change(path, base) > base:
        return "changed after base_version"
    for directory in ancestors(path):
        if tree.kind(directory) != "d" and tree.last_change(directory, base) > base:
            return f"parent {directory} changed after base_version"
    if isinstance(item, rq.DeleteChange) and tree.kind(path) == "d":
        prefix = path + "/"
        if any(v > base for p, v in tree.changed.items() if p.startswith(prefix)):
            return "contents changed after base_version"
    return None


def _apply_one(
    state: WorkspaceState, item: rq.ApplyItem, path: str, ctx: Context, changes: list[AnyChange]
) -> bool:
    tree = state.tree
    if isinstance(item, rq.PutChange):
        file_or_dir_target(tree, path)
        ensure_parents(state, path, ctx, changes, create=True)
        if item.blob is not None:
            if item.content is not None or item.data is not None:
                raise QuillError(
                    ErrorCode.INVALID_ARGUMENT, "Give one of content, data or blob", {"path": path}
                )
            data = ctx.content(item.blob)
            if data is None:
                raise QuillError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"Blob {item.blob} is not in WS_BLOBS: store it before the apply",
                    {"path": path, "blob": item.blob},
                )
        else:
            data = payload(item.content, item.data)
        put_file(state, path, data, ctx, changes, item.executable)
        return True
    if isinstance(item, rq.MkdirChange):
        make_dirs(state, path, ctx, changes)
        return True
    if tree.kind(path) is None:
        return False
    commit(tree, Remove(path=path), ctx, changes)
    return True


def _apply(state: WorkspaceState, cmd: rq.ApplyChanges, ctx: Context) -> Decision:
    tree = state.tree
    if cmd.base_version > state.version:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"base_version {cmd.base_version} is beyond the latest version {state.version}",
            {"base_version": cmd.base_version, "current_version": state.version},
        )
    if not cmd.changes and cmd.uncommitted is None:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Give at least one change")
    if len(cmd.changes) > state.limits.max_change_paths:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"Change set has {len(cmd.changes)} changes (limit {state.limits.max_change_paths})",
            {"max_change_paths": state.limits.max_change_paths},
        )
    items: list[tuple[rq.ApplyItem, str]] = []
    seen: dict[str, rq.ApplyItem] = {}
    for item in cmd.changes:
        path = normalize_file(item.path) if isinstance(item, rq.PutChange) else normalize(item.path)
        if path == "":
            raise QuillError(ErrorCode.INVALID_ARGUMENT, "A change cannot target the root")
        before = seen.get(path)
        replaced = isinstance(before, rq.DeleteChange) and not isinstance(item, rq.DeleteChange)
        if before is not None and (not replaced or path + "\0" in seen):
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT, f"Path appears twice in changes: {path}", {"path": path}
            )
        if replaced:
            seen[path + "\0"] = item  # a delete, then one put or mkdir: no third
        seen[path] = item
        items.append((item, path))
    conflicts: list[rp.ChangeConflict] = []
    for item, path in items:
        reason = _apply_conflict(tree, item, path, cmd.base_version)
        if reason is not None:
            conflicts.append(
                rp.ChangeConflict(path=path, reason=reason, changed_at=tree.changed.get(path))
            )
    if conflicts and cmd.on_conflict == "fail":
        raise QuillError(
            ErrorCode.CONFLICT,
            f"{len(conflicts)} change(s) conflict with changes made after version "
            f"{cmd.base_version}",
            {
                "current_version": state.version,
                "conflicts": [{"path": c.path, "reason": c.reason} for c in conflicts],
            },
        )
    skipped = {c.path for c in conflicts}
    changes: list[AnyChange] = []
    applied: list[str] = []
    for item, path in items:
        if path in skipped:
            continue
        try:
            with tree.savepoint():
                mark = len(changes)
                try:
                    done = _apply_one(state, item, path, ctx, changes)
                except QuillError:
                    del changes[mark:]
                    raise
        except QuillError as exc:
            if cmd.on_conflict == "fail":
                raise
            conflicts.append(rp.ChangeConflict(path=path, reason=exc.message, changed_at=None))
            continue
        if done:
            applied.append(path)
    recorded = _uncommitted(state, cmd, changes)
    result = rp.ChangesApplied(
        applied=applied,
        conflicts=conflicts,
        committed=bool(changes),
        uncommitted_recorded=recorded is not None,
    )
    return Decision(
        result=result, changes=changes, paths=applied, message=cmd.message, uncommitted=recorded
    )


def _uncommitted(
    state: WorkspaceState, cmd: rq.ApplyChanges, changes: list[AnyChange]
) -> list[UncommittedPath] | None:
    """The set of paths left uncommitted to record, when it is not the one recorded (a path
    these ``changes`` commit is not in it)."""
    if cmd.uncommitted is None:
        return None
    touched = {c.path for c in changes}
    wanted = capped([u for u in cmd.uncommitted if u.path not in touched])
    now = dict(state.uncommitted)
    clear(now, changes)
    if {u.path: u.reason for u in wanted} == {p: r.reason for p, r in now.items()}:
        return None
    return wanted


DECIDERS: dict[str, Any] = {"apply": _apply}
"""This module's decision, by op name (``core.decide.DECIDERS`` holds every command's)."""
