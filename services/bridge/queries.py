"""Queries on a local folder: the reader's answers (``core.answers`` and
``finding``), over the folder's entries instead of a projection.

Every function here blocks (it walks and reads the disk): the handlers call it in a thread. A
folder has only its present: a query as of an older version, and ``history``, ``diff`` and
``events``, are ``INVALID_ARGUMENT`` ("not kept for a local workspace").
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError, no_version
from contracts.limits import DEFAULT_EXCLUSIONS
from contracts.paths import ROOT_DIR, normalize
from core import answers, finding
from core.content import as_text
from core.globs import relative
from core.rows import Node
from services.bridge.folder import Folder

NOT_KEPT = ("history", "diff", "events")
"""Queries about the past: a folder keeps none."""
COMMANDS = ("create", "write", "mkdir", "move", "apply", "edit", "modify", "delete")
"""The commands a bridge serves (``restore`` needs a past: not kept)."""
CAPABILITIES = sorted(
    [f"cmd.{op}" for op in COMMANDS]
    + [f"qry.{op}" for op in ("read", "read_bytes", "list", "stat", "glob", "grep", "explore")]
    + ["qry.info", "exec.run", "exec.git"]
)


def not_kept(what: str, uri: str) -> QuillError:
    return QuillError(
        ErrorCode.INVALID_ARGUMENT,
        f"{what} is not kept for a local workspace ({uri})",
        {"uri": uri},
    )


def page(
    nodes: list[Node], recursive: bool, after: tuple[str, str] | None, limit: int
) -> list[Node]:
    """Up to ``limit`` of ``nodes`` after the cursor ``after``, in ``list`` order: directories
    first, then by path; recursive, by path (the order of ``ReadModel.page``)."""
    if recursive:
        ordered = sorted(nodes, key=lambda n: n.path)
        if after is not None:
            ordered = [n for n in ordered if n.path > after[1]]
    else:
        ordered = sorted(nodes, key=lambda n: (n.kind == "f", n.path))
        if after is not None:
            mark = (after[0] == "f", after[1])
            ordered = [n for n in ordered if (n.kind == "f", n.path) > mark]
    return ordered[:limit]


class LocalQueries:
    """The queries of one attached folder."""

    def __init__(self, folder: Folder, tenant: str, workspace: str, trust: str, uri: str):
        self.folder, self.uri = folder, uri
        self.tenant, self.workspace, self.trust = tenant, workspace, trust

    def ops(self) -> dict[str, Callable[[Any], msgspec.Struct]]:
        return {
            "read": self.read,
            "read_bytes": self.read_bytes,
            "list": self.list_directory,
            "stat": self.stat,
            "glob": self.glob,
            "grep": self.grep,
            "explore": self.explore,
            "info": self.info,
        }

    def check_version(self, req: rq.Query | rq.Execution) -> None:
        """A query answers the folder as it is now: ``version`` must be the current one
        (``min_version`` is always met: nothing is newer than the folder itself).

        Raises:
            QuillError: ``INVALID_ARGUMENT`` for any other version.
        """
        current = self.folder.version
        if req.version is None or req.version == current:
            return
        if req.version > current:
            raise no_version(req.version, current)
        raise not_kept(f"Version {req.version}", self.uri)

    # ------------------------------------------------------------------ helpers
    def _found(self, path: str, what: str = "File") -> tuple[Node, Any]:
        real = self.folder.locate(path)
        node = self.folder.node(path, real)
        if node is None:
            raise answers.missing(path, what)
        return node, real

    def _scope(self, path: str) -> tuple[str, Any]:
        scope = normalize(path)
        node, real = self._found(scope, "Directory")
        if node.kind != "d":
            raise answers.not_a_directory(scope)
        return scope, real

    # ------------------------------------------------------------------ ops
    def read(self, req: rq.ReadFile) -> rp.FileContent:
        path = normalize(req.path)
        node, real = self._found(path)
        limits = self.folder.limits
        if node.kind == "d":
            children = self.folder.walk(path, real, recursive=False)
            first = page(children, False, None, limits.max_directory_entries)
            return answers.directory_content(path, node.modified, first, len(children))
        data = self.folder.read(path, real)
        node = dataclasses.replace(node, binary=as_text(data) is None)
        return answers.file_content(path, node, data, req, limits)

    def read_bytes(self, req: rq.ReadBytes) -> rp.FileBytes:
        path = normalize(req.path)
        node, real = self._found(path)
        if node.kind != "f":
            raise answers.not_a_file(path)
        chunk = self.folder.read_range(
            real, req.offset, answers.read_length(req, self.folder.limits)
        )
        return answers.file_bytes(path, node, chunk, req.offset)

    def list_directory(self, req: rq.ListDirectory) -> rp.Listing:
        path = normalize(req.path)
        node, real = self._found(path, "Directory")
        if node.kind != "d":
            raise answers.not_a_directory(path)
        most = self.folder.limits.max_directory_entries
        limit = min(req.limit or most, most)
        after = answers.cursor_of(req.after) if req.after is not None else None
        start = f"{path}/{req.prefix}" if path else req.prefix
        nodes = [
            n
            for n in self.folder.walk(path, real, recursive=req.recursive)
            if (req.kind == "any" or n.kind == req.kind[0]) and n.path.startswith(start)
        ]
        return answers.listing(
            path, page(nodes, req.recursive, after, limit + 1), limit, len(nodes)
        )

    def stat(self, req: rq.StatPath) -> rp.FileInfo:
        path = normalize(req.path)
        node, real = self._found(path, "Path")
        if node.kind == "d":
            return answers.file_info(path, node, len(self.folder.walk(path, real, recursive=False)))
        sha256, binary = self.folder.digest(real, node.size)
        return answers.file_info(
            path, dataclasses.replace(node, sha256=sha256, binary=binary), None
        )

    def glob(self, req: rq.GlobQuery) -> rp.Matches:
        scope, real = self._scope(req.path)
        matcher = finding.glob_matcher(req.pattern)
        patterns = finding.exclusions(req.exclude)
        nodes = self.folder.walk(scope, real, prune=patterns.match_dir)
        return finding.glob_result(
            scope,
            req,
            matcher,
            finding.without_excluded(nodes, scope, patterns),
            self.folder.limits,
        )

    def explore(self, req: rq.ExploreQuery) -> rp.Tree:
        scope, real = self._scope(req.path)
        patterns = finding.exclusions(req.exclude)
        depth = req.max_depth if req.recursive else 1
        nodes = self.folder.walk(scope, real, prune=patterns.match_dir, max_depth=depth)
        return finding.explore_result(
            scope, req, finding.without_excluded(nodes, scope, patterns), self.folder.limits
        )

    def grep(self, req: rq.GrepQuery) -> rp.GrepResult:
        scope = normalize(req.path)
        node, real = self._found(scope, "Path")
        plan = finding.GrepPlan.of(req, self.folder.limits)
        if node.kind == "f":  # the file named, as grep FILE: include/exclude choose in a tree
            files = [node]
        else:
            files = [
                n
                for n in self.folder.walk(scope, real)
                if n.kind == "f" and plan.selects(relative(n.path, scope))
            ]
        deadline = time.monotonic() + finding.GREP_BUDGET_S
        return plan.search(
            self._texts(files, real, scope), remaining=lambda: deadline - time.monotonic()
        )

    def _texts(self, files: list[Node], real: Any, scope: str) -> Iterator[tuple[str, str]]:
        """``(path, text)`` of the text files among ``files`` (binary ones and files over
        ``max_file_bytes`` are not searched, as a server workspace holds neither)."""
        for node in files:
            if node.size > self.folder.limits.max_file_bytes:
                continue
            location = Path(os.path.join(real, relative(node.path, scope)))
            try:
                with self.folder.open_file(location) as f:  # through no link
                    text = as_text(f.read())
            except OSError:
                continue
            if text is not None:
                yield node.path, text

    def info(self, req: rq.WorkspaceInfoQuery) -> rp.WorkspaceInfo:
        everything = self.folder.walk("", self.folder.root)
        files = [n for n in everything if n.kind == "f"]
        return rp.WorkspaceInfo(
            tenant=self.tenant,
            workspace=self.workspace,
            root=ROOT_DIR,
            version=self.folder.version,
            created=self.folder.attached,
            updated=self.folder.updated,
            trust=self.trust,
            limits=self.folder.limits,
            default_exclusions=list(DEFAULT_EXCLUSIONS),
            capabilities=CAPABILITIES,
            files=len(files),
            directories=len(everything) - len(files),
            total_bytes=sum(n.size for n in files),
            tree_hash="",
            last_hash="",
        )
