"""Keeps the reader's trigram index up with the contents it has applied or fetched.

Indexing runs at a few MB/s (SQLite FTS5 trigrams), so it is not part of applying events:
applies stay fast and read-your-writes stays prompt during a bulk import. Until a content is
indexed, grep treats it as a candidate and reads it, so answers are the same either way.

Contents larger than an event carries are only named by it (they are in WS_BLOBS): the indexer
fetches each from its workspace's namespace and indexes it like the others, without keeping it
(a reader's disk is often the log's: the text is kept only compressed, for a purge to take it
out of the contentless index; a read fetches the content as before). Until then it is a
candidate of every grep of every workspace this reader serves, so a grep's cost would grow
with what all workspaces ever stored remotely (issue 29: 20,000 such contents made a rare
word's grep 60 times slower).
"""

from __future__ import annotations

import asyncio
import logging

from contracts.errors import ErrorCode, QuillError
from core.content import as_text
from infra.blobs import Blobs
from infra.loops import Loop
from infra.store import Store

log = logging.getLogger("quill.reader.indexer")

CHUNK_BYTES = 512 * 1024
"""Content indexed per transaction (short, so applies are not held up)."""
FETCHED_AT_ONCE = 64
"""Most contents in WS_BLOBS fetched and indexed in one transaction (``CHUNK_BYTES`` first)."""


def _failed(exc: Exception) -> None:
    log.exception("indexing failed; will retry on the next change")


class Indexer:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._blobs: Blobs | None = None
        self._loop = Loop("indexer", self._turn, woken=True, failed=_failed)
        self.busy = True
        """Contents may be waiting to be indexed (False once the index is complete)."""

    def start(self, blobs: Blobs | None = None) -> None:
        """Index what is waiting, and from now on what ``poke`` says; fetch the contents only
        in WS_BLOBS through ``blobs`` (None: leave them to grep to read)."""
        self._blobs = blobs
        self._loop.start()

    def poke(self) -> None:
        """New contents may be waiting."""
        self.busy = True
        self._loop.wake()

    async def stop(self) -> None:
        await self._loop.stop()

    async def _turn(self) -> None:
        await self.catch_up()
        self.busy = self._loop.woken

    async def catch_up(self) -> None:
        """Index every content waiting, fetching those only in WS_BLOBS.

        Raises:
            Exception: what indexing or a fetch raised (other than a content gone missing).
        """
        while True:
            while await self._store.index_pending(CHUNK_BYTES):
                await asyncio.sleep(0)  # let queries and applies in between
            if not await self._fetch_remote():
                return

    async def _fetch_remote(self) -> int:
        """Fetch and index (one transaction) a few contents that are only in WS_BLOBS, about
        ``CHUNK_BYTES`` of them; return how many were taken."""
        if self._blobs is None:
            return 0
        taken = await self._store.remote_unindexed(FETCHED_AT_ONCE)
        texts: list[tuple[int, str]] = []
        used = 0
        for rowid, sha256, tenant, workspace in taken:
            try:
                data = await self._blobs.of(tenant, workspace).get(sha256, keep=False)
            except QuillError as exc:
                if exc.code is not ErrorCode.UNAVAILABLE:
                    raise
                log.warning("content %s… of %s/%s: %s", sha256[:12], tenant, workspace, exc)
                await self._store.content_unreachable(sha256)
                continue
            text = as_text(data)
            if text is None:
                await self._store.indexed_without_content(sha256)
                continue
            texts.append((rowid, text))
            used += len(data)
            if used >= CHUNK_BYTES:
                break
        await self._store.index_remote(texts)
        return len(taken)
