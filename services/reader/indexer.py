"""Keeps the reader's trigram index up with the contents it has applied or fetched.

Indexing runs at a few MB/s (SQLite FTS5 trigrams), so it is not part of applying events:
applies stay fast and read-your-writes stays prompt during a bulk import. Until a content is
indexed, grep treats it as a candidate and reads it, so answers are the same either way.
"""

from __future__ import annotations

import asyncio
import logging

from infra.store import Store

log = logging.getLogger("quill.reader.indexer")

CHUNK_BYTES = 512 * 1024
"""Content indexed per transaction (short, so applies are not held up)."""


class Indexer:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.busy = True
        """Contents may be waiting to be indexed (False once the index is complete)."""

    def start(self) -> None:
        self._wakeup.set()
        self._task = asyncio.create_task(self._run(), name="indexer")

    def poke(self) -> None:
        """New contents may be waiting."""
        self.busy = True
        self._wakeup.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                while await self._store.index_pending(CHUNK_BYTES):
                    await asyncio.sleep(0)  # let queries and applies in between
                self.busy = self._wakeup.is_set()
            except Exception:
                log.exception("indexing failed; will retry on the next change")
