"""The steps file decisions take on the simulated tree: a put, a directory made, an etag
checked, a limit counted (``core.decide``: each decision applies its changes to ``state.tree``
as it goes, so later steps and later commands of one group commit see them).

No I/O, like every decider: what a step reads beyond the state comes through the ``Context``.
"""

from __future__ import annotations

from contracts import hashing
from contracts.errors import ErrorCode, QuillError
from contracts.events import AnyChange, MakeDir, PutFile
from contracts.paths import ancestors, display
from core.content import is_binary
from core.decision import Context
from core.evolve import WorkspaceState
from core.tree import FileNode, Tree, apply_change


def payload(content: str | None, data: bytes | None) -> bytes:
    if content is not None and data is not None:
        raise QuillError(ErrorCode.INVALID_ARGUMENT, "Give either content or data, not both")
    if content is not None:
        return content.encode("utf-8", "surrogatepass")
    if data is not None:
        return data
    raise QuillError(
        ErrorCode.INVALID_ARGUMENT, "content (UTF-8 text) or data (base64 bytes) is required"
    )


def check_etag(tree: Tree, path: str, if_match: str | None) -> None:
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


def ensure_parents(
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
        check_count(state, "d")
        commit(tree, MakeDir(path=directory), ctx, changes)


def commit(tree: Tree, change: AnyChange, ctx: Context, changes: list[AnyChange]) -> None:
    apply_change(tree, change, ctx.version, ctx.at)
    changes.append(change)


def check_count(state: WorkspaceState, kind: str) -> None:
    tree, limits = state.tree, state.limits
    count = len(tree.files) if kind == "f" else len(tree.dirs)
    if count >= limits.max_files:
        what = "files" if kind == "f" else "directories"
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"Workspace has reached its limit of {limits.max_files} {what}",
            {"limit": "max_files", "max_files": limits.max_files},
        )


def put_file(
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
        check_count(state, "f")
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
    commit(tree, change, ctx, changes)
    return change


def unchanged(
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


def file_or_dir_target(tree: Tree, path: str) -> None:
    if path == "" or tree.kind(path) == "d":
        raise QuillError(ErrorCode.NOT_A_FILE, f"Not a file: {display(path)}", {"path": path})


def make_dirs(state: WorkspaceState, path: str, ctx: Context, changes: list[AnyChange]) -> None:
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
            check_count(state, "d")
            commit(tree, MakeDir(path=directory), ctx, changes)
