"""Where a git action works in the workspace: its directory and its repository.

Paths in requests and results are workspace paths, like everywhere in Quill; these helpers
map them to the checkout on the host (symlinks resolved, never out of the workspace) and back.
"""

from __future__ import annotations

import os
from pathlib import Path

from contracts import paths
from contracts.errors import ErrorCode, QuillError


def within(root: str, path: str) -> str | None:
    """``path`` relative to ``root`` (both normalised workspace paths), or None outside it."""
    if not root:
        return path
    if path == root:
        return ""
    return path[len(root) + 1 :] if path.startswith(root + "/") else None


def resolve_dir(checkout: Path, workdir: str) -> Path | None:
    """The host directory of ``workdir``: None when absent.

    Raises:
        QuillError: ``ACCESS_DENIED`` when a symlink leads it out of the workspace.
    """
    root = checkout.resolve()
    try:
        target = (root / workdir).resolve()
    except (OSError, RuntimeError):  # a symlink loop
        raise QuillError(
            ErrorCode.FILE_NOT_FOUND, f"Cannot resolve {display(workdir)}", {"path": workdir}
        ) from None
    if not target.is_relative_to(root):
        raise QuillError(ErrorCode.ACCESS_DENIED, paths.ACCESS_DENIED_MESSAGE, {"path": workdir})
    return target if target.exists() else None


def find_repo(checkout: Path, workdir: str) -> tuple[str, str]:
    """(workdir, repository root) as workspace paths, symlinks resolved.

    Raises:
        QuillError: ``FILE_NOT_FOUND`` without a repository there.
    """
    root = checkout.resolve()
    target = resolve_dir(checkout, workdir)
    if target is not None and target.is_dir():
        for d in (target, *target.parents):
            if os.path.lexists(d / ".git"):
                return _rel(target, root), _rel(d, root)
            if d == root:
                break
    raise QuillError(
        ErrorCode.FILE_NOT_FOUND, f"Not a git repository: {display(workdir)}", {"path": workdir}
    )


def display(path: str) -> str:
    """A workspace path as agents see it."""
    return f"/workspace/{path}" if path else "/workspace"


def _rel(path: Path, root: Path) -> str:
    rel = path.relative_to(root).as_posix()
    return "" if rel == "." else rel
