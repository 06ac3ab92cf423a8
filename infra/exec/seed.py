"""A checkout's first build from a reader's tree, at the cost of the files at that version.

Replaying a workspace's log from its first event writes every revision it ever made (~0.7 ms
an event: a minute for 100,000 events ending with 500 files). A reader replica already holds
the tree as of each version: ``qry.tree`` gives it a page at a time by path, with the contents
it holds; the larger ones are in WS_BLOBS (the executor fetches them, 16 at once, at most
``GROUP_BYTES`` in memory). The checkout then follows the log from the position of that
version's event (``TreeHead.seq``), as any checkout does.

The log stays the truth. Every content is checked against its sha256; the entries' tree hash
(``contracts.hashing``) must be the one the head names, and the head must be the log's own:
the event at ``seq`` is read from the log and must be that version with that tree hash. Any
difference (or a reader that does not answer) and the checkout is replayed from the log
instead, which is logged (``Checkout.sync``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime

from contracts import hashing
from contracts import replies as rp
from contracts.events import MakeDir, PutFile
from infra.blobs import WorkspaceBlobs

Tree = Callable[[str | None, int | None], Awaitable[rp.TreePage]]
"""A page of a reader's ``qry.tree``: ``tree(after, version)``."""

Changed = Callable[[str | None, int, int], Awaitable[rp.TreePage]]
"""A page of a reader's ``qry.tree`` of what changed since a version: ``changed(after,
version, changed_from)``."""

Fetch = Callable[[str, int], Awaitable[bytes]]
"""A file's content as of a version, from a reader: ``fetch(path, version)``."""

GROUP_BYTES = 32 * 1024 * 1024
"""Contents fetched from WS_BLOBS held in memory at once (then written)."""
AT_ONCE = 16
"""Contents fetched from WS_BLOBS at the same time."""
CREATED = datetime(1970, 1, 1, tzinfo=UTC)
"""What a build writes as a file's creation time (a checkout keeps none)."""


class Mismatch(Exception):
    """What a reader gave is not what the log says."""


def digest(item: rp.TreeItem) -> int:
    """The entry's part of the tree hash."""
    if item.kind == "directory":
        return hashing.dir_digest(item.path)
    return hashing.file_digest(item.path, item.sha256 or "", item.executable)


def changes(items: list[rp.TreeItem]) -> Iterator[MakeDir | PutFile]:
    """The page's entries as the changes that make them (parents come first: by path)."""
    for item in items:
        if item.kind == "directory":
            yield MakeDir(path=item.path)
        else:
            yield PutFile(
                path=item.path,
                sha256=item.sha256 or "",
                size=item.size,
                file_version=item.file_version or 0,
                created=CREATED,
                executable=item.executable,
            )


def groups(items: list[rp.TreeItem], contents: dict[str, bytes]) -> Iterator[list[rp.TreeItem]]:
    """``items`` cut where the contents to fetch for them reach ``GROUP_BYTES``."""
    group: list[rp.TreeItem] = []
    size = 0
    for item in items:
        fetched = item.kind == "file" and item.size and item.sha256 not in contents
        if fetched and group and size + item.size > GROUP_BYTES:
            yield group
            group, size = [], 0
        group.append(item)
        size += item.size if fetched else 0
    if group:
        yield group


async def contents_of(
    group: list[rp.TreeItem],
    given: dict[str, bytes],
    blobs: WorkspaceBlobs,
    fetch: Fetch,
    version: int,
) -> dict[str, bytes]:
    """The contents ``group``'s files need: those the page carried, the rest from WS_BLOBS
    (or, one not there, from the reader); each checked against its sha256.

    Raises:
        Mismatch: a content is not the one named.
    """
    wanted = {i.sha256: i.path for i in group if i.kind == "file" and i.size and i.sha256}
    out = {sha: given[sha] for sha in wanted if sha in given}
    gate = asyncio.Semaphore(AT_ONCE)

    async def get(sha: str, path: str) -> tuple[str, bytes]:
        async with gate:
            try:
                return sha, await blobs.get(sha)
            except Exception:  # not in WS_BLOBS: the reader has it
                return sha, await fetch(path, version)

    more = [get(sha, path) for sha, path in wanted.items() if sha not in out]
    out.update(await asyncio.gather(*more))
    for sha, data in out.items():
        if hashlib.sha256(data).hexdigest() != sha:
            raise Mismatch(f"the content of {wanted[sha]} is not {sha}")
    return out
