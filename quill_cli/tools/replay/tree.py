"""Writing a replayed tree to disk (``quill replay --out``).

Files are written once, at the end, with modes 0644/0755 and each entry's mtime taken from
the log, so that two replays of a log are byte-identical trees.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TypeVar

from contracts import hashing
from contracts.errors import ErrorCode, QuillError
from contracts.paths import in_log
from core.tree import FileNode
from infra.blobs import Blobs
from quill_cli.tools.replay.fold import _EPOCH, QUIET, Contents, Fold, Progress, corrupt
from quill_cli.tools.replay.read import nats_errors

T = TypeVar("T")


def _ns(when: datetime) -> int:
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


WRITERS = 8
"""Contents fetched and written at once by ``write_tree``."""


async def write_tree(
    fold: Fold,
    blobs: Blobs,
    out: Path,
    contents: Contents | None,
    progress: Progress = QUIET,
) -> None:
    """Write ``fold``'s tree to the directory ``out`` (absent or empty): files 0644 (0755
    when executable), directories 0755, each file's mtime the time of the event that last
    wrote it, each directory's the time it was made, ``out``'s the time of the version. Each
    content is checked against its sha256. ``out`` appears whole or not at all. At most
    ``WRITERS`` contents are in memory at once.

    Raises:
        QuillError: ``ALREADY_EXISTS`` if ``out`` holds something; ``UNAVAILABLE`` if a content
            is missing from WS_BLOBS or NATS fails; ``INTERNAL`` for a content that does not
            match or an unsafe path.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise QuillError(ErrorCode.ALREADY_EXISTS, f"{out} exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tree = fold.tree
    own = blobs.of(fold.tenant, fold.workspace, fold.lineage)
    try:
        for path in sorted(tree.dirs):
            (tmp / _safe(path, fold.version)).mkdir(0o755)

        async def put(path: str, node: FileNode) -> None:
            data = b"" if node.size == 0 else contents.get(node.sha256) if contents else None
            if data is None:
                data = await own.get(node.sha256)
            if hashing.content_sha256(data) != node.sha256:
                raise corrupt(f"The content of {path} does not match its sha256", node.version)
            target = tmp / _safe(path, fold.version)
            target.write_bytes(data)
            os.chmod(target, 0o755 if node.executable else 0o644)
            os.utime(target, ns=(_ns(node.modified), _ns(node.modified)))

        progress.start(f"writing {out}", len(tree.files))
        with nats_errors(f"Reading the contents of {fold.tenant}/{fold.workspace}"):
            await each(tree.files.items(), lambda item: put(*item), WRITERS, progress)
        for path in sorted(tree.dirs, reverse=True):  # children before their parents
            os.chmod(tmp / path, 0o755)
            when = _ns(tree.dirs[path].created)
            os.utime(tmp / path, ns=(when, when))
        os.chmod(tmp, 0o755)
        os.utime(tmp, ns=(_ns(fold.at), _ns(fold.at)))
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


async def each(
    items: Iterable[T],
    work: Callable[[T], Awaitable[None]],
    limit: int,
    progress: Progress = QUIET,
) -> None:
    """``work(item)`` for each of ``items``, at most ``limit`` at a time; no coroutine is made
    before a worker takes its item (a hundred thousand are not held at once), and the first
    failure stops the others and is raised (no work is left behind, never awaited)."""
    source = iter(items)
    done = 0

    async def worker() -> None:
        nonlocal done
        for item in source:
            await work(item)
            done += 1
            if done % 64 == 0:
                progress.update(done)

    workers = [asyncio.create_task(worker()) for _ in range(limit)]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    progress.update(done)


def _safe(path: str, version: int) -> str:
    if not in_log(path):  # a name from before the name rule is still written
        raise corrupt(f"Unsafe path in the log: {path!r}", version)
    return path
