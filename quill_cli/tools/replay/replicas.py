"""Reader replicas checked against a replay (``quill verify``; ``quill scrub`` once it rewrote
a log): each live replica is asked about the workspace as of the replayed version and its
answer compared with the replay.
"""

from __future__ import annotations

from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client as NATS

from contracts import codec, hashing
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import Subjects
from infra import bus
from quill_cli.tools.replay.fold import QUIET, Fold, Progress
from quill_cli.tools.replay.tree import each


class ReplicaCheck(msgspec.Struct, kw_only=True):
    """One reader replica's answer as of the replayed version, against the replay."""

    instance: str
    ok: bool
    tree_hash: str | None = None
    """With ``deep``: computed from the replica's listing and stats; else as it records it."""
    last_hash: str | None = None
    files: int | None = None
    directories: int | None = None
    bytes: int | None = None
    problems: list[str] = msgspec.field(default_factory=list)


async def live_readers(nc: NATS, subjects: Subjects, window_s: float = 0.5) -> list[str]:
    """Instances of the reader replicas that answer ``<root>.sys.ping.reader`` within
    ``window_s`` (every replica answers the ping, once it has caught up with the log)."""
    answers = await bus.ping_all(nc, subjects, "reader", window_s)
    return sorted({a["instance"] for a in answers if isinstance(a.get("instance"), str)})


class _Replica:
    """Queries addressed to one replica (``ws.replica.<instance>.<t>.<w>.<op>``)."""

    def __init__(self, nc: NATS, subjects: Subjects, fold: Fold, instance: str, timeout: float):
        self.nc, self.subjects, self.fold = nc, subjects, fold
        self.instance, self.timeout = instance, timeout

    async def ask(self, op: str, body: rq.Query, result: type[Any]) -> Any:
        subject = self.subjects.replica(self.instance, self.fold.tenant, self.fold.workspace, op)
        try:
            msg = await self.nc.request(subject, codec.encode(body), timeout=self.timeout)
        except nats.errors.TimeoutError:
            raise QuillError(ErrorCode.TIMEOUT, f"no answer in {self.timeout:g}s") from None
        except nats.errors.NoRespondersError:
            raise QuillError(ErrorCode.UNAVAILABLE, "it is gone") from None
        return codec.decode_reply(msg.data, result)[1]

    async def tree_hash(self, progress: Progress = QUIET) -> str:
        """The tree hash of what the replica answers as of the version: every entry listed,
        every file's sha256 and mode from ``stat``."""
        v, after, paths = self.fold.version, None, []
        total = 0
        progress.start(f"listing {self.fold.tenant}/{self.fold.workspace} on {self.instance}", None)
        while True:
            body = rq.ListDirectory(recursive=True, after=after, version=v)
            page: rp.Listing = await self.ask("list", body, rp.Listing)
            for entry in page.entries:
                if entry.kind == "directory":
                    total = hashing.tree_add(total, hashing.dir_digest(entry.path))
                else:
                    paths.append(entry.path)
            progress.update(len(paths))
            if page.next is None:
                break
            after = page.next

        async def stat(path: str) -> None:
            nonlocal total
            info: rp.FileInfo = await self.ask(
                "stat", rq.StatPath(path=path, version=v), rp.FileInfo
            )
            digest = hashing.file_digest(path, info.sha256 or "", info.permissions == "755")
            total = hashing.tree_add(total, digest)

        progress.start(f"asking {self.instance} about each file", len(paths))
        await each(paths, stat, 32, progress)
        return hashing.tree_hex(total)


async def check_replica(
    nc: NATS,
    subjects: Subjects,
    fold: Fold,
    instance: str,
    *,
    deep: bool,
    timeout: float = 10.0,
    progress: Progress = QUIET,
) -> ReplicaCheck:
    """Ask replica ``instance`` about the workspace as of ``fold.version`` (waiting for it to
    get there) and compare its answer with the replay."""
    replica, v = _Replica(nc, subjects, fold, instance, timeout), fold.version
    check = ReplicaCheck(instance=instance, ok=False)
    try:
        body = rq.WorkspaceInfoQuery(version=v, min_version=v)
        info: rp.WorkspaceInfo = await replica.ask("info", body, rp.WorkspaceInfo)
        check.tree_hash = await replica.tree_hash(progress) if deep else info.tree_hash
    except QuillError as exc:
        check.problems.append(f"{exc.code}: {exc.message}")
        return check
    check.last_hash, check.files = info.last_hash, info.files
    check.directories, check.bytes = info.directories, info.total_bytes
    tree = fold.tree
    for what, theirs, ours in [
        ("version", info.version, v),
        ("tree hash", check.tree_hash, hashing.tree_hex(tree.hash)),
        ("last event hash", info.last_hash, fold.last_hash),
        ("files", info.files, len(tree.files)),
        ("directories", info.directories, len(tree.dirs)),
        ("bytes", info.total_bytes, tree.total_bytes),
    ]:
        if theirs != ours:
            check.problems.append(f"{what}: replica {theirs}, log {ours}")
    check.ok = not check.problems
    return check
