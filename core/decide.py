"""Decisions: a command and a workspace's state → the changes to commit and the reply.

No I/O. ``decide`` simulates its changes on ``state.tree`` as it goes, so later steps of one
command and later commands of one group commit see them; the caller wraps each call in
``tree.savepoint()`` so that a refused command leaves no trace. What a command reads beyond the
in-memory state (the text an ``edit`` changes, the past tree a ``restore`` brings back) is
named by ``needs`` and handed in through the ``Context`` by the caller.

Size: one module because its decisions share the tree-simulation helpers (``_put``,
``_ensure_parents``, ``_check_etag``...) and one handler table the registry checks; the control
commands' decisions are apart (``decide_control``), and the text transformations (``textops``,
``matches``). Split further only with those helpers in a module of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts import hashing, ops
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import (
    AnyChange,
    MakeDir,
    PutFile,
    Remove,
    UncommittedPath,
)
from contracts.limits import effective_limits
from contracts.paths import (
    ancestors,
    check_name,
    display,
    is_within,
    normalize,
    normalize_existing,
    normalize_file,
    not_found,
    rebase,
)
from contracts.uncommitted import asked_path, capped, clear, lookup, not_committed
from core import decide_control as control
from core.content import as_text, is_binary, split_lines
from core.decision import Context, Decision, Needs
from core.evolve import WorkspaceState
from core.matches import CLOSEST_BUDGET_S, multiple_matches, no_match
from core.textops import REGEX_BUDGET_S, modify_lines, regex_replaced
from core.tree import FileNode, Tree, apply_change, etag_of


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
    if isinstance(cmd, rq.CreateWorkspace):
        return handler(state, cmd, ctx)
    if not state.exists:
        raise QuillError(
            ErrorCode.WORKSPACE_NOT_FOUND,
            f"Workspace not found: {state.tenant}/{state.workspace}",
            {"tenant": state.tenant, "workspace": state.workspace},
        )
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


# ---------------------------------------------------------------- helpers


def _payload(content: str | None, data: bytes | None) -> bytes:
    if content is not None and data is not None:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Give either content or data, not both")
    if content is not None:
        return content.encode("utf-8", "surrogatepass")
    if data is not None:
        return data
    raise QuillError(
        ErrorCode.INVALID_ARGUMENT, "content (UTF-8 text) or data (base64 bytes) is required"
    )


def _check_etag(tree: Tree, path: str, if_match: str | None) -> None:
    if if_match is None:
        return
    given = if_match.strip()
    weak = given.startswith("W/")  # If-Match compares strongly (RFC 9110): never a match
    wanted = given.removeprefix("W/").strip('"')
    node = tree.files.get(path)
    current = node.etag if node is not None else None
    if wanted == "*" and node is not None:
        return
    if weak or wanted != current:
        raise QuillError(
            ErrorCode.CONFLICT,
            f"Etag mismatch for {display(path)}: expected {given}, current {current}"
            + (" (a weak etag never matches: if_match compares strongly)" if weak else ""),
            {
                "path": path,
                "current_etag": current,
                "current_file_version": node.file_version if node else None,
            },
        )


def _ensure_parents(
    state: WorkspaceState, path: str, ctx: Context, changes: list[AnyChange], create: bool
) -> None:
    tree = state.tree
    for directory in ancestors(path):
        kind = tree.kind(directory)
        if kind == "d":
            continue
        if kind == "f":
            raise QuillError(
                ErrorCode.NOT_A_DIRECTORY, f"Not a directory: {directory}", {"path": directory}
            )
        if not create:
            raise QuillError(
                ErrorCode.FILE_NOT_FOUND,
                f"Parent directory not found: {directory}",
                {"path": directory},
            )
        _check_count(state, "d")
        _commit(tree, MakeDir(path=directory), ctx, changes)


def _commit(tree: Tree, change: AnyChange, ctx: Context, changes: list[AnyChange]) -> None:
    apply_change(tree, change, ctx.version, ctx.at)
    changes.append(change)


def _check_count(state: WorkspaceState, kind: str) -> None:
    tree, limits = state.tree, state.limits
    count = len(tree.files) if kind == "f" else len(tree.dirs)
    if count >= limits.max_files:
        what = "files" if kind == "f" else "directories"
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"Workspace has reached its limit of {limits.max_files} {what}",
            {"limit": "max_files", "max_files": limits.max_files},
        )


def _put(
    state: WorkspaceState,
    path: str,
    data: bytes,
    ctx: Context,
    changes: list[AnyChange],
    executable: bool = False,
) -> PutFile:
    tree, limits = state.tree, state.limits
    if ctx.secrets:
        data, ids = ctx.secrets.redact_bytes(data)
        ctx.redacted.update(ids)
    if len(data) > limits.max_file_bytes:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"File too large: {len(data)} bytes (limit {limits.max_file_bytes})",
            {"path": path, "size": len(data), "max_file_bytes": limits.max_file_bytes},
        )
    old = tree.files.get(path)
    if old is None:
        _check_count(state, "f")
    binary = is_binary(data)
    change = PutFile(
        path=path,
        sha256=hashing.content_sha256(data),
        size=len(data),
        file_version=tree.next_file_version(path),
        created=old.created if old is not None else ctx.at,
        executable=executable,
        binary=binary,
        text=None if binary else data.decode("utf-8"),
        data=data if binary else None,
    )
    _commit(tree, change, ctx, changes)
    return change


def _unchanged(
    state: WorkspaceState, path: str, data: bytes, ctx: Context, executable: bool
) -> FileNode | None:
    """The file at ``path`` when putting ``data`` there would change nothing (the same
    content, as stored: redacted, and the same mode), else None. Such a put makes no
    version: a change that changes nothing is not one."""
    old = state.tree.files.get(path)
    if old is None or old.executable != executable:
        return None
    if ctx.secrets:
        data, ids = ctx.secrets.redact_bytes(data)
        if len(data) == old.size and hashing.content_sha256(data) == old.sha256:
            ctx.redacted.update(ids)
            return old
        return None
    if len(data) != old.size or hashing.content_sha256(data) != old.sha256:
        return None
    return old


def _file_or_dir_target(tree: Tree, path: str) -> None:
    if path == "" or tree.kind(path) == "d":
        raise QuillError(ErrorCode.NOT_A_FILE, f"Not a file: {display(path)}", {"path": path})


# ---------------------------------------------------------------- write


def _write(state: WorkspaceState, cmd: rq.WriteFile, ctx: Context) -> Decision:
    path = normalize_file(cmd.path)
    data = _payload(cmd.content, cmd.data)
    tree = state.tree
    _file_or_dir_target(tree, path)
    old = tree.files.get(path)
    if cmd.mode == "create" and old is not None:
        raise QuillError(ErrorCode.ALREADY_EXISTS, f"File already exists: {path}", {"path": path})
    _check_etag(tree, path, cmd.if_match)
    written = len(data)
    if cmd.mode == "append" and old is not None:
        previous = ctx.content(old.sha256)
        if previous is None:
            raise QuillError(ErrorCode.UNAVAILABLE, f"Content of {path} is not available")
        data = previous + data
    previous_size = old.size if old is not None else None
    if old is not None and _unchanged(state, path, data, ctx, old.executable) is not None:
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
    _ensure_parents(state, path, ctx, changes, cmd.create_parents)
    put = _put(state, path, data, ctx, changes, executable=old.executable if old else False)
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


def _make_dirs(state: WorkspaceState, path: str, ctx: Context, changes: list[AnyChange]) -> None:
    """``mkdir -p path``: create ``path`` and its missing parents."""
    tree = state.tree
    for directory in [*ancestors(path), path] if path else []:
        kind = tree.kind(directory)
        if kind == "f":
            raise QuillError(
                ErrorCode.NOT_A_DIRECTORY,
                f"Path exists but is not a directory: {directory}",
                {"path": directory},
            )
        if kind is None:
            _check_count(state, "d")
            _commit(tree, MakeDir(path=directory), ctx, changes)


def _mkdir(state: WorkspaceState, cmd: rq.MakeDirectory, ctx: Context) -> Decision:
    path = normalize(cmd.path)
    changes: list[AnyChange] = []
    _make_dirs(state, path, ctx, changes)
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
    _check_etag(tree, path, cmd.if_match)
    if kind == "d" and tree.children.get(path) and not cmd.recursive:
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Directory not empty: {path} (set recursive to delete it with its contents)",
            {"path": path, "reason": "not_empty"},
        )
    count = 1 + sum(1 for _ in tree.walk(path)) if kind == "d" else 1
    changes: list[AnyChange] = []
    _commit(tree, Remove(path=path), ctx, changes)
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
    _check_etag(tree, src, cmd.if_match)
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
    _ensure_parents(state, dst, ctx, changes, create=True)
    for old_path in moving:
        new_path = rebase(old_path, src, dst)
        node = tree.files.get(old_path)
        if node is None:
            _commit(tree, MakeDir(path=new_path), ctx, changes)
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
        _commit(tree, change, ctx, changes)
    _commit(tree, Remove(path=src), ctx, changes)
    kind_name: rp.Kind = "directory" if kind == "d" else "file"
    result = rp.PathMoved(path=src, to=dst, kind=kind_name, moved=len(moving))
    return Decision(result=result, changes=changes, paths=[src, dst])


# ---------------------------------------------------------------- apply


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
        _file_or_dir_target(tree, path)
        _ensure_parents(state, path, ctx, changes, create=True)
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
            data = _payload(item.content, item.data)
        _put(state, path, data, ctx, changes, item.executable)
        return True
    if isinstance(item, rq.MkdirChange):
        _make_dirs(state, path, ctx, changes)
        return True
    if tree.kind(path) is None:
        return False
    _commit(tree, Remove(path=path), ctx, changes)
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


# ---------------------------------------------------------------- edit, modify


def _text_file(state: WorkspaceState, path: str, if_match: str | None, ctx: Context) -> str:
    """The current text of the file at ``path`` (checked to exist, match, and be text)."""
    tree = state.tree
    node = tree.files.get(path)
    if node is None:
        _file_or_dir_target(tree, path)
        raise QuillError(ErrorCode.FILE_NOT_FOUND, f"File not found: {path}", {"path": path})
    _check_etag(tree, path, if_match)
    data = ctx.content(node.sha256)
    text = as_text(data) if data is not None and not node.binary else None
    if data is None:
        raise QuillError(ErrorCode.UNAVAILABLE, f"Content of {path} is not available")
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
    if _unchanged(state, path, data, ctx, old.executable) is not None:
        return old, []
    changes: list[AnyChange] = []
    put = _put(state, path, data, ctx, changes, executable=old.executable)
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
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT,
            f"Version {cmd.version} does not exist (the latest is {state.version})",
            {"version": cmd.version, "latest_version": state.version},
        )
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
            _commit(tree, Remove(path=path), ctx, changes)
            gone = path + "/"
    if then:
        _ensure_parents(state, then[0], ctx, changes, create=True)
    for path in then:
        if past.kind(path) == "d":
            if tree.kind(path) is None:
                _check_count(state, "d")
                _commit(tree, MakeDir(path=path), ctx, changes)
            continue
        was, node = past.files[path], tree.files.get(path)
        if node is not None and (node.sha256, node.executable) == (was.sha256, was.executable):
            continue
        if node is None:
            _check_count(state, "f")
        _commit(
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


DECIDERS: dict[str, Callable[[WorkspaceState, Any, Context], Decision]] = ops.table(
    "cmd",
    {
        "create": lambda state, cmd, ctx: _create(state, cmd),
        "write": _write,
        "mkdir": _mkdir,
        "delete": _delete,
        "move": _move,
        "apply": _apply,
        "edit": _edit,
        "modify": _modify,
        "restore": _restore,
        **control.DECIDERS,
    },
)
"""Each command's decision, by op name: the registry (``contracts/ops.py``) checks it is whole."""
