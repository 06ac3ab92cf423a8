"""Decisions on one path or a subtree: write (create, overwrite, append), mkdir, delete,
move, edit, modify and restore. No I/O (``core.decide``); the steps they share on the
simulated tree are ``core.decide_tree``'s, the multi-path ``apply`` is ``core.decide_apply``.
"""

from __future__ import annotations

from typing import Any

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError, no_content, no_version
from contracts.events import AnyChange, MakeDir, PutFile, Remove
from contracts.paths import (
    check_name,
    is_within,
    normalize,
    normalize_existing,
    normalize_file,
    not_found,
    rebase,
)
from core.content import as_text, split_lines
from core.decide_tree import (
    check_count,
    check_etag,
    commit,
    ensure_parents,
    file_or_dir_target,
    make_dirs,
    payload,
    put_file,
    unchanged,
)
from core.decision import Context, Decision
from core.evolve import WorkspaceState
from core.matches import CLOSEST_BUDGET_S, multiple_matches, no_match
from core.textops import REGEX_BUDGET_S, modify_lines, regex_replaced
from core.tree import FileNode, etag_of

# ---------------------------------------------------------------- write


def _write(state: WorkspaceState, cmd: rq.WriteFile, ctx: Context) -> Decision:
    path = normalize_file(cmd.path)
    data = payload(cmd.content, cmd.data)
    tree = state.tree
    file_or_dir_target(tree, path)
    old = tree.files.get(path)
    if cmd.mode == "create" and old is not None:
        raise QuillError(ErrorCode.ALREADY_EXISTS, f"File already exists: {path}", {"path": path})
    check_etag(tree, path, cmd.if_match)
    written = len(data)
    if cmd.mode == "append" and old is not None:
        previous = ctx.content(old.sha256)
        if previous is None:
            raise no_content(path, old.sha256)
        data = previous + data
    previous_size = old.size if old is not None else None
    if old is not None and unchanged(state, path, data, ctx, old.executable) is not None:
        result = rp.FileWritten(
            path=path,
            bytes_written=written,
            size=old.size,
            file_version=old.file_version,
            etag=old.etag,
            created=False,
            modified=old.modified,
            previous_size=previous_size,
            committed=False,
        )
        return Decision(result=result)
    changes: list[AnyChange] = []
    ensure_parents(state, path, ctx, changes, cmd.create_parents)
    put = put_file(state, path, data, ctx, changes, executable=old.executable if old else False)
    result = rp.FileWritten(
        path=path,
        bytes_written=written,
        size=put.size,
        file_version=put.file_version,
        etag=etag_of(put.file_version),
        created=old is None,
        modified=ctx.at,
        previous_size=previous_size,
    )
    return Decision(result=result, changes=changes, paths=[path])


# ---------------------------------------------------------------- mkdir


def _mkdir(state: WorkspaceState, cmd: rq.MakeDirectory, ctx: Context) -> Decision:
    path = normalize(cmd.path)
    changes: list[AnyChange] = []
    make_dirs(state, path, ctx, changes)
    result = rp.DirectoryMade(path=path, created=[c.path for c in changes])
    return Decision(result=result, changes=changes, paths=[path])


# ---------------------------------------------------------------- delete


def _delete(state: WorkspaceState, cmd: rq.DeletePath, ctx: Context) -> Decision:
    path = normalize_existing(cmd.path)
    tree = state.tree
    if path == "":
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Cannot delete the workspace root")
    kind = tree.kind(path)
    if kind is None:
        if cmd.missing_ok and check_name(path) is None:
            return Decision(result=rp.PathDeleted(path=path, kind=None, deleted=0), paths=[path])
        raise not_found(path)
    check_etag(tree, path, cmd.if_match)
    if kind == "d" and tree.children.get(path) and not cmd.recursive:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Directory not empty: {path} (set recursive to delete it with its contents)",
            {"path": path, "reason": "not_empty"},
        )
    count = 1 + sum(1 for _ in tree.walk(path)) if kind == "d" else 1
    changes: list[AnyChange] = []
    commit(tree, Remove(path=path), ctx, changes)
    kind_name: rp.Kind = "directory" if kind == "d" else "file"
    result = rp.PathDeleted(path=path, kind=kind_name, deleted=count)
    return Decision(result=result, changes=changes, paths=[path])


# ---------------------------------------------------------------- move


def _move(state: WorkspaceState, cmd: rq.MovePath, ctx: Context) -> Decision:
    src, dst = normalize_existing(cmd.path), normalize(cmd.to)
    tree = state.tree
    if src == "" or dst == "":
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Cannot move the workspace root")
    kind = tree.kind(src)
    if kind is None:
        raise not_found(src)
    if kind == "f":
        normalize_file(cmd.to)  # a file is not moved to a name given as a directory (``d/``)
    if src == dst:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Source and destination are the same")
    if kind == "d" and is_within(dst, src):
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT, f"Cannot move {src} into itself", {"path": src, "to": dst}
        )
    check_etag(tree, src, cmd.if_match)
    target = tree.kind(dst)
    if target == "d" or (target == "f" and (kind == "d" or not cmd.overwrite)):
        raise QuillError(
            ErrorCode.ALREADY_EXISTS, f"Destination already exists: {dst}", {"path": dst}
        )
    moving = [src, *tree.walk(src)] if kind == "d" else [src]
    if len(moving) > state.limits.max_change_paths:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"Move touches {len(moving)} paths (limit {state.limits.max_change_paths})",
            {"paths": len(moving), "max_change_paths": state.limits.max_change_paths},
        )
    changes: list[AnyChange] = []
    ensure_parents(state, dst, ctx, changes, create=True)
    for old_path in moving:
        new_path = rebase(old_path, src, dst)
        node = tree.files.get(old_path)
        if node is None:
            commit(tree, MakeDir(path=new_path), ctx, changes)
            continue
        previous = tree.files.get(new_path)
        change = PutFile(
            path=new_path,
            sha256=node.sha256,
            size=node.size,
            file_version=tree.next_file_version(new_path),
            created=previous.created if previous else node.created,
            executable=node.executable,
            binary=node.binary,
            moved_from=old_path,
        )
        commit(tree, change, ctx, changes)
    commit(tree, Remove(path=src), ctx, changes)
    kind_name: rp.Kind = "directory" if kind == "d" else "file"
    result = rp.PathMoved(path=src, to=dst, kind=kind_name, moved=len(moving))
    return Decision(result=result, changes=changes, paths=[src, dst])


# ---------------------------------------------------------------- edit, modify


def _text_file(state: WorkspaceState, path: str, if_match: str | None, ctx: Context) -> str:
    """The current text of the file at ``path`` (checked to exist, match, and be text)."""
    tree = state.tree
    node = tree.files.get(path)
    if node is None:
        file_or_dir_target(tree, path)
        raise QuillError(ErrorCode.FILE_NOT_FOUND, f"File not found: {path}", {"path": path})
    check_etag(tree, path, if_match)
    data = ctx.content(node.sha256)
    text = as_text(data) if data is not None and not node.binary else None
    if data is None:
        raise no_content(path, node.sha256)
    if text is None:
        raise QuillError(
            ErrorCode.INVALID_ENCODING, "File contains invalid UTF-8 encoding", {"path": path}
        )
    return text


def _rewrite(
    state: WorkspaceState, path: str, text: str, ctx: Context
) -> tuple[FileNode | PutFile, list[AnyChange]]:
    """Put ``text`` at ``path``: the change, or the file as it is (no change) when ``text``
    is what it holds."""
    old = state.tree.files[path]
    data = text.encode()
    if unchanged(state, path, data, ctx, old.executable) is not None:
        return old, []
    changes: list[AnyChange] = []
    put = put_file(state, path, data, ctx, changes, executable=old.executable)
    return put, changes


def _edit(state: WorkspaceState, cmd: rq.EditFile, ctx: Context) -> Decision:
    path = normalize_file(cmd.path)
    text = _text_file(state, path, cmd.if_match, ctx)
    old, new = cmd.old_string, cmd.new_string
    if ctx.secrets:  # the text holds the secret's marker, never the secret
        old = ctx.secrets.redact(old)[0]
    if old == new:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "oldString and newString must be different")
    first = text.find(old)
    if first < 0:  # with the closest text (never applied), looked for off the writer's loop
        raise ctx.compute(no_match, path, text, old, budget_s=CLOSEST_BUDGET_S)
    if not cmd.replace_all and text.find(old, first + 1) >= 0:
        raise multiple_matches(path, text, old)  # with the line of each
    count = text.count(old) if cmd.replace_all else 1
    updated = text.replace(old, new, -1 if cmd.replace_all else 1)  # literal: no $1, no \1
    put, changes = _rewrite(state, path, updated, ctx)
    touched = max(old.count("\n"), new.count("\n")) + 1
    result = rp.FileEdited(
        path=path,
        replacements=count,
        lines_changed=touched * count,
        size=put.size,
        file_version=put.file_version,
        etag=etag_of(put.file_version),
        committed=bool(changes),
    )
    return Decision(result=result, changes=changes, paths=[path])


def _modify(state: WorkspaceState, cmd: rq.ModifyFile, ctx: Context) -> Decision:
    path = normalize_file(cmd.path)
    text = _text_file(state, path, cmd.if_match, ctx)
    lines = split_lines(text)
    line_ops = [op for op in cmd.operations if not isinstance(op, rq.RegexReplace)]
    updated = "".join(modify_lines(lines, line_ops))
    if text and not text.endswith("\n") and updated.endswith("\n"):
        updated = updated[:-1]  # keep a file that ended without a newline that way
    replacements = 0
    regexes = [op for op in cmd.operations if isinstance(op, rq.RegexReplace)]
    if regexes:  # a client's regular expressions: off the writer's loop
        updated, replacements = ctx.compute(
            regex_replaced, updated, regexes, budget_s=REGEX_BUDGET_S
        )
    put, changes = _rewrite(state, path, updated, ctx)
    result = rp.FileModified(
        path=path,
        operations=len(cmd.operations),
        replacements=replacements,
        lines_before=len(lines),
        lines_after=len(split_lines(updated)),
        size=put.size,
        file_version=put.file_version,
        etag=etag_of(put.file_version),
        committed=bool(changes),
    )
    return Decision(result=result, changes=changes, paths=[path])


# ---------------------------------------------------------------- restore


def _restore(state: WorkspaceState, cmd: rq.RestorePath, ctx: Context) -> Decision:
    if cmd.version > state.version:
        raise no_version(cmd.version, state.version)
    scope = normalize(cmd.path) if cmd.path is not None else ""  # ACCESS_DENIED outside
    if ctx.past is None:  # needs() names the past tree of every restore with a valid path
        raise QuillError(ErrorCode.INTERNAL, "Restore without the past tree")
    tree, past = state.tree, ctx.past
    now = [scope] if scope and tree.kind(scope) else []
    now += list(tree.walk(scope)) if tree.kind(scope) == "d" else []
    then = [scope] if scope and past.kind(scope) else []
    then += list(past.walk(scope)) if past.kind(scope) == "d" else []
    changes: list[AnyChange] = []
    gone: str | None = None
    for path in now:  # outermost first; a removed directory takes its contents
        if gone is not None and path.startswith(gone):
            continue
        if past.kind(path) != tree.kind(path):
            commit(tree, Remove(path=path), ctx, changes)
            gone = path + "/"
    if then:
        ensure_parents(state, then[0], ctx, changes, create=True)
    for path in then:
        if past.kind(path) == "d":
            if tree.kind(path) is None:
                check_count(state, "d")
                commit(tree, MakeDir(path=path), ctx, changes)
            continue
        was, node = past.files[path], tree.files.get(path)
        if node is not None and (node.sha256, node.executable) == (was.sha256, was.executable):
            continue
        if node is None:
            check_count(state, "f")
        commit(
            tree,
            PutFile(
                path=path,
                sha256=was.sha256,
                size=was.size,
                file_version=tree.next_file_version(path),
                created=node.created if node is not None else ctx.at,
                executable=was.executable,
                binary=was.binary,
            ),
            ctx,
            changes,
        )
    if len(changes) > state.limits.max_change_paths:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"Restore touches {len(changes)} paths (limit {state.limits.max_change_paths})",
        )
    touched = list(dict.fromkeys(c.path for c in changes))
    result = rp.Restored(
        path=scope if cmd.path is not None else None,
        version=cmd.version,
        changed=touched[:100],
        changed_total=len(touched),
        committed=bool(changes),
    )
    return Decision(result=result, changes=changes, paths=[scope] if scope else [])


DECIDERS: dict[str, Any] = {
    "write": _write,
    "mkdir": _mkdir,
    "delete": _delete,
    "move": _move,
    "edit": _edit,
    "modify": _modify,
    "restore": _restore,
}
"""This module's decisions, by op name (``core.decide.DECIDERS`` holds every command's)."""
