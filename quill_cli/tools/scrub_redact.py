"""Redaction of one workspace's log for ``quill scrub`` (``scrub.py``): events, contents,
paths, and the manifest of a compaction the log starts at.

Every string an event holds is redacted with the registry (``[REDACTED:<id>]``); a content
that changes gets its new sha256 and size, and every string naming the old sha256 (a move's
put, a stored result) names the new one; a path that changes must stay a valid path and must
not become another path. A compaction's manifest is redacted the same way, its rows keeping
their event hashes (the events they stand for are purged: there is nothing to re-hash, and a
hash does not hold the secret) and their tree hashes recomputed from the redacted rows for
every version it keeps whole.
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec

from contracts import codec, hashing
from contracts.errors import ErrorCode, QuillError
from contracts.events import CompactionManifest, WorkspaceEvent
from contracts.paths import normalize
from core.secrets import Secrets
from core.tree import Tree, plant
from infra.blobs import WorkspaceBlobs
from quill_cli.tools import replay as rpl

_KEEP = {"type", "prev_hash", "tree_hash", "manifest", "version", "at"}
_RAW_CHANGE = {"type", "path", "moved_from", "text", "data", "sha256", "size", "created"}
"""Event fields kept as they are (hashes are recomputed), and a change's fields handled
by ``path``/``content`` rather than redacted as text."""


class Redactor:
    """Redacts values, paths and contents of one workspace's log, remembering what changed."""

    def __init__(self, secrets: Secrets, blobs: WorkspaceBlobs) -> None:
        self.secrets, self.blobs = secrets, blobs
        self.found: set[str] = set()
        self.shas: dict[str, str] = {}
        """Old sha256 → new, for contents that changed."""
        self.originals: dict[str, bytes] = {}
        """Old sha256 → old content, for contents that changed (a blob deleted by the scrub
        is put back from here if a write of another workspace names it meanwhile)."""
        self.contents: dict[str, tuple[str, int, bytes]] = {}
        """Old sha256 → (new sha256, new size, new content), for every content seen."""
        self.paths: dict[str, str] = {}
        """Old path → new, for every path seen."""
        self._owner: dict[str, str] = {}

    def text(self, value: str) -> str:
        new, ids = self.secrets.redact(value)
        self.found.update(ids)
        return self.shas.get(new, new)

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {self.text(k): self.value(v) for k, v in value.items()}
        return value

    def path(self, old: str, version: int) -> str:
        known = self.paths.get(old)
        if known is not None:
            return known
        new = self.text(old)
        if new != old:
            try:
                valid = normalize(new) == new
            except QuillError:
                valid = False
            if not valid:
                raise QuillError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"Version {version}: a path would not be valid once redacted ({new!r})",
                )
        owner = self._owner.setdefault(new, old)
        if owner != old:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"Version {version}: two paths would both become {new!r} once redacted",
            )
        self.paths[old] = new
        return new

    async def content(self, change: dict[str, Any], version: int) -> None:
        """Redact a ``put``'s content in place (inline, in WS_BLOBS, or named by sha256)."""
        old_sha = str(change["sha256"])
        if "text" in change:
            raw = str(change["text"]).encode("utf-8", "surrogatepass")
        elif "data" in change:
            raw = base64.b64decode(change["data"])
        elif old_sha in self.contents:
            new_sha, size, _ = self.contents[old_sha]
            change["sha256"], change["size"] = new_sha, size
            return
        elif change.get("blob"):
            raw = await self.blobs.get(old_sha)
        elif int(change.get("size", 0)) == 0:
            raw = b""
        else:
            raw = await self.blobs.get(old_sha)
        if hashing.content_sha256(raw) != old_sha:
            raise rpl.corrupt(
                f"The content of a put does not match its sha256 ({old_sha})", version
            )
        new, ids = self.secrets.redact_bytes(raw)
        self.found.update(ids)
        new_sha = hashing.content_sha256(new)
        self.contents[old_sha] = (new_sha, len(new), new)
        if new_sha == old_sha:
            return
        self.shas[old_sha] = new_sha
        self.originals[old_sha] = raw
        if "text" in change:
            change["text"] = new.decode("utf-8", "surrogatepass")
        elif "data" in change:
            change["data"] = base64.b64encode(new).decode()
        change["sha256"], change["size"] = new_sha, len(new)

    async def event(self, event: WorkspaceEvent) -> dict[str, Any]:
        """``event`` as JSON builtins, redacted (its hashes still the old ones)."""
        body: dict[str, Any] = msgspec.json.decode(codec.encode(event))
        out: dict[str, Any] = {}
        for key, value in body.items():
            if key == "changes":
                changes = []
                for change in value:
                    change = dict(change)
                    if change.get("type") == "put":
                        await self.content(change, event.version)
                    for name in ("path", "moved_from"):
                        if name in change:
                            change[name] = self.path(str(change[name]), event.version)
                    changes.append({k: v if k in _RAW_CHANGE else self.value(v)
                                    for k, v in change.items()})  # fmt: skip
                out[key] = changes
            elif key in _KEEP:
                out[key] = value
            else:
                out[key] = self.value(value)
        if (out["tenant"], out["workspace"]) != (event.tenant, event.workspace):
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                "A secret is part of the workspace's name: scrub cannot rename a workspace "
                "(export it, import it under another name, scrub that)",
            )
        return out

    async def manifest(self, kept: CompactionManifest) -> CompactionManifest:
        """A compaction's manifest, redacted (module docstring)."""
        revisions = []
        for r in kept.revisions:
            row, since = list(r), int(r[1])
            for column in (0, 3, 12):  # path, parent, moved_from
                if row[column]:
                    row[column] = self.path(str(row[column]), since)
            if row[4] == "f":
                change: dict[str, Any] = {"sha256": row[5], "size": row[6], "blob": True}
                await self.content(change, since)
                row[5], row[6] = change["sha256"], change["size"]
            revisions.append(tuple(row))
        floor, events = max(kept.floor, 1), []
        for e in kept.events:
            row = list(e)
            row[5:9] = [self.value(v) for v in row[5:9]]  # actor, session, run, request_id
            row[12], row[14] = self._json(row[12]), self._json(row[14])  # changes, result
            if int(row[0]) >= floor:
                row[11] = hashing.tree_hex(tree_at(revisions, int(row[0])).hash)
            events.append(tuple(row))
        controls = [(v, kind, str(self._json(body))) for v, kind, body in kept.controls]
        limits = msgspec.convert(self.value(msgspec.to_builtins(kept.limits)), type(kept.limits))
        uncommitted = [(self.value(u[0]), self.value(u[1]), self.value(u[2]), u[3])
                       for u in kept.uncommitted]  # fmt: skip
        return msgspec.structs.replace(
            kept, revisions=revisions, events=events, controls=controls, limits=limits,
            uncommitted=uncommitted,
        )  # fmt: skip

    def _json(self, text: Any) -> Any:
        if not isinstance(text, str):
            return text
        return msgspec.json.encode(self.value(msgspec.json.decode(text))).decode()


def tree_at(revisions: list[tuple[Any, ...]], at: int) -> Tree:
    """The tree as of version ``at`` from a manifest's revision rows (``core.tree.plant``)."""
    tree = Tree()
    plant(tree, revisions, at)
    return tree
